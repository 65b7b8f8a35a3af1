"""What the container scripts share (scripts/federation_smoke.py,
scripts/container_faults.py): a step's command run to its end, and the one-line error a
step that did not do what it should ends with."""

from __future__ import annotations

import shlex
import subprocess
from typing import Any

__all__ = ["StepError", "run"]


class StepError(RuntimeError):
    """A step that did not do what it should: one line saying which and why."""


def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``command`` to its end; :class:`StepError` with its output's tail if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        tail = (done.stdout[-2000:] + done.stderr[-3000:]).strip()
        raise StepError(f"{shlex.join(command[:6])} ... exited {done.returncode}:\n{tail}")
    return done
