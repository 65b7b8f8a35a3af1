"""Stopping the runs a cancelled or failed flow started: a comparison's cells check
between rounds whether the block that started them was left by an exception."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["RunStopped", "stop_if_requested", "stoppable_runs"]


class RunStopped(BaseException):
    """A run stopped because the flow that started it was cancelled or failed. A
    BaseException, like KeyboardInterrupt: nothing catches it as an error, and the run's
    MLflow run is closed as KILLED."""


# The stop signal of the runs started in a `stoppable_runs` block; Prefect's thread-pool
# task runner copies the context into its threads, so it reaches each run's train loop.
_stop_requested: ContextVar[threading.Event | None] = ContextVar(
    "fedsieve_stop_requested", default=None
)


@contextlib.contextmanager
def stoppable_runs() -> Iterator[None]:
    """Runs started in the block (on this thread, or on a task runner's threads) stop at
    their next round when the block is left by an exception: a cancelled comparison
    (SIGTERM, Ctrl-C) or a failed cell. Without it the task runner waits at its exit for
    every running cell to train to the end. Enter it inside the runner's block, so it is
    left first."""
    requested = threading.Event()
    token = _stop_requested.set(requested)
    try:
        yield
    except BaseException:
        requested.set()
        raise
    finally:
        _stop_requested.reset(token)


def stop_if_requested() -> bool:
    """Raise :class:`RunStopped` if the block that started this run asked it to stop;
    False otherwise (the round loop's ``should_stop``: a stop is never a quiet one)."""
    requested = _stop_requested.get()
    if requested is not None and requested.is_set():
        raise RunStopped("stopped: the flow that started this run was cancelled or failed")
    return False
