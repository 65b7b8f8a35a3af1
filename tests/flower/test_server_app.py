"""A hub process that outlives its run can be asked where it waits: ``kill -USR1 <pid>``
has the ServerApp write every thread's stack to its stderr (the SuperLink's log), and it
goes on running."""

from __future__ import annotations

import signal
import subprocess

from tests.flower.conftest import FLOWER_BIN, REPO

WAITS = "import time, flowerapp.server_app; print('ready', flush=True); time.sleep(600)"


def test_sigusr1_has_the_serverapp_write_its_stacks_and_go_on() -> None:
    process = subprocess.Popen(
        [str(FLOWER_BIN / "python"), "-c", WAITS], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.readline() == "ready\n", process.stderr.read()
        process.send_signal(signal.SIGUSR1)
        dump = [process.stderr.readline()]
        while 'File "<string>", line 1 in <module>' not in dump[-1]:  # where it waits
            assert dump[-1], "".join(dump)  # stderr closed: the process ended
            dump.append(process.stderr.readline())
        assert dump[0].startswith("Current thread 0x"), "".join(dump)
        assert process.poll() is None  # the dump did not stop it
    finally:
        process.kill()
        process.wait()
