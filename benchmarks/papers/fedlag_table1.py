"""Benchmark: the FedLag paper's Table 1, tested. Its row "Robust to non-IID data" rates
FedAvg "No", FedProx and FedNova "Moderate", SCAFFOLD, AFL and FedLag "Strong"; the paper
runs no experiment behind the ratings (``../shared/papers/fedlag.txt``, section 5.1).

Eight methods (:data:`METHODS`: the five the paper compares, FedLag, FedAdam and the
coordinate-wise median as a robust reference) on BreastMNIST, RetinaMNIST and digits, in
four regimes (:data:`REGIMES`: label skew at Dirichlet α 0.1 and 0.5, quantity skew with
heterogeneous local work, IID), 10 clients, the logistic model, plain local SGD (momentum
0, SCAFFOLD's option II assumes it, so every method trains the same way), seeds 0-9. Then
the attacked part (:data:`ATTACKED`): at Dirichlet α 0.5, two of the ten clients sign
flipping or running ALIE, against the same methods and three robust rules with FedAdam on
top (median, FedLag, PID-MADE in front of the mean), and every one of them without attack
(the eight methods' runs at α 0.5 are the clean part's, run once and shared). Per
run: final test accuracy and AUC, the worst site's accuracy on its own held-out fifth, and
the round the test accuracy first reached the dataset's target (:data:`TARGETS`).

Its claims were written before it ran (benchmarks/preregistered.yaml, families
``table1-*``); docs/results.md's tables and claims are recomputed from the per-run records.

    python -m benchmarks.papers.fedlag_table1 [--parts clean attacked] [--seeds 10] [--workers 1]

Records: ``benchmarks/results/fedlag-table1-cells.jsonl`` (local; a rerun skips finished
runs), and per part one row per run (committed): ``fedlag-table1-seeds.csv`` (clean) and
``fedlag-table1-attacked-seeds.csv`` (attacked: every run at α 0.5, with or without attack,
so that its claims rest on a file of their own).
"""

from __future__ import annotations

import argparse
import csv
import time
import traceback
from pathlib import Path
from typing import Any

import yaml

from benchmarks.robustness.matrix import (
    ATTACKS,
    PARAMS,
    REPO,
    RESULTS,
    exposure,
    finished,
    run_matrix,
    trained,
)
from fedsieve.arguments import positive_int

DATASETS = ("breastmnist", "retinamnist", "digits")
CLIENTS = 10
ROUNDS = 10
LOCAL_TEST = 0.2  # each site's held-out fifth: the worst site's accuracy is read on it
# the test accuracy each dataset's rounds-to-target counts to (eval.target_acc)
TARGETS = {"breastmnist": 0.8, "retinamnist": 0.45, "digits": 0.9}
REGIMES: dict[str, dict[str, Any]] = {  # regime -> its partition and train changes
    "dirichlet-0.1": {"partition": {"scheme": "dirichlet", "alpha": 0.1}},
    "dirichlet-0.5": {"partition": {"scheme": "dirichlet", "alpha": 0.5}},
    # client sizes log-normal (σ 1), each client's epochs drawn from 1-3 per round
    "quantity": {
        "partition": {"scheme": "quantity", "sigma": 1.0},
        "train": {"local_work": {"epochs": [1, 3]}},
    },
    "iid": {"partition": {"scheme": "iid"}},
}
FEDADAM = {"server_optimizer": {"name": "adam"}}  # Reddi et al.'s update and defaults
METHODS: dict[str, dict[str, Any]] = {  # name -> its compare-grid entry
    "fedavg": {},
    "fedprox": {"train": {"prox_mu": 0.01}},
    "scaffold": {"train": {"scaffold": True}},
    "fednova": {"aggregate": {"name": "fednova"}},
    "afl": {"aggregate": {"name": "afl"}},
    "fedadam": {"train": FEDADAM},
    "fedlag": {"aggregate": {"name": "fedlag"}},
    "median": {"aggregate": {"name": "median"}},
}
ROBUST_FEDADAM: dict[str, dict[str, Any]] = {
    "median_fedadam": {"aggregate": {"name": "median"}, "train": FEDADAM},
    "fedlag_fedadam": {"aggregate": {"name": "fedlag"}, "train": FEDADAM},
    "pid_made_fedadam": {"filters": [{"name": "pid_made"}], "train": FEDADAM},
}
ATTACKED_REGIME = "dirichlet-0.5"
ATTACKED = ("sign_flip", "alie")
FRACTION = 0.2
SEED_COLUMNS = ("dataset", "regime", "method", "attack", "fraction", "seed", "test_acc",
                "test_auc", "site_acc_worst", "rounds_to_target", "rounds", "majority_share", "seconds",
                "error")  # fmt: skip
RECORD = RESULTS / "fedlag-table1-seeds.csv"
ATTACKED_RECORD = RESULTS / "fedlag-table1-attacked-seeds.csv"
RECORDS = {"clean": RECORD, "attacked": ATTACKED_RECORD}  # part -> its per-run record


def base_params(dataset: str, regime: str) -> dict[str, Any]:
    """The robustness matrix's logistic settings at :data:`CLIENTS` clients in ``regime``,
    plain local SGD, each site's held-out fifth scored at the end."""
    base = yaml.safe_load((PARAMS / "robustness-digits.yaml").read_text())
    base["data"]["dataset"] = dataset
    base["partition"] = {"num_clients": CLIENTS, "min_samples": 2, "root_size": 0,
                         "local_test": LOCAL_TEST} | REGIMES[regime]["partition"]  # fmt: skip
    base["train"] |= {"rounds": ROUNDS, "momentum": 0.0, **REGIMES[regime].get("train", {})}
    # the sites' splits scored at the last round only (every round, they cost most of a run)
    base["eval"] = {"target_acc": TARGETS[dataset], "every": ROUNDS}
    return base


def cells_for(part: str, seeds: range, datasets: tuple[str, ...] = DATASETS) -> list[Any]:
    """The part's cells (``clean``: every method in every regime; ``attacked``: at
    :data:`ATTACKED_REGIME`, every method and the robust rules with FedAdam under each
    attack and without attack, the methods' runs without attack being the clean part's).
    A cell's method is ``<dataset>.<regime>.<method>``."""
    from config.params import Params
    from tasks.grid import grid_cells

    plans: list[tuple[str, dict[str, Any], list[str]]] = (
        [(regime, METHODS, ["none"]) for regime in REGIMES]
        if part == "clean"
        else [
            (ATTACKED_REGIME, METHODS | ROBUST_FEDADAM, ["none", *ATTACKED]),
        ]
    )
    cells = []
    for dataset in datasets:
        for regime, methods, attacks in plans:
            grid = {
                "methods": {f"{dataset}.{regime}.{name}": spec for name, spec in methods.items()},
                "attacks": [{"name": a, **ATTACKS[a]} for a in attacks],
                "fractions": [FRACTION],
                "seeds": list(seeds),
            }
            config = base_params(dataset, regime) | {"compare": grid}
            cells += grid_cells(Params.model_validate(config), REPO)
    return cells


def coordinates(cell: Any) -> tuple[str, str, str]:
    """A cell's dataset, regime and method (a regime's name may hold a dot)."""
    dataset, rest = cell.method.split(".", 1)
    regime, method = rest.rsplit(".", 1)
    return dataset, regime, method


RATED = ("fedavg", "fedprox", "scaffold", "afl", "fednova", "fedlag")  # the paper's Table 1


def priority(cell: Any) -> int:
    """Run order on a busy machine, each seed whole within a step: what the clean part's
    registered claims pair (the rated methods at α 0.1 and IID; FedNova and FedAvg under
    quantity skew) first, then the rest of those regimes, then α 0.5 with what the
    attacked part's claims pair (every method without attack and under attack), then
    the runs only its tables show (the median alone under attack, the robust rules with
    FedAdam without attack)."""
    _, regime, method = coordinates(cell)
    if regime == ATTACKED_REGIME:
        attacked = cell.attack != "none"
        tables_only = (method == "median" and attacked) or (
            method in ROBUST_FEDADAM and not attacked
        )
        return 3 if tables_only else 2
    paired = method in RATED if regime != "quantity" else method in ("fedavg", "fednova")
    return 0 if paired else 1


def run_table_cell(cell: Any) -> dict[str, Any]:
    """One run: its final test scores, its worst site and its rounds to target."""
    from tasks.evaluation import trained_results
    from tasks.grid import partition_key, partitions_for

    dataset, regime, method = coordinates(cell)
    record: dict[str, Any] = {
        "name": cell.name, "dataset": dataset, "regime": regime, "method": method,
        "attack": cell.attack, "fraction": cell.fraction, "seed": cell.seed,
    }  # fmt: skip
    started = time.perf_counter()
    try:
        federation, state, data = trained(cell)
        local_tests = partitions_for.fn([cell], data)[partition_key(cell.params)][2]
        metrics = trained_results(federation, state, cell.params, data, local_tests)
        record |= {k: metrics[k] for k in ("test_acc", "test_auc", "site_acc_worst",
                                           "rounds_to_target", "rounds")}  # fmt: skip
        record["majority_share"] = exposure(cell, data)["majority_share"]
        record["metrics"] = {"test_acc": metrics["test_acc"]}  # what the runner prints
    except Exception as error:  # recorded, never dropped: the claims score it at chance
        record["error"] = f"{type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc(limit=3)
    record["seconds"] = round(time.perf_counter() - started, 2)
    return record


def in_part(record: dict[str, Any], part: str) -> bool:
    """Whether a run belongs to ``part``'s record: ``clean``, the eight methods without
    attack in every regime; ``attacked``, every run at :data:`ATTACKED_REGIME`."""
    if part == "clean":
        return record["attack"] == "none" and record["method"] in METHODS
    return record["regime"] == ATTACKED_REGIME


def write_seed_rows(records: list[dict[str, Any]], path: Path = RECORD) -> None:
    """Every run, one row, in grid order (dataset, regime, method, attack, seed)."""
    names = [*METHODS, *ROBUST_FEDADAM]
    order = ["none", *ATTACKED]

    def key(r: dict[str, Any]) -> tuple[int, int, int, int, int]:
        return (DATASETS.index(r["dataset"]), list(REGIMES).index(r["regime"]),
                names.index(r["method"]), order.index(r["attack"]), int(r["seed"]))  # fmt: skip

    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, SEED_COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for record in sorted(records, key=key):
            row = {k: record.get(k) for k in SEED_COLUMNS}
            row["error"] = (
                (record.get("error") or "").splitlines()[0] if record.get("error") else ""
            )
            for k in ("test_acc", "test_auc", "site_acc_worst", "majority_share"):
                row[k] = "" if row[k] is None else round(float(row[k]), 4)
            writer.writerow(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=("clean", "attacked"),
                        default=["clean", "attacked"])  # fmt: skip
    parser.add_argument("--seeds", type=positive_int, default=10)
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument("--workers", type=positive_int, default=1)
    args = parser.parse_args()
    cells_file = RESULTS / "fedlag-table1-cells.jsonl"
    for part in args.parts:
        cells = cells_for(part, range(args.seeds), tuple(args.datasets))
        cells.sort(key=lambda cell: (priority(cell), cell.seed))
        run_matrix(cells, cells_file, args.workers, runner=run_table_cell)
    done = list(finished(cells_file).values())
    for part in args.parts:
        write_seed_rows([r for r in done if in_part(r, part)], RECORDS[part])
        print(f"wrote {RECORDS[part]}")


if __name__ == "__main__":
    main()
