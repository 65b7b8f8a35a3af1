"""A guarded command ends when the process that started it is SIGKILLed (Linux)."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_guarded_command_dies_with_its_killed_parent():
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(
            """
            import subprocess, sys, time
            from fedsieve.die_with_parent import guarded_command

            child = subprocess.Popen(guarded_command(["sleep", "120"]))
            print(child.pid, flush=True)
            time.sleep(120)
            """
        )],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    child = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}/cmdline").read_text().split("\0")[0] != "sleep":  # exec'd
            assert time.monotonic() < deadline
            time.sleep(0.05)
        parent.kill()
        parent.wait()
        while alive(child) and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        assert not alive(child)
    finally:
        parent.kill()
        if alive(child):
            os.kill(child, 9)


def test_the_guard_says_how_it_is_used():
    done = subprocess.run(
        [sys.executable, "-m", "fedsieve.die_with_parent", "sleep"], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "usage: python -m fedsieve.die_with_parent PARENT_PID COMMAND [ARGS...]"
    )
