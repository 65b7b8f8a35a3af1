"""Figures for reports and MLflow (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

__all__ = ["plot_curves", "plot_partition"]


def plot_partition(report: Mapping[str, Any], labels: Sequence[str], path: Path) -> Path:
    """Stacked bars: samples of each class per client."""
    counts = np.array([client["classes"] for client in report["clients"]])  # (clients, classes)
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(counts) + 2), 4))
    bottom = np.zeros(len(counts))
    for cls in range(counts.shape[1]):
        name = labels[cls] if cls < len(labels) else str(cls)
        ax.bar(np.arange(len(counts)), counts[:, cls], bottom=bottom, label=f"{cls}: {name}"[:30])
        bottom += counts[:, cls]
    ax.set_xlabel("client")
    ax.set_ylabel("samples")
    ax.set_title("Label distribution per client")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_curves(history: Sequence[Mapping[str, float]], path: Path) -> Path:
    """Test loss, accuracy and AUC per round."""
    rounds = [row["round"] for row in history]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for ax, key in zip(axes, ("test_loss", "test_acc", "test_auc"), strict=True):
        ax.plot(rounds, [row.get(key, np.nan) for row in history], marker="o", ms=3)
        ax.set_xlabel("round")
        ax.set_title(key)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
