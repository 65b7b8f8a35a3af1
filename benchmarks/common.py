"""What every benchmark result records about the machine and software it ran on."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["cpu_environment", "cpu_model", "versions"]


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
