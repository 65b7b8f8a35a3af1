"""Benchmark: how the CV of client losses (EMA's non-IID check) moves with the number and
size of clients, on the trained model as the paper measures it, over seeds.

For BreastMNIST and digits, partitioned IID and Dirichlet α in {1, 0.5, 0.1} over 5, 10,
20 and 50 clients: train ``--rounds`` FedAvg rounds (logistic model, the pipeline's
params otherwise), then the CV of the trained model's losses on every client, with MSE
(the paper's) and cross-entropy, per seed. The summary gives the mean and 95 % interval
over seeds and the share of seeds called non-IID at the paper's threshold 0.25: an IID
row's CV is what a threshold must stay above for that client count and size.

    python -m benchmarks.papers.noniid_cv [--rounds 10] [--seeds 5]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from config.params import load_params
from federated.data import ensure_medmnist, load_medmnist
from federated.loop import train
from federated.partition import PartitionError, build_partitioner
from fedsieve.arguments import positive_int
from tasks.comparison import interval
from tasks.data import data_root
from tasks.training import build_federation

RESULTS = Path(__file__).parents[1] / "results"
REPO = Path(__file__).resolve().parents[2]
PARTITIONS = [("iid", None), ("dirichlet", 1.0), ("dirichlet", 0.5), ("dirichlet", 0.1)]
CLIENTS = [5, 10, 20, 50]
THRESHOLD = 0.25


def measure(dataset: str, scheme: str, alpha: float | None, clients: int, seed: int,
            rounds: int) -> dict:  # fmt: skip
    """One federation's trained-model CVs (both losses), or why its partition was refused."""
    overrides = [
        f"seed={seed}", f"data.dataset={dataset}", f"partition.scheme={scheme}",
        f"partition.num_clients={clients}", "partition.min_samples=2", "model.name=logreg",
        f"train.rounds={rounds}", "train.device=cpu", "noniid.every=0",
    ]  # fmt: skip
    if alpha is not None:
        overrides.append(f"partition.alpha={alpha}")
    params = load_params(REPO / "params.yaml", overrides)
    root = data_root(params.data.root, REPO)
    ensure_medmnist(dataset, root, download=params.data.download, progress=False)
    data = load_medmnist(dataset, root)
    row = {"dataset": dataset, "partition": scheme if alpha is None else f"dirichlet a={alpha:g}",
           "clients": clients, "seed": seed}  # fmt: skip
    try:
        parts = build_partitioner(scheme, **params.partition.partitioner_params())(
            data.train.targets, clients, seed=seed
        )
    except PartitionError as error:
        return row | {"refused": str(error)}
    federation = build_federation.fn(params, data, parts)
    state = train(federation, federation.initial_state(), rounds)
    model = federation.global_model(state)
    sizes = [len(c) for c in federation.clients]
    row["median_client_size"] = sorted(sizes)[len(sizes) // 2]
    for loss in ("mse", "cross_entropy"):
        row[f"cv_{loss}"] = federation.scorer.trained_model_noniid(model, loss, THRESHOLD).cv
    return row


def summarise(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["dataset"], row["partition"], row["clients"]), []).append(row)
    out = []
    for (dataset, partition, clients), group in groups.items():
        done = [r for r in group if "refused" not in r]
        entry = {"dataset": dataset, "partition": partition, "clients": clients,
                 "seeds": len(done), "refused": len(group) - len(done)}  # fmt: skip
        if done:
            entry["median_client_size"] = sorted(r["median_client_size"] for r in done)[
                len(done) // 2
            ]
            for loss in ("mse", "cross_entropy"):
                values = [r[f"cv_{loss}"] for r in done]
                mean, _, ci95 = interval(values)
                entry[f"cv_{loss}_mean"], entry[f"cv_{loss}_ci95"] = mean, ci95
                entry[f"cv_{loss}_max"] = max(values)
                entry[f"non_iid_share_{loss}"] = sum(v > THRESHOLD for v in values) / len(values)
        out.append(entry)
    return out


def markdown(summary: list[dict]) -> str:
    lines = [
        "| dataset | partition | clients | median client size | CV (MSE) | CV (cross-entropy) "
        "| seeds non-IID at 0.25 (MSE) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        if not s["seeds"]:
            lines.append(f"| {s['dataset']} | {s['partition']} | {s['clients']} | refused "
                         "(a client under 2 images) | | | |")  # fmt: skip
            continue
        ci = {loss: s[f"cv_{loss}_ci95"] for loss in ("mse", "cross_entropy")}
        lines.append(
            f"| {s['dataset']} | {s['partition']} | {s['clients']} | {s['median_client_size']} "
            f"| {s['cv_mse_mean']:.3f} ± {ci['mse']:.3f} "
            f"| {s['cv_cross_entropy_mean']:.3f} ± {ci['cross_entropy']:.3f} "
            f"| {round(s['non_iid_share_mse'] * s['seeds'])}/{s['seeds']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seeds", type=positive_int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    rows = []
    for dataset in ("breastmnist", "digits"):
        for scheme, alpha in PARTITIONS:
            for clients in CLIENTS:
                for seed in range(args.seeds):
                    row = measure(dataset, scheme, alpha, clients, seed, args.rounds)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    summary = summarise(rows)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "noniid-cv.md").write_text(markdown(summary))
    payload = {
        "command": "python -m benchmarks.papers.noniid_cv",
        "rounds": args.rounds, "seeds": args.seeds, "model": "logreg", "threshold": THRESHOLD,
        "seconds": round(time.perf_counter() - started, 1), "summary": summary, "runs": rows,
    }  # fmt: skip
    (RESULTS / "noniid-cv.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(markdown(summary))


if __name__ == "__main__":
    main()
