"""Start-up imports with Python's cyclic garbage collector paused.

Importing torch, Prefect and MLflow creates hundreds of thousands of objects that live as
long as the process. The collector, triggered by allocation counts, scans them again and
again while they load, and finds almost nothing to free. Paused while a process imports,
the same imports took about 20 % less CPU on the 2-core machine (Prefect's server app:
5.0-5.2 s -> 4.0-4.2 s; MLflow with torch.export: 4.9-6.8 s -> 4.1-4.4 s). The pause
ends before any training or serving: a process that runs for long must collect.

A process that owns itself (the ``fedsieve`` command, Prefect's temporary server, the
tracking process) also *freezes* what it imported when the pause ends (``gc.freeze``):
the objects then alive move to a generation the collector never scans again. Without it
the first collections after the pause scan everything the imports made, and every full
collection after them scans it again: on 2 cores, 0.4-0.5 s of a ``fedsieve run``'s
command, 0.4 s of its server and 1.2 s of its tracking process went to collections of
10 ms or more. The price is that a reference cycle already unreachable at that moment is
never freed; a library caller's or a test's process (``fedsieve.cli.main`` called in
it) is not frozen, only paused.

Used by the ``fedsieve`` command (until its flow starts), Prefect's temporary server
(while its app is built) and the tracking process (while it warms up). A child forked
while the collector is paused starts with it running (and frozen, if the pause was to
end frozen).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

__all__ = ["collector_paused", "pause_collector", "resume_collector"]

_paused = False  # paused by pause_collector(), not yet resumed
_freeze = False  # ... and to freeze what is alive when it resumes


def pause_collector(*, freeze: bool = False) -> bool:
    """Pause the collector if it runs; True when this call paused it. ``freeze``: when it
    resumes, what is then alive is frozen (only in a process that owns itself)."""
    global _paused, _freeze
    if _paused or not gc.isenabled():
        return False
    gc.disable()
    _paused, _freeze = True, freeze
    return True


def resume_collector() -> None:
    """Resume the collector if :func:`pause_collector` paused it (else nothing)."""
    global _paused
    if _paused:
        _paused = False
        if _freeze:
            gc.freeze()
        gc.enable()


@contextlib.contextmanager
def collector_paused(*, freeze: bool = False) -> Iterator[None]:
    """The block with the collector paused (left as it was when it was already off);
    ``freeze`` as in :func:`pause_collector`."""
    paused = pause_collector(freeze=freeze)
    try:
        yield
    finally:
        if paused:
            resume_collector()


os.register_at_fork(after_in_child=resume_collector)
