"""What every benchmark result records about the machine and software it ran on, and a
running Prefect server for the benchmarks that compare against one."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "cpu_environment",
    "cpu_model",
    "free_port",
    "prefect_server_running",
    "versions",
    "write_summary",
]


def write_summary(stem: Path, payload: dict[str, Any], lines: list[str]) -> None:
    """A benchmark's summary: ``payload`` to ``<stem>.json``, the Markdown ``lines`` to
    ``<stem>.md`` and the console."""
    import json

    stem.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions(**extra: Any) -> dict[str, Any]:
    """Python, torch and numpy versions, plus ``extra`` (e.g. ``scipy=scipy.__version__``)."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        **extra,
    }


def cpu_device() -> dict[str, Any]:
    """The ``device`` entry of a CPU result: the processor, the cores this process may
    use, the platform."""
    return {
        "kind": "cpu",
        "cpu_model": cpu_model(),
        "nproc": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
    }


def cpu_environment() -> dict[str, Any]:
    """``device`` and ``versions`` entries for a CPU run."""
    return {
        "device": {
            "kind": "cpu",
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
        },
        "versions": versions(),
    }


def free_port() -> int:
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def prefect_server_running(env: dict[str, str], timeout: float = 120) -> Iterator[str | None]:
    """``prefect server start`` (no UI) on a free loopback port with ``env`` (its
    PREFECT_HOME); yields the API URL once ``/health`` answers, or None on a time-out."""
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
         "--port", str(port), "--no-ui"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.5)
        else:
            yield None
            return
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
