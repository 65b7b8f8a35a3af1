"""Benchmark: what client-level DP (DP-FedAvg) costs, and how the sites fare, over seeds.

    python -m benchmarks.robustness.privacy [--seeds 5] [--models small_cnn logreg]
        [--noise 0.1 0.3 1.0 3.0] [--workers 2]

The default pipeline (params.yaml: BreastMNIST, 10 clients all sampled every round, 20
rounds, 20 % of every client's images held out as its own test split) without DP and with
central DP-FedAvg (clip 1.0) at each noise multiplier, per model, ``--seeds`` seeds each.
Every cell is the engine's federation as ``fedsieve train`` builds it
(:func:`tasks.training.federation_from_params`), stopped by the same budget check, in a
worker process of one torch thread. Reported per setting, as mean ± 95 % t-interval over
seeds (:func:`tasks.comparison.shown_over_seeds`): ε at δ = 1e-5 after the run (Opacus's
RDP accountant), test ACC and AUC, the worst site's ACC and the spread of the sites' ACC.
Writes ``benchmarks/results/privacy-breastmnist.{json,md}``.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import cpu_environment, write_summary
from fedsieve.arguments import positive_int

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
METRICS = {
    "privacy_epsilon": "ε (δ = 1e-5)",
    "test_acc": "test ACC",
    "test_auc": "test AUC",
    "site_acc_worst": "worst-site ACC",
    "site_acc_std": "site ACC std",
}


def cell_params(model: str, noise: float | None, seed: int) -> Any:
    """params.yaml with the model, the seed and (unless ``noise`` is None) central DP."""
    from config.params import load_params, validate_params

    raw = load_params(REPO / "params.yaml").model_dump(mode="json")
    raw["seed"], raw["model"] = seed, {"name": model}
    if noise is not None:
        raw["privacy"] |= {"mode": "central", "clip": 1.0, "noise_multiplier": noise}
    return validate_params(raw, "benchmarks.robustness.privacy")


def run_cell(model: str, noise: float | None, seed: int) -> dict[str, Any]:
    """One training run through the engine; its final numbers."""
    import torch

    from federated.data import ensure_medmnist, load_medmnist
    from federated.loop import train
    from tasks.data import data_root
    from tasks.evaluation import trained_results
    from tasks.partition import split_partition
    from tasks.training import federation_from_params

    torch.set_num_threads(1)
    params = cell_params(model, noise, seed)
    started = time.perf_counter()
    root = data_root(params.data.root, REPO)
    ensure_medmnist(params.data.dataset, root, download=params.data.download, progress=False)
    data = load_medmnist(params.data.dataset, root)
    scheme = params.partition
    parts = split_partition(
        data.train.targets, scheme.scheme, scheme.num_clients, seed,
        scheme.partitioner_params(), scheme.root_size, scheme.local_test,
    )  # fmt: skip
    federation = federation_from_params(
        params, data, parts.clients, parts.root, parts.local_tests, validation_every_round=False
    )
    state = train(federation, federation.initial_state(), params.train.rounds)
    metrics = trained_results(federation, state, params, data, parts.held_local_tests)
    return {
        "model": model, "noise_multiplier": noise, "seed": seed,
        "metrics": {key: metrics.get(key) for key in METRICS},
        "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip


def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from tasks.comparison import shown_over_seeds

    rows = []
    for key in dict.fromkeys((r["model"], r["noise_multiplier"]) for r in records):
        members = [r for r in records if (r["model"], r["noise_multiplier"]) == key]
        rows.append({
            "model": key[0], "noise_multiplier": key[1], "seeds": [r["seed"] for r in members],
            **{
                name: shown_over_seeds([r["metrics"][name] for r in members])
                for name in METRICS
            },
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=5)
    parser.add_argument("--models", nargs="+", default=["small_cnn", "logreg"])
    parser.add_argument("--noise", nargs="+", type=float, default=[0.1, 0.3, 1.0, 3.0])
    parser.add_argument("--workers", type=positive_int, default=2)
    args = parser.parse_args(argv)
    settings = [(m, z) for m in args.models for z in [None, *args.noise]]
    jobs = [(m, z, seed) for m, z in settings for seed in range(args.seeds)]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        records = list(pool.map(run_cell, *zip(*jobs, strict=True)))
    rows = summarise(records)
    lines = [
        "| model | noise multiplier | " + " | ".join(METRICS.values()) + " |",
        "|---|---|" + "---|" * len(METRICS),
    ]
    for row in rows:
        noise = "off" if row["noise_multiplier"] is None else f"{row['noise_multiplier']:g}"
        values = " | ".join(row[name] for name in METRICS)
        lines.append(f"| {row['model']} | {noise} | {values} |")
    write_summary(
        RESULTS / "privacy-breastmnist",
        {"environment": cpu_environment(), "summary": rows, "cells": records},
        lines,
    )


if __name__ == "__main__":
    main()
