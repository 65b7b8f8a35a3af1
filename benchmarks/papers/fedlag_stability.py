"""Benchmark: FedLag's stated stability claim on label-skewed (Dirichlet) partitions,
against FedAvg and FedProx, over seeds.

The FedLag paper reports no experiments; it claims its likelihood fusion keeps training
stable when clients' data differ. Here: scikit-learn's digits, 10 clients, Dirichlet α in
{0.1, 0.5, 1}, the logistic model, 20 rounds of two local epochs
(``benchmarks/params/robustness-digits.yaml`` otherwise), no attack. Per cell: the final
test accuracy and, as the measure of stability, the standard deviation of the test
accuracy over the last 10 rounds. Cells append to
``benchmarks/results/fedlag-stability-cells.jsonl`` (a rerun skips finished ones); the
summary, mean ± 95 % t-interval over seeds, goes to ``fedlag-stability.{json,md}``, with
every seed's values in seed order (a seed fixes the partition and the initial model for
all three methods, so they are compared seed by seed).

    python -m benchmarks.papers.fedlag_stability [--seeds 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

import yaml

from benchmarks.common import write_summary
from benchmarks.robustness.matrix import PARAMS, REPO, RESULTS, finished, run_matrix
from fedsieve.arguments import positive_int

ALPHAS = (0.1, 0.5, 1.0)
METHODS: dict[str, tuple[str, float]] = {  # name -> (aggregate, FedProx mu)
    "fedavg": ("fedavg", 0.0),
    "fedprox": ("fedavg", 0.01),
    "fedlag": ("fedlag", 0.0),
}
LAST_ROUNDS = 10


def cells_for(seeds: int) -> list[Any]:
    from config.params import Params
    from tasks.grid import grid_cells

    base = yaml.safe_load((PARAMS / "robustness-digits.yaml").read_text())
    cells = []
    for alpha in ALPHAS:
        for name, (aggregate, mu) in METHODS.items():
            config = {
                **base,
                "partition": {"scheme": "dirichlet", "alpha": alpha, "num_clients": 10,
                              "min_samples": 2, "root_size": 0},
                "train": {**base["train"], "prox_mu": mu},
                "compare": {
                    "methods": {f"a{alpha:g}.{name}": {"aggregate": {"name": aggregate}}},
                    "attacks": [{"name": "none"}],
                    "seeds": list(range(seeds)),
                },
            }  # fmt: skip
            cells += grid_cells(Params.model_validate(config), REPO)
    return cells


def summarise() -> None:
    from tasks.comparison import shown_over_seeds as shown

    groups: dict[str, list[dict[str, Any]]] = {}
    for record in finished(RESULTS / "fedlag-stability-cells.jsonl").values():
        if "error" not in record:
            groups.setdefault(record["method"], []).append(record)
    for records in groups.values():
        records.sort(key=lambda record: record["seed"])

    rows, lines = [], [
        f"| Dirichlet α | method | seeds | test ACC | test AUC | std of test ACC, last {LAST_ROUNDS} rounds |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for method, records in sorted(groups.items()):
        alpha, _, name = method.rpartition(".")
        acc = [r["metrics"]["test_acc"] for r in records]
        auc = [r["metrics"]["test_auc"] for r in records]
        wobble = [statistics.stdev(r["accuracy"][-LAST_ROUNDS:]) for r in records]
        rows.append({"alpha": float(alpha[1:]), "method": name, "seeds": len(records),
                     "seed": [r["seed"] for r in records],
                     "acc": acc, "auc": auc, "last_rounds_acc_std": wobble})  # fmt: skip
        lines.append(f"| {alpha[1:]} | {name} | {len(records)} | {shown(acc)} | {shown(auc)} "
                     f"| {shown(wobble)} |")  # fmt: skip
    stem = RESULTS / "fedlag-stability"
    payload = {"command": "python -m benchmarks.papers.fedlag_stability", "rows": rows}
    write_summary(stem, payload, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=10)
    parser.add_argument("--workers", type=positive_int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    run_matrix(cells_for(args.seeds), RESULTS / "fedlag-stability-cells.jsonl", args.workers)
    summarise()


if __name__ == "__main__":
    main()
