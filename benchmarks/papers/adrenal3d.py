"""Benchmark: AdrenalMNIST3D at 64 voxels, the 3-D models centralised and federated, beside
MedMNIST v2's published 3-D baselines.

    python -m benchmarks.papers.adrenal3d [--rounds 8] [--seed 0]
        [--setups centralised iid dirichlet-0.5]

The small 3-D CNN (``small_cnn3d``) trains on the official AdrenalMNIST3D-64 file (1,188
training volumes; scored on its 298 test volumes) through the engine's round loop in
three setups: one client holding every training volume (centralised: a round is one
epoch), 10 IID clients and 10 label-skewed clients (Dirichlet α = 0.5), FedAvg, every
client every round, one local epoch of batch 32 (SGD, lr 0.05, momentum 0.9, weight decay
1e-4), one seed. Per setup: the final test ACC and AUC and the seconds of each round
(training and the round's test scoring, one torch thread).

ResNet-18 3D (``resnet18_3d``, MedMNIST v2's 3-D baseline: a stride-1 stem, no
max-pool, so its first stage runs at 64³) is timed, not trained: one SGD step and one
scoring pass on real volumes give its seconds per volume, and from them the seconds a
round over the whole training split and the test split would take; on the shared CPU
this was made for that is hours a round, so no round was run (docs/results.md says so).
The small CNN is timed the same way, beside it.

Writes ``benchmarks/results/adrenalmnist3d-cpu.{json,md}``; docs/results.md's block is
generated from the JSON (``python -m benchmarks.evidence.report``), beside MedMNIST v2's
published numbers, cited (:mod:`benchmarks.evidence.tables.volumes`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import cpu_environment
from benchmarks.robustness.matrix import cells_for, dataset_root, one_torch_thread
from fedsieve.arguments import positive_int

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
RECORD = RESULTS / "adrenalmnist3d-cpu"
SETUPS: dict[str, dict[str, Any]] = {
    "centralised": {"scheme": "iid", "num_clients": 1},
    "iid": {"scheme": "iid", "num_clients": 10},
    "dirichlet-0.5": {"scheme": "dirichlet", "num_clients": 10, "alpha": 0.5},
}
TIMED_MODELS = ("small_cnn3d", "resnet18_3d")
TIMING_BATCH = 2  # volumes in the timed step: ResNet-18 3D takes minutes a volume pair here
BASE: dict[str, Any] = {
    "seed": 0,
    "data": {"dataset": "adrenalmnist3d", "size": 64, "root": "data/medmnist", "download": True},
    "partition": {"min_samples": 8},
    "model": {"name": "small_cnn3d"},
    "train": {
        "local_epochs": 1, "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0001,
        "batch_size": 32, "device": "cpu", "backend": "sequential",
    },
    "noniid": {"every": 0},
    "eval": {"target_acc": 0.8},
    "tracking": {"register_model": False},
}  # fmt: skip


def run_setup(setup: str, rounds: int, seed: int, data: Any) -> dict[str, Any]:
    """One setup trained through the engine: final test scores and seconds per round."""
    from federated.loop import train
    from tasks.evaluation import trained_results
    from tasks.grid import partition_key, partitions_for
    from tasks.training import federation_from_params

    base = {**BASE, "partition": {**BASE["partition"], **SETUPS[setup]}}
    base["train"] = {**BASE["train"], "rounds": rounds}
    cell = cells_for(base, ["fedavg"], ["none"], [0.2], seed + 1)[seed]
    params = cell.params
    clients, root, local_tests = partitions_for.fn([cell], data)[partition_key(params)]
    federation = federation_from_params(
        params, data, clients, root, local_tests, validation_every_round=False
    )
    ends = [time.perf_counter()]

    def on_round(report: Any, state: Any) -> None:
        ends.append(time.perf_counter())
        print(f"{setup} round {state.round}: test acc {state.history[-1]['test_acc']:.3f}")

    state = train(federation, federation.initial_state(), rounds, on_round=on_round)
    metrics = trained_results(federation, state, params, data)
    seconds = [round(b - a, 2) for a, b in itertools.pairwise(ends)]
    return {
        "setup": setup,
        "clients": params.partition.num_clients,
        "partition": SETUPS[setup],
        "rounds": state.round,
        "seed": seed,
        "test_acc": round(metrics["test_acc"], 4),
        "test_auc": round(metrics["test_auc"], 4),
        "acc_curve": [round(row["test_acc"], 4) for row in state.history],
        "round_seconds": seconds,
    }


def step_cost(model_name: str, data: Any) -> dict[str, Any]:
    """Seconds per volume of one SGD step (forward, backward, update) and of one scoring
    pass, on ``TIMING_BATCH`` real training volumes, one thread; and the seconds a round
    over every training volume plus the test split's scoring would take at those rates."""
    import torch

    from federated.data import to_tensors
    from models.registry import build_model

    images, labels = to_tensors(data.train, data.info)
    images, labels = images[:TIMING_BATCH], labels[:TIMING_BATCH]
    model = build_model(model_name, in_channels=1, num_classes=2, image_size=64)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    started = time.perf_counter()
    optimiser.zero_grad()
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    optimiser.step()
    train_per_volume = (time.perf_counter() - started) / TIMING_BATCH
    model.eval()
    with torch.no_grad():
        started = time.perf_counter()
        model(images)
        score_per_volume = (time.perf_counter() - started) / TIMING_BATCH
    n_train, n_test = len(data.train), len(data.test)
    cost = {
        "model": model_name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": TIMING_BATCH,
        "train_seconds_per_volume": round(train_per_volume, 4),
        "score_seconds_per_volume": round(score_per_volume, 4),
        "round_seconds_estimate": round(n_train * train_per_volume + n_test * score_per_volume),
    }
    print(cost)
    return cost


def main() -> None:
    from config.params import Params
    from federated.data import load_medmnist

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=positive_int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--setups", nargs="+", choices=list(SETUPS), default=list(SETUPS))
    args = parser.parse_args()
    one_torch_thread()
    data_params = Params.model_validate(BASE).data
    data = load_medmnist("adrenalmnist3d", dataset_root(data_params), 64)
    timing = [step_cost(name, data) for name in TIMED_MODELS]
    runs = [run_setup(setup, args.rounds, args.seed, data) for setup in args.setups]
    command = "python -m benchmarks.papers.adrenal3d" + (
        f" --rounds {args.rounds}" if args.rounds != 8 else ""
    )
    payload = {
        "benchmark": "adrenalmnist3d",
        "command": command,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": cpu_environment(),
        "settings": {"model": "small_cnn3d", **BASE["train"], "rounds": args.rounds},
        "data": {"train": len(data.train), "val": len(data.val), "test": len(data.test)},
        "runs": runs,
        "timing": timing,
    }
    RECORD.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [
        "# AdrenalMNIST3D-64: the 3-D models", "", f"Command: `{command}`", "",
        "| model | setup | clients | rounds | test ACC | test AUC | seconds a round (mean) |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for run in runs:
        mean = sum(run["round_seconds"]) / len(run["round_seconds"])
        lines.append(
            f"| small_cnn3d | {run['setup']} | {run['clients']} | {run['rounds']} "
            f"| {run['test_acc']:.3f} | {run['test_auc']:.3f} | {mean:.1f} |"
        )
    lines += ["", "Timed steps (one thread):", "", "```", yaml.safe_dump(timing), "```", ""]
    RECORD.with_suffix(".md").write_text("\n".join(lines))
    print(f"wrote {RECORD}.json and .md")


if __name__ == "__main__":
    main()
