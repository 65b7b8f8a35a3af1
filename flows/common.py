"""What the flows share: subflows without heartbeats."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["subflows_without_heartbeats"]


@contextlib.contextmanager
def subflows_without_heartbeats() -> Iterator[None]:
    """Subflows started in the block send no flow-run heartbeats (Prefect's public
    ``flows.heartbeat_frequency`` setting); the flow that starts them keeps its own, which
    shows the process alive to the server. Each flow's end waits for its heartbeat thread,
    which sleeps in 1 s steps: a stage's subflows need none of their own."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
