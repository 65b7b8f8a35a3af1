"""Where a site's time goes, per message: what a ClientApp process spends before it works.

Flower starts a fresh ClientApp process for every message a SuperNode receives
(flwr-clientapp, one token each, in Flower 1.32.1), so each answer pays for a Python start,
Flower's runtime, the app's imports (torch) and the site's data. The site measures its
phases and sends them beside its answer (``timing``: seconds, no data); the hub journals
them with its own wall time of the exchange (:class:`flowerapp.hub.HubFiles`), and the
loopback benchmark tabulates them (``benchmarks/sites/federation_loopback.py``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["IMPORTS_STARTED", "PROCESS_STARTED", "process_started_at", "since"]


def process_started_at() -> float | None:
    """This process's start as a Unix time (Linux: /proc; to 10 ms), or None where
    unknown."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_after_boot
    except (OSError, IndexError, ValueError, AttributeError):
        return None
    return time.time() - age


def since(started: float | None, now: float | None = None) -> float:
    """Seconds from ``started`` to ``now`` (NaN when the start is unknown)."""
    if started is None:
        return float("nan")
    return (time.time() if now is None else now) - started


# When this package began to be imported (flowerapp/__init__.py imports this module first):
# what came before is the interpreter's and Flower's start, what follows the app's imports
PROCESS_STARTED = process_started_at()
IMPORTS_STARTED = time.time()
