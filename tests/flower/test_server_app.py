"""A hub process that outlives its run can be asked where it waits: ``kill -USR1 <pid>``
has the ServerApp append every thread's stack to its run's ``stacks.txt`` (Flower sends
its output to /dev/null), and it goes on running. One still alive a grace period after its
``main`` returned (Flower's exit deadlocked) writes its stacks there and ends."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from tests.flower.conftest import FLOWER_BIN, REPO
from tests.limits import limit

WAITS = """
import sys, time
from pathlib import Path
from flowerapp.server_app import stacks_on_sigusr1
stacks_on_sigusr1(Path(sys.argv[1]))
print("ready", flush=True)
time.sleep(600)
"""

HANGS = """
import sys, threading
from pathlib import Path
from flowerapp.server_app import end_if_exit_hangs
end_if_exit_hangs(Path(sys.argv[1]), grace=float(sys.argv[2]))
held = threading.Lock()
held.acquire()
if sys.argv[3] == "hang":
    held.acquire()  # the thread waits for a lock it holds, as Flower's exit can
"""


def test_sigusr1_has_the_serverapp_write_its_stacks_to_its_file_and_go_on(
    tmp_path: Path,
) -> None:
    stacks = tmp_path / "stacks.txt"
    process = subprocess.Popen(
        [str(FLOWER_BIN / "python"), "-c", WAITS, str(stacks)], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + limit(60)
        while 'File "<string>", line ' not in stacks.read_text():  # the script's own frame
            assert process.poll() is None, "the signal ended the process"
            assert time.monotonic() < deadline, stacks.read_text()
            time.sleep(0.1)
        assert stacks.read_text().startswith("Current thread 0x"), stacks.read_text()
        assert process.poll() is None  # the dump did not stop it
    finally:
        process.kill()
        process.wait()


def run_exit_guarded(stacks: Path, grace: str, then: str) -> subprocess.CompletedProcess[str]:
    """:data:`HANGS` run to its end: the guard armed with ``grace``, then a hang or an exit."""
    return subprocess.run(
        [str(FLOWER_BIN / "python"), "-c", HANGS, str(stacks), grace, then], cwd=REPO,
        capture_output=True, text=True, timeout=limit(120),
    )  # fmt: skip


def test_a_process_stuck_on_its_way_out_writes_its_stacks_and_ends(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    stuck = run_exit_guarded(stacks, "1", "hang")
    assert stuck.returncode == 1, stuck.stderr
    assert 'File "<string>", line 9 in <module>' in stacks.read_text(), stacks.read_text()


def test_a_process_that_exits_in_time_exits_as_it_would(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    done = run_exit_guarded(stacks, "600", "exit")
    assert (done.returncode, stacks.read_text()) == (0, ""), done.stderr
