"""Figures for reports and MLflow (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

__all__ = [
    "plot_compare_curves",
    "plot_compare_heatmap",
    "plot_curves",
    "plot_exclusion_heatmap",
    "plot_note",
    "plot_partition",
    "plot_registered_sites",
    "plot_reliability",
    "plot_sites",
]


def _save(fig: Figure, path: Path) -> Path:
    """Lay out, write and close a figure (pyplot figures stay open until closed)."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_reliability(confidence: np.ndarray, correct: np.ndarray, bins: int, path: Path) -> Path:
    """Reliability diagram of the top-label confidence (scikit-learn's CalibrationDisplay,
    equal-width bins): accuracy against confidence, the diagonal being calibrated."""
    from sklearn.calibration import CalibrationDisplay

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    CalibrationDisplay.from_predictions(
        correct, confidence, n_bins=bins, strategy="uniform", name="final model", ax=ax
    )
    ax.set(xlabel="top-label confidence", ylabel="accuracy", title="Reliability (test split)")
    return _save(fig, path)


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
    return _save(fig, path)


def plot_registered_sites(sites: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Bars: the training samples each real site registered (its data stays there)."""
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(sites) + 2), 4))
    ax.bar([site["name"] for site in sites], [site["samples"] for site in sites])
    ax.set_ylabel("training samples (registered)")
    ax.set_title("Data held at the sites (federation.sites)")
    ax.tick_params(axis="x", labelrotation=45)
    return _save(fig, path)


def plot_note(text: str, path: Path) -> Path:
    """A figure that says, in words, why there is nothing to draw."""
    fig, ax = plt.subplots(figsize=(7, 2))
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    ax.set_axis_off()
    return _save(fig, path)


def plot_curves(history: Sequence[Mapping[str, float]], path: Path) -> Path:
    """Test loss, accuracy and AUC per round."""
    rounds = [row["round"] for row in history]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for ax, key in zip(axes, ("test_loss", "test_acc", "test_auc"), strict=True):
        ax.plot(rounds, [row.get(key, np.nan) for row in history], marker="o", ms=3)
        ax.set_xlabel("round")
        ax.set_title(key)
        ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_sites(rows: Sequence[Mapping[str, float]], path: Path) -> Path:
    """Each site's accuracy on its local test split per scored round, the site that ends
    worst drawn bold and named; without local test splits, a figure saying so."""
    fig, ax = plt.subplots(figsize=(7, 4))
    if not rows:
        ax.text(0.5, 0.5, "no local test splits (partition.local_test = 0)", ha="center")
        ax.set_axis_off()
        return _save(fig, path)
    last = max(row["round"] for row in rows)
    final = {int(row["site"]): row["acc"] for row in rows if row["round"] == last}
    worst = min(final, key=final.__getitem__)
    for site in sorted({int(row["site"]) for row in rows}):
        mine = [row for row in rows if int(row["site"]) == site]
        rounds, acc = [row["round"] for row in mine], [row["acc"] for row in mine]
        if site == worst:
            ax.plot(rounds, acc, color="crimson", linewidth=2.5, zorder=3,
                    label=f"worst site at the end: {site} ({final[site]:.2f})")  # fmt: skip
        else:
            ax.plot(rounds, acc, color="grey", alpha=0.45, linewidth=1)
    ax.set(xlabel="round", ylabel="accuracy on the site's local test split",
           title="Per-site accuracy (one line per site)")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return _save(fig, path)


def plot_exclusion_heatmap(trail: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Client x round map of filter scores (or the trail's exclusions when no filter
    scores), exclusions marked with x, malicious clients' labels in red."""
    clients = sorted({int(row["client"]) for row in trail})
    rounds = sorted({int(row["round"]) for row in trail})
    index = {c: i for i, c in enumerate(clients)}
    scores = np.full((len(clients), len(rounds)), np.nan)
    has_scores = any(row.get("score") not in (None, "") for row in trail)
    fig, ax = plt.subplots(
        figsize=(max(6, 0.25 * len(rounds) + 3), max(3, 0.22 * len(clients) + 1.5))
    )
    for row in trail:
        i, j = index[int(row["client"])], int(row["round"]) - rounds[0]
        value = row.get("score")
        scores[i, j] = (
            float(value) if has_scores and value not in (None, "") else float(bool(row["excluded"]))
        )
    image = ax.imshow(scores, aspect="auto", cmap="viridis", interpolation="nearest",
                      extent=(rounds[0] - 0.5, rounds[-1] + 0.5, len(clients) - 0.5, -0.5))  # fmt: skip
    fig.colorbar(image, ax=ax, label="PID score" if has_scores else "excluded")
    excluded = [(int(r["round"]), index[int(r["client"])]) for r in trail if r["excluded"]]
    if excluded:
        xs, ys = zip(*excluded, strict=True)
        ax.scatter(xs, ys, marker="x", color="red", s=25, label="excluded")
        ax.legend(loc="upper right", fontsize=7)
    malicious = {int(r["client"]) for r in trail if r["malicious"] in (True, "True")}
    ax.set_yticks(range(len(clients)), [str(c) for c in clients], fontsize=6)
    for label, client in zip(ax.get_yticklabels(), clients, strict=True):
        if client in malicious:
            label.set_color("red")
    ax.set_xlabel("round")
    ax.set_ylabel("client (red: malicious)")
    ax.set_title("Exclusion trail")
    return _save(fig, path)


def plot_compare_curves(
    curves: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]], path: Path
) -> Path:
    """Test accuracy per round for each method, one panel per scenario (attack @
    fraction): the mean over seeds, with its 95 % interval as a band."""
    scenarios = list(curves)
    fig, axes = plt.subplots(1, len(scenarios), figsize=(5 * len(scenarios), 3.8), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        for method, (mean, half) in curves[scenario].items():
            rounds = np.arange(1, len(mean) + 1)
            (line,) = ax.plot(rounds, mean, label=method)
            low, high = np.asarray(mean) - np.asarray(half), np.asarray(mean) + np.asarray(half)
            ax.fill_between(rounds, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
        ax.set_title(scenario)
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (mean, 95% interval)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_compare_heatmap(
    table: np.ndarray, tied: np.ndarray, rows: Sequence[str], columns: Sequence[str], path: Path
) -> Path:
    """Mean final test accuracy, scenario (rows) x method (columns), values written in;
    ``tied`` entries (not distinguishable from their row's best) are marked with ≈."""
    fig, ax = plt.subplots(figsize=(1.3 * len(columns) + 2.5, 0.6 * len(rows) + 1.8))
    image = ax.imshow(table, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), rows)
    for i in range(table.shape[0]):
        for j in range(table.shape[1]):
            mark = "≈" if tied[i, j] else ""
            ax.text(
                j, i, f"{table[i, j]:.3f}{mark}", ha="center", va="center", color="w", fontsize=8
            )
    fig.colorbar(image, ax=ax, label="final test accuracy (mean over seeds)")
    ax.set_title("Final accuracy; ≈: within the row best's 95% interval")
    return _save(fig, path)
