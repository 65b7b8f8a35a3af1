"""Benchmark: PID-MADE's exclusion test, ablated (issue 32, item 7; issue 44).

Seven ways to turn a round's distances into exclusions, every one excluding for good
(Algorithm 1), before FedAvg. Each pins its whole configuration (:data:`VARIANTS`), so a
change of a filter's defaults cannot change what a row's name means:

- ``paper_gaussian``: the paper's PID-MADE, mean + z(1 − α)·std of the PID scores
  (Theorem 6; ``pid_made``'s defaults but one: every PID-MADE variant here leaves a
  banned client's update out of the centroid and the threshold's statistics,
  ``banned_updates: left_out``, the reading the records were made with, where the
  default is now the paper's "all submitted models", ``counted``);
- ``paper_chebyshev``: the same with Chebyshev's k = √(1/α − 1) (Theorem 5);
- ``pid_robust_spent``: the PID score against median + k·1.4826·MAD, α split over the
  clients and spent over rounds (k grows every round);
- ``pid_robust_fixed``: the same robust threshold with α/m in every round;
- ``pid_cusum``: Page's CUSUM of each client's robust z-score of its PID score;
- ``distance_cusum``: Page's CUSUM of the robust z-score of the distance alone (not
  PID-MADE: no gain enters it);
- ``distance_cusum_cut``: the same with the round cut at 11 robust deviations
  (``pid_made``'s default before issue 44);
- ``distance_cusum_drift4``: the distance CUSUM with drift 4, h 8, the setting the
  recorded search's stated rule picks on seeds 0–9 (drift 3 and h 8 were picked before
  the search was recorded), judged here on the held-out seeds.

The CUSUMs' drift 3 and h 8 were chosen on seeds 0–9 (:data:`TUNED_ON`); the search over
drift and h is recorded by ``python -m benchmarks.papers.pid_made_ablation --search`` in
``pid-made-cusum-search.csv`` (the distance CUSUM on a grid of drift and h, seeds 0–9
only). Seeds 10–19 are held out: the tables report them apart, and the paired
comparisons of thresholds (exact McNemar tests per seed) use them alone.

Settings: the robustness matrix's (``benchmarks/params/robustness-<dataset>.yaml``: 20
IID clients, the logistic model, 20 rounds of two local epochs; no server-held slice),
with no attack and with 4 of 20 clients flipping every label. Per run: honest clients
ever banned, attackers banned by round 5, and the per-client detection ROC-AUC of the
rule's own score in rounds 1, 5 and 20 (attackers as positives, every client scored,
the banned included): how well the score ranks attackers above honest clients whatever
the threshold.

    python -m benchmarks.papers.pid_made_ablation [--datasets digits breastmnist] [--seeds 20]
    python -m benchmarks.papers.pid_made_ablation --search

Records: ``benchmarks/results/pid-made-ablation-cells.jsonl`` (local; a rerun skips
finished runs) and ``pid-made-ablation-seeds.csv`` (committed: one row per run; the
search: ``pid-made-cusum-search-cells.jsonl`` and ``pid-made-cusum-search.csv``), from
which ``python -m benchmarks.evidence.report`` builds docs/results.md's tables.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
import traceback
from typing import Any

import yaml

from benchmarks.robustness.filters import VARIANTS
from benchmarks.robustness.matrix import PARAMS, REPO, RESULTS, finished, run_matrix, trained
from fedsieve.arguments import positive_int

SEARCH_DRIFTS = (1.0, 2.0, 3.0, 4.0)
SEARCH_HS = (4.0, 8.0, 12.0, 16.0)
SEARCH = {
    f"drift{drift:g}_h{h:g}": {"name": "distance_cusum", "exclusion": "permanent",
                               "drift": drift, "h": h}
    for drift in SEARCH_DRIFTS for h in SEARCH_HS
}  # fmt: skip
TUNED_ON = range(10)  # the seeds the CUSUMs' drift and h were chosen on
AUC_ROUNDS = (1, 5, 20)
CAUGHT_BY = 5
STEM = RESULTS / "pid-made-ablation"
SEARCH_STEM = RESULTS / "pid-made-cusum-search"
SEED_COLUMNS = [
    "dataset", "variant", "attack", "seed", "test_acc", "test_auc", "majority_share",
    "attackers", "honest_banned", "attackers_banned", f"attackers_banned_by_{CAUGHT_BY}",
    *(f"auc_round_{t}" for t in AUC_ROUNDS), "error",
]  # fmt: skip


def cells_for(
    dataset: str, seeds: range, variants: dict[str, dict[str, Any]] = VARIANTS
) -> list[Any]:
    from config.params import Params
    from tasks.grid import grid_cells

    base = yaml.safe_load((PARAMS / f"robustness-{dataset}.yaml").read_text())
    base["partition"]["root_size"] = 0  # no rule here needs a server-held slice
    grid = {
        "methods": {
            f"{dataset}.{name}": {"aggregate": {"name": "fedavg"}, "filters": [spec]}
            for name, spec in variants.items()
        },
        "attacks": [{"name": "none"}, {"name": "label_flip", "rate": 1.0, "mapping": "reverse"}],
        "fractions": [0.2],
        "seeds": list(seeds),
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


def write_seed_rows(records: list[dict[str, Any]], path: Any) -> None:
    with path.open("w", newline="") as out:
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
    parser.add_argument("--seeds", type=positive_int, default=20)
    parser.add_argument(
        "--search",
        action="store_true",
        help="the drift/h search of the distance CUSUM, seeds 0-9 only",
    )
    parser.add_argument("--workers", type=positive_int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    stem, variants, seeds = STEM, VARIANTS, range(args.seeds)
    if args.search:
        stem, variants, seeds = SEARCH_STEM, SEARCH, TUNED_ON
    cells_file = stem.with_name(f"{stem.name}-cells.jsonl")
    cells = [cell for dataset in args.datasets for cell in cells_for(dataset, seeds, variants)]
    run_matrix(cells, cells_file, args.workers, runner=run_ablation_cell)
    out = stem.with_name(f"{stem.name}-seeds.csv" if stem == STEM else f"{stem.name}.csv")
    write_seed_rows(list(finished(cells_file).values()), out)


if __name__ == "__main__":
    main()
