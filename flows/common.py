"""What every stage's flow shares: run metadata and the stage entry point."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path

from fedsieve.config import Params, params_hash

__all__ = [
    "RunStopped",
    "git_commit",
    "run_tags",
    "stage_main",
    "stop_if_requested",
    "stoppable_runs",
    "subflows_without_heartbeats",
]


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


@contextlib.contextmanager
def subflows_without_heartbeats() -> Iterator[None]:
    """Subflows started in the block send no flow-run heartbeats; the flow that starts
    them keeps its own, which shows the process alive to the server.

    Prefect 3.8 joins a flow's heartbeat thread when the flow ends, and that thread sleeps
    in 1 s steps: each subflow's end waited 0.5-1 s for it. Against a running server a
    ``fedsieve run`` spent 3.0-3.9 s between its stages, and 0.8-1.1 s with its subflows
    in this block (4 alternating runs of each on 2 cores)."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def stop_if_requested() -> None:
    """Raise :class:`RunStopped` if the block that started this run asked it to stop."""
    requested = _stop_requested.get()
    if requested is not None and requested.is_set():
        raise RunStopped("stopped: the flow that started this run was cancelled or failed")


def git_commit(workdir: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=workdir, capture_output=True, text=True, timeout=10
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def run_tags(params: Params, workdir: Path) -> dict[str, str]:
    return {
        "dataset": params.data.dataset,
        "model": params.model.name,
        "aggregator": params.aggregate.name,
        "filters": ",".join(f.name for f in params.filters) or "none",
        "partition": params.partition.scheme,
        "attack": params.attack.name,
        "malicious_fraction": "0"
        if params.attack.name == "none"
        else str(
            params.attack.fraction
            if params.attack.ids is None
            else len(params.attack.ids) / params.partition.num_clients
        ),
        "seed": str(params.seed),
        "params_hash": params_hash(params),
        "git_commit": git_commit(workdir),
    }


def stage_main(stage: str) -> Callable[[], None]:
    """``python -m flows.<stage>`` == ``fedsieve <stage>``."""

    def main() -> None:
        from fedsieve.cli import console

        console([stage, *sys.argv[1:]])

    return main
