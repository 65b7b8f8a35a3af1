"""Comparison tasks: the grid's parent run, and its summary over seeds.

Every (method, attack, fraction) is summarised over its seeds: the mean, the standard
deviation and the half-width of a 95 % confidence interval (Student's t with n − 1
degrees of freedom, scipy) of final test accuracy, AUC, rounds to target and the
detection false positives and negatives. The per-seed runs stay in ``summary.csv``; the
figures show the mean accuracy per round with its interval as a band, and the mean final
accuracy per scenario × method with the differences the intervals do not support marked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE
from scipy import stats

from config.params import Params
from tasks.plots import plot_compare_curves, plot_compare_heatmap
from tasks.reports import write_csv, write_json
from tasks.tracking import Tracker, flatten_params, run_tags

__all__ = [
    "RUN_COLUMNS",
    "CellResult",
    "aggregate_over_seeds",
    "interval",
    "open_grid_run",
    "shown_over_seeds",
    "summary_markdown",
    "write_comparison_reports",
]

RUN_COLUMNS = (
    "method", "attack", "fraction", "seed", "test_acc", "test_auc", "test_loss",
    "rounds_to_target", "total_false_positives", "total_false_negatives",
    "detection_precision", "detection_recall", "backdoor_asr", "test_ece", "site_acc_worst",
)  # fmt: skip
# summarised over seeds: metric key -> short name in the summary
SUMMARISED = {
    "test_acc": "acc",
    "test_auc": "auc",
    "test_ece": "ece",  # calibration (single-label tasks)
    "site_acc_worst": "worst_site",  # per-site evaluation (partition.local_test > 0)
    "rounds_to_target": "rounds_to_target",
    "total_false_positives": "fp",
    "total_false_negatives": "fn",
    "backdoor_asr": "asr",  # a backdoor's attack success rate (absent otherwise)
}


@dataclass(frozen=True)
class CellResult:
    """One finished cell: where it sits in the grid, its final metrics and its test
    accuracy per round."""

    method: str
    attack: str
    fraction: float
    seed: int
    metrics: dict[str, Any]
    accuracy: list[float] = field(default_factory=list)

    @property
    def scenario(self) -> str:
        return f"{self.attack} @ {self.fraction:g}"


def interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean, sample standard deviation and the 95 % t-interval's half-width of
    ``values`` (NaNs left out; NaN where fewer than two values remain)."""
    finite = np.array([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if len(finite) == 0:
        return math.nan, math.nan, math.nan
    mean = float(finite.mean())
    if len(finite) < 2:
        return mean, math.nan, math.nan
    std = float(finite.std(ddof=1))
    return mean, std, float(stats.t.ppf(0.975, len(finite) - 1) * std / math.sqrt(len(finite)))


def aggregate_over_seeds(cells: Sequence[CellResult]) -> list[dict[str, Any]]:
    """One row per (method, attack, fraction), in grid order: the seeds, and the mean,
    standard deviation and 95 % half-width of every summarised metric."""
    groups: dict[tuple[str, str, float], list[CellResult]] = {}
    for cell in cells:
        groups.setdefault((cell.method, cell.attack, cell.fraction), []).append(cell)
    rows = []
    for (method, attack, fraction), members in groups.items():
        row: dict[str, Any] = {
            "method": method,
            "attack": attack,
            "fraction": fraction,
            "seeds": [m.seed for m in members],
        }
        for key, short in SUMMARISED.items():
            values = [m.metrics.get(key) for m in members]
            if key == "rounds_to_target":  # -1 (never reached) is not a round count
                values = [v for v in values if v is not None and v >= 0]
            mean, std, half = interval(values)
            row |= {f"{short}_mean": mean, f"{short}_std": std, f"{short}_ci95": half}
        rows.append(row)
    return rows


def _shown(mean: float, half: float, digits: int) -> str:
    if math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f}" if math.isnan(half) else f"{mean:.{digits}f} ± {half:.{digits}f}"


def shown_over_seeds(values: Sequence[float], digits: int = 3) -> str:
    """``values``' mean ± 95 % half-width as the summary shows it (:func:`interval`)."""
    mean, _, half = interval(values)
    return _shown(mean, half, digits)


def summary_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The summary over seeds as a Markdown table (mean ± 95 % half-width)."""
    lines = [
        "| method | attack | fraction | seeds | test ACC | worst-site ACC | test AUC | test ECE"
        " | rounds to target | FP | FN | backdoor ASR |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['method']} | {row['attack']} | {row['fraction']:g} | {len(row['seeds'])} | "
            f"{_shown(row['acc_mean'], row['acc_ci95'], 3)} | "
            f"{_shown(row['worst_site_mean'], row['worst_site_ci95'], 3)} | "
            f"{_shown(row['auc_mean'], row['auc_ci95'], 3)} | "
            f"{_shown(row['ece_mean'], row['ece_ci95'], 3)} | "
            f"{_shown(row['rounds_to_target_mean'], row['rounds_to_target_ci95'], 1)} | "
            f"{_shown(row['fp_mean'], row['fp_ci95'], 1)} | {_shown(row['fn_mean'], row['fn_ci95'], 1)} | "
            f"{_shown(row['asr_mean'], row['asr_ci95'], 3)} |"
        )
    return "\n".join(lines) + "\n"


def curves_with_bands(
    cells: Sequence[CellResult], methods: Sequence[str]
) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """Per scenario and method: the mean test accuracy per round over seeds and its 95 %
    half-width per round."""
    scenarios = list(dict.fromkeys(cell.scenario for cell in cells))
    curves: dict[str, dict[str, tuple[list[float], list[float]]]] = {s: {} for s in scenarios}
    for scenario in scenarios:
        for method in methods:
            runs = [c.accuracy for c in cells if c.scenario == scenario and c.method == method]
            if runs:
                per_round = [interval(column) for column in zip(*runs, strict=True)]
                curves[scenario][method] = (
                    [m for m, _, _ in per_round],
                    [h for _, _, h in per_round],
                )
    return curves


def heat_table(
    rows: Sequence[dict[str, Any]], methods: Sequence[str]
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Mean final accuracy as scenario × method, and which entries are not
    distinguishable from their row's best (their 95 % intervals overlap)."""
    scenarios = list(dict.fromkeys(f"{r['attack']} @ {r['fraction']:g}" for r in rows))
    means = np.full((len(scenarios), len(methods)), np.nan)
    halves = np.full_like(means, np.nan)
    for row in rows:
        i = scenarios.index(f"{row['attack']} @ {row['fraction']:g}")
        j = list(methods).index(row["method"])
        means[i, j], halves[i, j] = row["acc_mean"], row["acc_ci95"]
    tied = np.zeros(means.shape, dtype=bool)
    for i in range(len(scenarios)):
        if np.all(np.isnan(means[i])):
            continue
        best = int(np.nanargmax(means[i]))
        low = means[i, best] - np.nan_to_num(halves[i, best])
        tied[i] = (means[i] + np.nan_to_num(halves[i]) >= low) & (np.arange(len(methods)) != best)
        tied[i] &= ~np.isnan(halves[i]) & ~np.isnan(halves[i, best])
    return means, tied, scenarios


@task(name="open-grid-run", cache_policy=NO_CACHE)
def open_grid_run(params: Params, workdir: Path, cells: int) -> Tracker:
    """The grid's MLflow parent run, with the grid's settings as params."""
    parent = Tracker(params.tracking.experiment)
    parent.start(
        run_id=None,
        run_name=f"compare-{params.data.dataset}",
        tags=run_tags(params, workdir) | {"kind": "compare", "cells": str(cells)},
    )
    parent.log_params(flatten_params({"compare": params.compare.model_dump(mode="json")}))
    return parent


@task(name="write-comparison-reports", cache_policy=NO_CACHE)
def write_comparison_reports(
    reports: Path, cells: Sequence[CellResult], methods: Sequence[str], parent: Tracker
) -> tuple[list[dict[str, Any]], str]:
    """``reports/compare/summary.csv`` (every run), ``summary.{md,json}`` (over seeds),
    ``accuracy.png`` and ``heatmap.png``, also logged to the grid's parent run; the
    summary rows over seeds and their Markdown table."""
    runs = [
        {"method": c.method, "attack": c.attack, "fraction": c.fraction, "seed": c.seed}
        | {key: c.metrics.get(key) for key in RUN_COLUMNS[4:]}
        for c in cells
    ]
    summary = aggregate_over_seeds(cells)
    markdown = summary_markdown(summary)
    write_csv(reports / "summary.csv", runs, columns=RUN_COLUMNS)
    (reports / "summary.md").write_text(markdown)
    write_json(reports / "summary.json", {"cells": summary, "runs": runs})
    plot_compare_curves(curves_with_bands(cells, methods), reports / "accuracy.png")
    means, tied, scenarios = heat_table(summary, methods)
    plot_compare_heatmap(means, tied, scenarios, list(methods), reports / "heatmap.png")
    for name in ("summary.csv", "summary.md", "summary.json", "accuracy.png", "heatmap.png"):
        parent.log_artifact(reports / name, "compare")
    parent.log_table(runs, "compare_runs.json")
    parent.log_table(summary, "compare_summary.json")
    return summary, markdown
