"""Benchmark: PID-MADE's central claim, faster convergence, in its Figure 4 setting.

What the paper claims (anonymous ICLR 2026 submission, ../shared/papers/pid-made.txt):
anomaly detection and exclusion "expedites the convergence in comparison against the
undefended FL in the presence of anomalies" (contribution 2, Theorem 2). Its evidence
is the test loss per round: the rounds each method needs to reach a loss (or accuracy)
threshold chosen per dataset "based on ... the overall performance of the methods in the
group" (Figure 2: PID-MADE against Krum, Multi-Krum, RFA and Bulyan, told the number of
attackers; Figure 3), and Figure 4: BloodMNIST, 40 clients, 4 to 20 of them flipping
every label, where PID-MADE "drives the global model below the target loss threshold
when benign clients are in majority, whereas FedAvg fails to converge".

What runs here, as close as the data allows: scikit-learn's digits for BloodMNIST (which
cannot be downloaded here), 40 IID clients, the logistic model, 20 rounds of two local
epochs (``benchmarks/params/robustness-digits.yaml``), 4, 8, 12, 16 and 20 of the 40
clients flipping every label (reverse mapping), 10 seeds. Methods (:func:`method_specs`,
each configuration pinned whole): FedAvg; the paper's PID-MADE before FedAvg (``pid_made``
with its defaults: gains 1, 0.5 and 0.05, the Gaussian threshold at α = 0.05, the mean as
centroid, permanent bans, a banned client's update counted in the round's statistics);
Figure 2's baselines told the true number of attackers, capped where the rule cannot go
further (Krum and Multi-Krum: n > 2f + 2; Bulyan: n ≥ 4f + 3), and RFA (the geometric
median). The clean row: FedAvg with no attacker, the reference every run is held to;
PID-MADE with no attacker beside it.

The measure, stated before any cell ran (the paper's thresholds were chosen after its
runs; this one is fixed by the clean run of the same seed, whose partition and initial
model every run of the seed shares):

- **rounds to the clean target**: the first round whose test loss is at most
  ``(1 + TOLERANCE)`` times the clean FedAvg run's final (round 20) test loss, same seed;
  a run that never gets there within the 20 rounds has not reached it (the paper's dashed
  bar). Reported as runs that reached it (k of n) and the median round of those that did.
- **mean test loss over the rounds** (the area under the loss curve over its 20 rounds):
  lower is faster convergence, with no threshold and nothing censored. This is the
  measure tested: per seed, PID-MADE's minus FedAvg's under the same attackers, exact
  sign-flip test over the seeds, Holm over the five attacker counts.

Every cell runs through :func:`benchmarks.robustness.matrix.run_cell` (the comparison grid's
engine calls), which keeps the test loss and accuracy of every round, and is appended to
``benchmarks/results/pid-made-convergence-cells.jsonl`` (local; a rerun skips finished
cells). ``pid-made-convergence.json`` (committed) keeps one row per run: both curves and
the bans, from which ``python -m benchmarks.evidence.report`` builds docs/results.md's tables.

    python -m benchmarks.papers.pid_made_convergence [--seeds 10] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import yaml

from benchmarks.robustness.matrix import PARAMS, REPO, RESULTS, finished, run_matrix
from fedsieve.arguments import positive_int

CLIENTS = 40
FRACTIONS = [0.1, 0.2, 0.3, 0.4, 0.5]  # 4 to 20 of the 40 clients
SEEDS = 10
TOLERANCE = 0.10  # the clean target: 10 % above the clean FedAvg run's final test loss
ATTACK: dict[str, Any] = {"name": "label_flip", "rate": 1.0, "mapping": "reverse"}
STEM = RESULTS / "pid-made-convergence"
CELLS_FILE = STEM.with_name("pid-made-convergence-cells.jsonl")
CLEAN_REFERENCE = "fedavg"  # the row every run's target is read from
CLEAN_METHODS = ["fedavg", "pid_made"]

FEDAVG: dict[str, Any] = {"name": "fedavg"}
# the paper's PID-MADE: pid_made's defaults, written out
PID_MADE: dict[str, Any] = {
    "name": "pid_made", "kp": 1.0, "ki": 0.5, "kd": 0.05, "alpha": 0.05,
    "threshold": "gaussian", "centroid": "mean", "exclusion": "permanent",
    "banned_updates": "counted", "round_cut": None,
}  # fmt: skip
# rule -> the most attackers it can be told among CLIENTS (None: it takes no f)
TOLD_AT_MOST = {"krum": (CLIENTS - 3) // 2, "multi_krum": (CLIENTS - 3) // 2,
                "bulyan": (CLIENTS - 3) // 4}  # fmt: skip


def method_specs(attackers: int) -> dict[str, dict[str, Any]]:
    """Every method's whole configuration with ``attackers`` of the clients attacking."""

    def told(rule: str) -> int:
        return min(attackers, TOLD_AT_MOST[rule])

    return {
        "fedavg": {"aggregate": FEDAVG},
        "pid_made": {"aggregate": FEDAVG, "filters": [PID_MADE]},
        "krum": {"aggregate": {"name": "krum", "f": told("krum")}},
        "multi_krum": {"aggregate": {"name": "multi_krum", "f": told("multi_krum"), "m": None}},
        "geometric_median": {
            "aggregate": {"name": "geometric_median", "nu": 1e-6, "max_iter": 100, "tol": 1e-6}
        },
        "bulyan": {"aggregate": {"name": "bulyan", "f": told("bulyan")}},
    }


def cells_for(seeds: int) -> list[Any]:
    """The clean runs, then every attacker count's, as validated grid cells."""
    from config.params import Params
    from tasks.grid import grid_cells

    base = yaml.safe_load((PARAMS / "robustness-digits.yaml").read_text())
    base["partition"] = {**base["partition"], "num_clients": CLIENTS, "root_size": 0}
    clean = {m: spec for m, spec in method_specs(0).items() if m in CLEAN_METHODS}
    grids = [(clean, {"name": "none"}, [0.0])] + [
        (method_specs(round(fraction * CLIENTS)), ATTACK, [fraction]) for fraction in FRACTIONS
    ]
    cells = []
    for methods, attack, fractions in grids:
        grid = {"methods": methods, "attacks": [attack], "fractions": fractions,
                "seeds": list(range(seeds))}  # fmt: skip
        cells += grid_cells(Params.model_validate({**base, "compare": grid}), REPO)
    return cells


def curve(values: list[float]) -> str:
    return " ".join(f"{v:.5f}" for v in values)


def run_row(record: dict[str, Any]) -> dict[str, Any]:
    """One run as kept: its coordinates, the attackers it had and the f its rule was
    told, its test loss and accuracy per round, honest clients and attackers ever
    excluded, or its error."""
    row = {k: record[k] for k in ("method", "attack", "fraction", "seed")}
    if "error" in record:
        return row | {"error": record["error"].splitlines()[0]}
    return row | {
        "attackers": record["exposure"]["attackers"],
        "f_told": record["exposure"]["f_told"],
        "loss_curve": curve(record["loss"]),
        "acc_curve": curve(record["accuracy"]),
        "honest_excluded": len(record["excluded"]["honest"]),
        "attackers_caught": len(record["excluded"]["malicious_first_round"]),
        "error": None,
    }


def summarise(seeds: int) -> None:
    records = sorted(
        finished(CELLS_FILE).values(),
        key=lambda r: (r["attack"] != "none", r["fraction"], r["method"], r["seed"]),
    )
    payload = {
        "command": f"python -m benchmarks.papers.pid_made_convergence --seeds {seeds}",
        "settings": {
            "params": "benchmarks/params/robustness-digits.yaml",
            "clients": CLIENTS, "attack": ATTACK, "fractions": FRACTIONS,
            "tolerance": TOLERANCE, "clean_reference": CLEAN_REFERENCE,
            "methods": {"clean": {m: method_specs(0)[m] for m in CLEAN_METHODS}} | {
                f"{fraction:g}": method_specs(round(fraction * CLIENTS))
                for fraction in FRACTIONS
            },
        },
        "rows": [run_row(r) for r in records],
    }  # fmt: skip
    STEM.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    failed = sum(1 for r in records if "error" in r)
    print(f"wrote {STEM.name}.json: {len(records)} runs, {failed} failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=SEEDS)
    parser.add_argument("--workers", type=positive_int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    run_matrix(cells_for(args.seeds), CELLS_FILE, args.workers)
    summarise(args.seeds)


if __name__ == "__main__":
    main()
