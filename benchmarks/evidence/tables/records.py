"""The committed records the tables and the claims ledger read: the robustness matrix's
per-seed CSVs (``benchmarks/results/robustness-<name>-seeds.csv``, one row per cell and
seed, written by ``python -m benchmarks.robustness.matrix``) and the other benchmarks' JSON
records, with the rules every table applies to them (a halted run scored at chance)."""

from __future__ import annotations

import csv
import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.robustness.matrix import BINARY

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "benchmarks" / "results"

# dataset -> the headline metric (the benchmark's binary datasets: AUC, their accuracy sits
# near the majority share)
HEADLINE = {
    d: "test_auc" if d in BINARY else "test_acc"
    for d in ("digits", "breastmnist", "adrenalmnist3d")
}

Row = dict[str, Any]


def load(name: str) -> list[Row]:
    """The per-seed records of a matrix (``digits``, ``digits-dirichlet-0.1``...), numbers
    as numbers (None where empty). Each call gets rows of its own (blocks may add keys);
    the file is parsed once while it is unchanged."""
    path = RESULTS / f"robustness-{name}-seeds.csv"
    return [dict(row) for row in _parsed(path, path.stat().st_mtime_ns)]


@functools.lru_cache(maxsize=32)
def _parsed(path: Path, _changed: int) -> tuple[Row, ...]:
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        for key, value in row.items():
            if key not in ("method", "attack", "error", "acc_curve"):
                row[key] = None if value == "" else float(value)
        # triggered images sent to the target: the success rate's count
        row["asr_hits"] = None if row["asr"] is None else round(row["asr"] * row["trigger_images"])
    return tuple(rows)


def recorded(name: str) -> bool:
    return (RESULTS / f"robustness-{name}-seeds.csv").exists()


def results_json(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())


def distinct(rows: Iterable[Row], key: str = "method") -> list[Any]:
    """The values of ``key`` in the rows, in first-seen order."""
    return list(dict.fromkeys(r[key] for r in rows))


def finished(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if not r["error"]]


def by_seed(rows: Iterable[Row], metric: str) -> dict[int, float]:
    return {int(r["seed"]): r[metric] for r in rows if r[metric] is not None}


def chance(row: Row, metric: str) -> float:
    """What a model that learnt nothing scores: the majority share (accuracy) or 0.5."""
    return row["majority_share"] if metric == "test_acc" else 0.5


def with_halts(rows: list[Row]) -> list[Row]:
    """Every run, a halted one (its rule raised, e.g. told more attackers than it can take
    once the non-finite rows are dropped, or its model diverged: ``ModelDiverged``) scored
    at chance and marked ``halted`` (and ``diverged``): a deployment that halts gets no
    model from the run, so it counts as a loss."""
    majority = next(r["majority_share"] for r in rows if r["majority_share"] is not None)
    out = []
    for row in rows:
        if row["error"]:
            diverged = row["error"].startswith("ModelDiverged")
            row = {**row, "majority_share": majority, "halted": True, "diverged": diverged}
            row |= {metric: chance(row, metric) for metric in ("test_acc", "test_auc")}
        else:
            row = {**row, "halted": False}
        out.append(row)
    return out
