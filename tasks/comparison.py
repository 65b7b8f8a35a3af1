"""Comparison tasks: the grid's summary table, mean accuracy curves and heatmap, written
and logged to the grid's parent run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from fedsieve.config import Params
from tasks.plots import plot_compare_curves, plot_compare_heatmap
from tasks.reports import write_csv, write_json
from tasks.tracking import Tracker, flatten_params, run_tags

__all__ = [
    "SUMMARY_COLUMNS",
    "CellResult",
    "open_grid_run",
    "summary_markdown",
    "write_comparison_reports",
]

SUMMARY_COLUMNS = (
    "method", "attack", "fraction", "seed", "test_acc", "test_auc", "test_loss",
    "rounds_to_target", "total_false_positives", "total_false_negatives",
    "detection_precision", "detection_recall",
)  # fmt: skip

# (method, attack, fraction, seed, scenario) of a cell and its result: final metrics and
# the per-round test accuracy
CellResult = tuple[str, str, float, int, str, dict[str, Any]]


def summary_rows(cells: Sequence[CellResult]) -> list[dict[str, Any]]:
    rows = []
    for method, attack, fraction, seed, _, result in cells:
        metrics = result["metrics"]
        identity = {"method": method, "attack": attack, "fraction": fraction, "seed": seed}
        rows.append(identity | {key: metrics.get(key) for key in SUMMARY_COLUMNS[4:]})
    return rows


def summary_markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    for row in rows:
        shown = [
            f"{row[key]:.4f}"
            if isinstance(row[key], float) and key != "fraction"
            else str(row[key])
            for key in SUMMARY_COLUMNS
        ]
        lines.append("| " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


def mean_curves_and_heat(
    cells: Sequence[CellResult], methods: Sequence[str]
) -> tuple[dict[str, dict[str, list[float]]], np.ndarray, list[str]]:
    """Mean accuracy curve per (scenario, method) over seeds, and the mean final accuracy
    as a scenario x method table."""
    scenarios = list(dict.fromkeys(cell[4] for cell in cells))
    curves: dict[str, dict[str, list[float]]] = {s: {} for s in scenarios}
    heat = np.full((len(scenarios), len(methods)), np.nan)
    for i, scenario in enumerate(scenarios):
        for j, method in enumerate(methods):
            mine = [c[5] for c in cells if c[4] == scenario and c[0] == method]
            curves[scenario][method] = np.mean([r["accuracy"] for r in mine], axis=0).tolist()
            heat[i, j] = float(np.mean([r["metrics"]["test_acc"] for r in mine]))
    return curves, heat, scenarios


@task(name="write-comparison-reports", cache_policy=NO_CACHE)
def write_comparison_reports(
    reports: Path, cells: Sequence[CellResult], methods: Sequence[str], parent: Tracker
) -> tuple[list[dict[str, Any]], str]:
    """``reports/compare/summary.{csv,md,json}``, ``accuracy.png`` and ``heatmap.png``,
    also logged to the grid's parent run; the summary rows and their Markdown table."""
    rows = summary_rows(cells)
    markdown = summary_markdown(rows)
    write_csv(reports / "summary.csv", rows, columns=SUMMARY_COLUMNS)
    (reports / "summary.md").write_text(markdown)
    write_json(reports / "summary.json", {"runs": rows})
    curves, heat, scenarios = mean_curves_and_heat(cells, methods)
    plot_compare_curves(curves, reports / "accuracy.png")
    plot_compare_heatmap(heat, scenarios, list(methods), reports / "heatmap.png")
    for name in ("summary.csv", "summary.md", "accuracy.png", "heatmap.png"):
        parent.log_artifact(reports / name, "compare")
    parent.log_table(rows, "compare_summary.json")
    return rows, markdown


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
