"""Run a command that ends when the process that started it dies, even by SIGKILL.

    python -m fedsieve.die_with_parent PARENT_PID COMMAND [ARGS...]

On Linux the kernel sends the command SIGTERM when the thread that started this process
ends (``prctl(PR_SET_PDEATHSIG)``, which ``exec`` keeps). Exit hooks cannot do this for a
parent that is SIGKILLed (the OOM killer, ``kill -9``, a container runtime's timeout). Used
for Prefect's temporary server, which otherwise outlives such a run. Elsewhere, or should
``prctl`` fail, the command simply runs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["guarded_command"]

_PR_SET_PDEATHSIG = 1


def guarded_command(command: list[str]) -> list[str]:
    """``command`` run through this guard, on behalf of the calling process."""
    return [sys.executable, "-m", __name__, str(os.getpid()), *command]


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        raise SystemExit("usage: python -m fedsieve.die_with_parent PARENT_PID COMMAND [ARGS...]")
    parent, command = int(argv[0]), argv[1:]
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the guard was in place
        raise SystemExit(1)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
