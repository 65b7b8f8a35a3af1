"""Benchmark: PID-MADE's own experiments, as close as the data here allows, over seeds.

On scikit-learn's digits (the stand-in for the paper's FEMNIST digits), the logistic
model and label flipping at 100 % unless stated (``benchmarks/params/robustness-digits.yaml``
otherwise: IID clients, 20 rounds of two local epochs):

- ``table4``: 20 clients, 2 attackers, poisoning rate 10 / 50 / 100 % (the paper's Table
  4): FedAvg alone, PID-MADE before it with the paper's two thresholds (``gaussian``,
  ``chebyshev``) and our robust one, and the distance CUSUM with the round cut
  (``distance_cusum_cut``: not PID-MADE; ``pid_made``'s default when these records were
  made);
- ``figure4``: 40 clients, attacker fraction 0.1 to 0.5 (the paper's Figure 4): the
  distance CUSUM with the round cut, PID-MADE with the robust threshold, and the distance
  CUSUM with the geometric median (the paper's advice against coordinated attackers) as
  the centroid;
- ``ablation``: 20 clients, 4 attackers: P (Ki = Kd = 0), PI (Kd = 0) and PID, with the
  robust and the Gaussian thresholds;
- ``thresholds``: 8 / 20 / 40 / 100 clients, a fifth of them attackers: the four
  methods of ``table4``.

Every method pins its whole configuration here, so a change of a filter's defaults
cannot change what a row's name means. PID-MADE with the paper's thresholds (``gaussian``,
``chebyshev``, and the gains' ``…-gaussian``) reads a banned client's later update as the
paper does, one of the round's submitted models (``banned_updates: counted``); our
robust threshold of its score (``robust``, ``pid_made_robust``, ``P``, ``PI``, ``PID``)
leaves it out (``left_out``), the reading our thresholds' other records were made with.

Every PID-MADE method excludes for good (Algorithm 1). Cells run through
:func:`benchmarks.robustness.matrix.run_cell` (the comparison grid's engine calls) and append to
``benchmarks/results/pid-made-paper-cells.jsonl`` (a rerun skips finished cells); the
summary, every seed's accuracy, loss, false positives and negatives (client-rounds),
honest clients ever excluded and attackers caught, in the order of the seed ids listed
beside them (``seed``), goes to ``pid-made-paper.{json,md}`` (committed), from which
``python -m benchmarks.evidence.report`` builds docs/results.md's tables.

    python -m benchmarks.papers.pid_made_paper [--seeds 5] [--experiments table4 ...]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import write_summary
from benchmarks.robustness.matrix import PARAMS, REPO, RESULTS, finished, run_matrix
from fedsieve.arguments import positive_int

FEDAVG: dict[str, Any] = {"aggregate": {"name": "fedavg"}}


def pid(**options: Any) -> dict[str, Any]:
    """PID-MADE before FedAvg: with the paper's thresholds, a banned client's later update
    counted as the paper reads it (``counted``); with our robust one, left out of the
    centroid and the threshold's statistics (``left_out``), as in its other records."""
    reading = "left_out" if options.get("threshold") == "robust" else "counted"
    spec = {"name": "pid_made", "banned_updates": reading, **options}
    return {"aggregate": {"name": "fedavg"}, "filters": [spec]}


def distance_cusum(**options: Any) -> dict[str, Any]:
    """The distance CUSUM (drift 3, h 8) with the round cut at 11 robust deviations."""
    spec = {"name": "distance_cusum", "drift": 3.0, "h": 8.0, "round_cut": 11.0, **options}
    return {"aggregate": {"name": "fedavg"}, "filters": [spec]}


THRESHOLDS = {
    "distance_cusum_cut": distance_cusum(),
    "robust": pid(threshold="robust"),
    "chebyshev": pid(threshold="chebyshev"),
    "gaussian": pid(threshold="gaussian"),
}
# experiment -> [(label, clients, attack options, fractions or attacker count, methods)]
EXPERIMENTS: dict[str, list[tuple[str, int, dict[str, Any], list[float], dict[str, Any]]]] = {
    "table4": [
        (f"rate{rate:g}", 20, {"rate": rate}, [0.1], {"fedavg": FEDAVG, **THRESHOLDS})
        for rate in (0.1, 0.5, 1.0)
    ],
    "figure4": [
        (
            "",
            40,
            {},
            [0.1, 0.2, 0.3, 0.4, 0.5],
            {
                "fedavg": FEDAVG,
                "distance_cusum_cut": distance_cusum(),
                "pid_made_robust": pid(threshold="robust"),
                "distance_cusum_cut_gm": distance_cusum(centroid="geometric_median"),
            },
        )
    ],
    "ablation": [
        (
            "",
            20,
            {},
            [0.2],
            {
                "P": pid(ki=0.0, kd=0.0, threshold="robust"),
                "PI": pid(kd=0.0, threshold="robust"),
                "PID": pid(threshold="robust"),
                "P-gaussian": pid(ki=0.0, kd=0.0, threshold="gaussian"),
                "PI-gaussian": pid(kd=0.0, threshold="gaussian"),
                "PID-gaussian": pid(threshold="gaussian"),
            },
        )
    ],
    "thresholds": [(f"n{clients}", clients, {}, [0.2], THRESHOLDS) for clients in (8, 20, 40, 100)],
}


def cells_for(experiment: str, seeds: int) -> list[Any]:
    from config.params import Params
    from tasks.grid import grid_cells

    base = yaml.safe_load((PARAMS / "robustness-digits.yaml").read_text())
    base["partition"]["root_size"] = 0  # no server-held slice: no rule here needs one
    cells = []
    for label, clients, attack, fractions, methods in EXPERIMENTS[experiment]:
        prefix = ".".join(part for part in (experiment, label) if part)
        grid = {
            "methods": {f"{prefix}.{name}": spec for name, spec in methods.items()},
            "attacks": [{"name": "label_flip", "mapping": "reverse", **attack}],
            "fractions": fractions,
            "seeds": list(range(seeds)),
        }
        config = {**base, "partition": {**base["partition"], "num_clients": clients}}
        cells += grid_cells(Params.model_validate({**config, "compare": grid}), REPO)
    return cells


def summarise(cells_file: Path, stem: Path = RESULTS / "pid-made-paper") -> None:
    """``<stem>.{json,md}``: a row per experiment, method and attacker share from the
    finished cells; the rows already in ``<stem>.json`` of experiments the cells file does
    not hold are kept (a rerun of some experiments, or a checkout without the cells file,
    keeps the others' committed rows)."""
    import json

    from tasks.comparison import shown_over_seeds as shown

    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for record in finished(cells_file).values():
        if "error" not in record:
            groups.setdefault((record["method"], record["fraction"]), []).append(record)
    rows = [
        summary_row(method, fraction, records)
        for (method, fraction), records in sorted(groups.items())
    ]
    rerun = {row["experiment"] for row in rows}
    committed = stem.with_suffix(".json")
    if committed.exists():  # the other experiments' rows first, in their committed order
        kept = json.loads(committed.read_text())["rows"]
        rows = [r for r in kept if r["experiment"] not in rerun] + rows
    lines = [
        "| experiment | method | attackers | seeds | test ACC | test loss | FP | FN "
        "| honest clients excluded | attackers caught | last attacker caught in round |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        last = [v for v in row["last_caught_round"] if v == v]  # NaN: none caught
        lines.append(
            f"| {row['experiment']} | {row['method']} | {row['fraction']:g} | {row['seeds']} "
            f"| {shown(row['acc'])} | {shown(row['loss'])} | {shown(row['fp'], 1)} "
            f"| {shown(row['fn'], 1)} | {shown(row['honest_excluded'], 1)} "
            f"| {shown(row['attackers_caught'], 1)} | {shown(last, 1)} |"
        )
    payload = {"command": "python -m benchmarks.papers.pid_made_paper", "rows": rows}
    write_summary(stem, payload, lines)


def summary_row(method: str, fraction: float, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One method at one attacker share over its seeds: every seed's outcome, in the order
    of the seed ids in ``seed``."""
    experiment, _, name = method.rpartition(".")
    records = sorted(records, key=lambda r: r["seed"])
    metrics = [r["metrics"] for r in records]
    caught = [len(r["excluded"]["malicious_first_round"]) for r in records]
    last = [max(r["excluded"]["malicious_first_round"].values(), default=float("nan"))
            for r in records]  # fmt: skip
    return {
        "experiment": experiment, "method": name, "fraction": fraction,
        "seeds": len(records), "seed": [r["seed"] for r in records],
        "acc": [m["test_acc"] for m in metrics], "loss": [m["test_loss"] for m in metrics],
        "fp": [m["total_false_positives"] for m in metrics],
        "fn": [m["total_false_negatives"] for m in metrics],
        "honest_excluded": [len(r["excluded"]["honest"]) for r in records],
        "attackers_caught": caught, "last_caught_round": last,
        **{key: [r["exposure"][key] for r in records]
           for key in ("attackers", "honest_rounds", "attacker_rounds")},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=5)
    parser.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS),
                        choices=list(EXPERIMENTS))  # fmt: skip
    parser.add_argument("--workers", type=positive_int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    cells_file = RESULTS / "pid-made-paper-cells.jsonl"
    cells = [cell for e in args.experiments for cell in cells_for(e, args.seeds)]
    run_matrix(cells, cells_file, args.workers)
    summarise(cells_file)


if __name__ == "__main__":
    main()
