"""The tests' time limits, scaled by one setting.

Tests wait for what they check (a line, a state, a file, a process's exit); a time limit
is only the guard that ends a hang. ``FEDSIEVE_TEST_TIME_SCALE`` (default 1) multiplies
every such limit, so a slower machine raises them all in one place. A test still running
at :data:`TEST_LIMIT_S` (scaled) is ended by pytest-timeout with its stack shown, and its fixtures torn down.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest

SCALE_VARIABLE = "FEDSIEVE_TEST_TIME_SCALE"
TEST_LIMIT_S = 900.0  # one test's guard; the longest takes about a third of it on CI


def _scale() -> float:
    raw = os.environ.get(SCALE_VARIABLE, "1")
    try:
        scale = float(raw)
    except ValueError:
        scale = float("nan")
    if not scale > 0:
        raise ValueError(f"{SCALE_VARIABLE}={raw!r}: must be a number above 0 (default 1)")
    return scale


SCALE = _scale()


def limit(seconds: float) -> float:
    """``seconds`` scaled by :data:`SCALE`: a guard against a hang, never a wait."""
    return seconds * SCALE


def poll(what: str, check: Callable[[], Any], timeout: float, interval: float = 1.0) -> Any:
    """What ``check()`` returns once it is truthy, looked at every ``interval`` seconds;
    the test fails naming ``what`` if ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
