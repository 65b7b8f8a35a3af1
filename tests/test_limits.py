"""The suite's own guards: a hung test is ended with its stack shown, SIGTERM tears the
running test's fixtures down, and the one time setting is checked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.limits import SCALE_VARIABLE, limit

REPO = Path(__file__).resolve().parents[1]

HANGS = textwrap.dedent(
    """
    import time
    from pathlib import Path

    import pytest

    @pytest.fixture
    def server(tmp_path_factory):
        yield
        Path({stopped!r}).write_text("stopped")  # what a real fixture's teardown does

    def test_hangs(server):
        Path({started!r}).write_text("started")
        time.sleep(600)
    """
)


def start_pytest(tmp_path: Path, scale: str) -> tuple[subprocess.Popen[str], Path, Path]:
    started, stopped = tmp_path / "started", tmp_path / "stopped"
    probe = tmp_path / "test_probe.py"
    probe.write_text(HANGS.format(started=str(started), stopped=str(stopped)))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p",
               "no:cacheprovider", "--rootdir", str(tmp_path), str(probe)]  # fmt: skip
    env = os.environ | {SCALE_VARIABLE: scale}
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return process, started, stopped


def test_a_hung_test_is_ended_by_its_guard_with_its_stack_shown(tmp_path: Path) -> None:
    process, _, stopped = start_pytest(tmp_path, "0.002")  # a guard of 1.8 s
    out, _ = process.communicate(timeout=limit(300))
    assert process.returncode == 1, out
    assert "Failed: Timeout (>1.8s) from pytest-timeout." in out, out
    assert "time.sleep(600)" in out, out  # the hung test's stack
    assert stopped.exists(), out  # and its fixtures were torn down


def test_sigterm_tears_the_running_tests_fixtures_down(tmp_path: Path) -> None:
    process, started, stopped = start_pytest(tmp_path, "1")
    deadline = time.monotonic() + limit(300)
    while not started.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=limit(120))
    assert stopped.read_text() == "stopped", out
    assert "KeyboardInterrupt" in out, out


def test_a_time_scale_that_is_not_a_positive_number_is_refused_in_one_line() -> None:
    for bad in ("fast", "0", "-2", "nan"):
        done = subprocess.run(
            [sys.executable, "-c", "import tests.limits"], cwd=REPO, capture_output=True,
            text=True, env=os.environ | {SCALE_VARIABLE: bad}, timeout=limit(120),
        )  # fmt: skip
        assert done.returncode == 1
        assert (
            f"ValueError: {SCALE_VARIABLE}={bad!r}: must be a number above 0 (default 1)"
            == done.stderr.strip().splitlines()[-1]
        )
