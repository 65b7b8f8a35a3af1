"""Benchmark: PID-MADE's exclusion test, ablated (issue 32, item 7).

Four ways to turn the round's PID-MADE scores into exclusions, every one excluding for
good (Algorithm 1), before FedAvg:

- ``paper``: the paper's Gaussian threshold, mean + z(1 − α)·std (Theorem 6);
- ``spent`` (the default): median + k·1.4826·MAD with α split over the clients and spent
  over rounds, so k grows every round (4.0 in round 1 to 9.1 in round 20 at 20 clients);
- ``fixed``: the same robust threshold with α/m in every round (a fixed per-round k);
- ``cusum``: Page's CUSUM of each client's robust z-score of its distance, drift 3,
  h 8: evidence summed over rounds, one round never enough.

Settings: the robustness matrix's (``benchmarks/params/robustness-<dataset>.yaml``: 20
IID clients, the logistic model, 20 rounds of two local epochs; no server-held slice),
with no attack and with 4 of 20 clients flipping every label. Seeds 0–9 are the ones
``cusum``'s drift and h were chosen on; seeds 10–19 are held out, and the tables report
them apart. Per run: honest clients ever banned, attackers banned by round 5, and the
per-client detection ROC-AUC of the rule's own score in rounds 1, 5 and 20 (attackers
as positives, every client scored, the banned included): how well the score ranks
attackers above honest clients whatever the threshold.

    python -m benchmarks.pid_made_ablation [--datasets digits breastmnist] [--seeds 20]

Records: ``benchmarks/results/pid-made-ablation-cells.jsonl`` (local; a rerun skips
finished runs) and ``pid-made-ablation-seeds.csv`` (committed: one row per run), from
which ``python -m benchmarks.report`` builds docs/results.md's table.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
import traceback
from typing import Any

import yaml

from benchmarks.robustness import PARAMS, REPO, RESULTS, finished, run_matrix, trained

VARIANTS: dict[str, dict[str, Any]] = {
    "paper": {"threshold": "gaussian"},
    "spent": {},
    "fixed": {"spending": "none"},
    "cusum": {"threshold": "cusum"},
}
TUNED_ON = range(10)  # the seeds cusum's drift and h were chosen on
AUC_ROUNDS = (1, 5, 20)
CAUGHT_BY = 5
STEM = RESULTS / "pid-made-ablation"
SEED_COLUMNS = [
    "dataset", "variant", "attack", "seed", "test_acc", "test_auc", "majority_share",
    "attackers", "honest_banned", "attackers_banned", f"attackers_banned_by_{CAUGHT_BY}",
    *(f"auc_round_{t}" for t in AUC_ROUNDS), "error",
]  # fmt: skip


def cells_for(dataset: str, seeds: int) -> list[Any]:
    from config.params import Params
    from tasks.grid import grid_cells

    base = yaml.safe_load((PARAMS / f"robustness-{dataset}.yaml").read_text())
    base["partition"]["root_size"] = 0  # no rule here needs a server-held slice
    grid = {
        "methods": {
            f"{dataset}.{name}": {
                "aggregate": {"name": "fedavg"},
                "filters": [{"name": "pid_made", **options}],
            }
            for name, options in VARIANTS.items()
        },
        "attacks": [{"name": "none"}, {"name": "label_flip", "rate": 1.0, "mapping": "reverse"}],
        "fractions": [0.2],
        "seeds": list(range(seeds)),
    }
    return grid_cells(Params.model_validate({**base, "compare": grid}), REPO)


def detection(trail: list[dict[str, Any]]) -> dict[str, Any]:
    """Who was banned and when, and the score's ROC-AUC over clients in some rounds."""
    from sklearn.metrics import roc_auc_score

    rows = [row for row in trail if row.get("reason") == "pid_made" or "distance" in row]
    malicious = {int(r["client"]): bool(r["malicious"]) for r in rows}
    first_out: dict[int, int] = {}
    for row in rows:
        if row["excluded"]:
            first_out.setdefault(int(row["client"]), int(row["round"]))
    attackers = [c for c, bad in malicious.items() if bad]
    out: dict[str, Any] = {
        "attackers": len(attackers),
        "honest_banned": sum(1 for c in first_out if not malicious[c]),
        "attackers_banned": sum(1 for c in first_out if malicious[c]),
        f"attackers_banned_by_{CAUGHT_BY}": sum(
            1 for c in attackers if first_out.get(c, CAUGHT_BY + 1) <= CAUGHT_BY
        ),
    }
    for t in AUC_ROUNDS:
        scored = [r for r in rows if int(r["round"]) == t]
        labels = [bool(r["malicious"]) for r in scored]
        both = attackers and len(set(labels)) == 2
        out[f"auc_round_{t}"] = (
            float(roc_auc_score(labels, [float(r["score"]) for r in scored])) if both else None
        )
    return out


def run_ablation_cell(cell: Any) -> dict[str, Any]:
    """One run: its test metrics and what its exclusion test did."""
    import numpy as np

    from tasks.evaluation import trained_results

    dataset, _, variant = cell.method.partition(".")
    record: dict[str, Any] = {
        "name": cell.name, "method": cell.method, "dataset": dataset, "variant": variant,
        "attack": cell.attack, "fraction": cell.fraction, "seed": cell.seed,
    }  # fmt: skip
    started = time.perf_counter()
    try:
        federation, state, data = trained(cell)
        record["metrics"] = trained_results(federation, state, cell.params, data)
        record["detection"] = detection(state.trail)
        labels = np.asarray(data.test.labels).reshape(-1)
        record["majority_share"] = float(np.bincount(labels).max() / len(labels))
    except Exception as error:  # recorded, never dropped
        record["error"] = f"{type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc(limit=3)
    record["seconds"] = round(time.perf_counter() - started, 2)
    return record


def write_seed_rows(records: list[dict[str, Any]]) -> None:
    with STEM.with_name(f"{STEM.name}-seeds.csv").open("w", newline="") as out:
        writer = csv.DictWriter(out, SEED_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for r in sorted(
            records, key=lambda r: (r["dataset"], r["variant"], r["attack"], r["seed"])
        ):
            row = {k: r[k] for k in ("dataset", "variant", "attack", "seed")}
            if "error" in r:
                writer.writerow({**row, "error": r["error"]})
                continue
            metrics = r["metrics"]
            row |= {
                "test_acc": round(metrics["test_acc"], 6),
                "test_auc": round(metrics["test_auc"], 6),
                "majority_share": round(r["majority_share"], 6),
            }
            row |= {
                k: (round(v, 6) if isinstance(v, float) else v) for k, v in r["detection"].items()
            }
            writer.writerow(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["digits", "breastmnist"])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    cells_file = STEM.with_name(f"{STEM.name}-cells.jsonl")
    cells = [cell for dataset in args.datasets for cell in cells_for(dataset, args.seeds)]
    run_matrix(cells, cells_file, args.workers, runner=run_ablation_cell)
    write_seed_rows(list(finished(cells_file).values()))


if __name__ == "__main__":
    main()
