"""Benchmark: how often the tables' interval for a share covers the mean it is for, by
simulation at 5 and 10 seeds.

    python -m benchmarks.evidence.share_intervals [--draws 400]

A share averaged over seeds (an accuracy, an AUC, a worst case, a rate per seed) is shown
with its 95 % logit-scale t-interval (:func:`tasks.statistics.share_interval`). Its
coverage is measured on populations shaped like the records: every share the robustness
tables show (each method's no-attack score and its worst case at each fraction, per seed,
in every committed ``robustness-*-seeds.csv``) gives a Beta distribution with the same
mean and variance (mean kept in [0.002, 0.998], variance at least 1e-6). From each,
``--draws`` sets of 5 and of 10 seeds are drawn, rounded to the records' four decimals,
and each interval is checked against the Beta's mean. Beside it, the two intervals the
tables showed before: the percentile bootstrap (scipy, 999 resamples) and the plain
t-interval, with how often the latter leaves [0, 1]. Writes
``benchmarks/results/share-interval-coverage.json`` (per population and in summary).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from fedsieve.arguments import positive_int
from tasks.statistics import share_interval

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
SEEDS = (5, 10)


def populations() -> list[dict[str, Any]]:
    """Every share the robustness tables show, per seed: (record, method, what, values)."""
    from benchmarks.evidence.tables.records import HEADLINE, by_seed, distinct, load, with_halts
    from benchmarks.evidence.tables.robustness_matrix import worst_by_seed

    found = []
    for path in sorted(RESULTS.glob("robustness-*-seeds.csv")):
        name = path.name.removeprefix("robustness-").removesuffix("-seeds.csv")
        rows = with_halts(load(name))
        metric = HEADLINE[name.split("-")[0]]
        fractions = sorted({r["fraction"] for r in rows if r["attack"] != "none"})
        for method in distinct(rows):
            mine = (r for r in rows if r["method"] == method and r["attack"] == "none")
            found.append((name, method, "no attack", list(by_seed(mine, metric).values())))
            for fraction in fractions:
                worst, _, _ = worst_by_seed(rows, method, fraction, metric)
                found.append((name, method, f"worst at {fraction:g}", list(worst.values())))
    return [
        {"record": r, "method": m, "share": w, "values": v} for r, m, w, v in found if len(v) >= 2
    ]


def beta_like(values: list[float]) -> tuple[float, float]:
    """The Beta distribution's (a, b) with the values' mean and variance."""
    mean = min(max(float(np.mean(values)), 0.002), 0.998)
    variance = max(float(np.var(values, ddof=1)), 1e-6)
    concentration = max(mean * (1 - mean) / variance - 1, 0.5)
    return mean * concentration, (1 - mean) * concentration


def coverage(
    a: float, b: float, seeds: int, draws: int, rng: np.random.Generator
) -> dict[str, float]:
    """How often each interval covers the Beta's mean over ``draws`` sets of ``seeds``."""
    truth = a / (a + b)
    sets = np.round(rng.beta(a, b, size=(draws, seeds)), 4)
    logit_t = np.array([share_interval(list(values))[1:] for values in sets])
    mean = sets.mean(axis=1)
    half = stats.t.ppf(0.975, seeds - 1) * sets.std(axis=1, ddof=1) / math.sqrt(seeds)
    spread = np.ptp(sets, axis=1) > 0
    low, high = mean.copy(), mean.copy()
    if spread.any():
        result = stats.bootstrap((sets[spread],), np.mean, axis=-1, vectorized=True,
                                 method="percentile", n_resamples=999, rng=rng)  # fmt: skip
        low[spread], high[spread] = result.confidence_interval
    return {
        "logit_t": float(np.mean((logit_t[:, 0] <= truth) & (truth <= logit_t[:, 1]))),
        "percentile_bootstrap": float(np.mean((low <= truth) & (truth <= high))),
        "t": float(np.mean(np.abs(mean - truth) <= half)),
        "t_leaves_0_1": float(np.mean((mean - half < 0) | (mean + half > 1))),
    }


def summary(cells: list[dict[str, Any]], seeds: int) -> dict[str, dict[str, float]]:
    """Per interval, over the populations: the mean, the 10th percentile and the lowest
    coverage; for the plain t, how often it left [0, 1] (mean and highest)."""
    out = {}
    for key in ("logit_t", "percentile_bootstrap", "t", "t_leaves_0_1"):
        values = np.array([c["coverage"][str(seeds)][key] for c in cells])
        out[key] = {"mean": round(float(values.mean()), 4)} | (
            {"highest": round(float(values.max()), 4)}
            if key == "t_leaves_0_1"
            else {
                "p10": round(float(np.quantile(values, 0.1)), 4),
                "lowest": round(float(values.min()), 4),
            }
        )
    return out


def block() -> str:
    """docs/results.md's statement of the intervals' coverage, from the record."""
    record = json.loads((RESULTS / "share-interval-coverage.json").read_text())

    def percent(share: float) -> str:
        return f"{share * 100:.1f} %"

    def shown(cell: dict[str, float]) -> str:
        return (
            f"{percent(cell['mean'])}, 10th percentile {percent(cell['p10'])}, "
            f"lowest {percent(cell['lowest'])}"
        )

    lines = [
        "| seeds | logit-scale t (the tables' interval) | percentile bootstrap (before) "
        "| t-interval (before) | t-intervals leaving [0, 1] (mean, most) |",
        "|---|---|---|---|---|",
    ]
    for seeds, cells in record["summary"].items():
        leaves = cells["t_leaves_0_1"]
        lines.append(
            f"| {seeds} | {shown(cells['logit_t'])} | {shown(cells['percentile_bootstrap'])} "
            f"| {shown(cells['t'])} | {percent(leaves['mean'])}, {percent(leaves['highest'])} |"
        )
    return (
        "\n".join(lines)
        + f"\n\nCoverage of the mean at a nominal 95 %, over {record['populations']} populations "
        f"(one per share the robustness tables show), {record['draws']} simulated sets of "
        "seeds each: the mean over the populations, the 10th percentile and the lowest.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=positive_int, default=400)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    cells = populations()
    for cell in cells:
        a, b = beta_like(cell["values"])
        cell["beta"] = [round(a, 4), round(b, 4)]
        cell["coverage"] = {str(n): coverage(a, b, n, args.draws, rng) for n in SEEDS}
    record = {
        "benchmark": "share_intervals",
        "command": "python -m benchmarks.evidence.share_intervals"
        + " ".join(["", *sys.argv[1:]]).rstrip(),
        "draws": args.draws,
        "populations": len(cells),
        "summary": {str(n): summary(cells, n) for n in SEEDS},
        "cells": cells,
    }
    path = RESULTS / "share-interval-coverage.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    for n in SEEDS:
        print(f"{n} seeds: {record['summary'][str(n)]}")
    print(f"wrote {path.relative_to(REPO)} ({len(cells)} populations)")


if __name__ == "__main__":
    main()
