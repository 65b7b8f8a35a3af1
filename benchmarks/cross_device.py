"""Benchmark: cross-device federations, fedsieve's engine against Flower's simulation
(CPU), and a 10,000-client federation of the small CNN.

    python -m benchmarks.cross_device [--rounds 100] [--skip-flower] [--skip-scale]

1. FLUTE's LR-MNIST comparison shape (its README: Flower 30 min 14 s, FLUTE 3 min 20 s):
   MNIST-shaped data, 60,000 training and 10,000 test images of 28×28 grey in 10
   classes, synthetic because MNIST cannot be obtained on these machines (each class a
   fixed random smooth pattern, each image its class's pattern plus pixel noise, as
   uint8, seeded); 1,000 IID clients (60 images each), 10 sampled per round, 100 rounds,
   multinomial logistic regression, one local epoch of plain SGD (lr 0.05, batch 10),
   FedAvg, the global model evaluated on the test split after every round. Both sides
   start from the same initial weights, train the same sampled clients on the same
   batches (the engine's sampling and batch order) and read the same data file, so
   their accuracy per round agrees up to float rounding. Each side runs in its own
   process, timed from process start to exit: fedsieve's engine (``Federation`` with
   ``train.backend: auto``, which batches this convolution-free model on a CPU) and
   Flower 1.32's ``run_simulation`` with 1,000 supernodes on Ray, in its own
   environment (benchmarks/.venv-flower, made by ``benchmarks.flower_race``).
2. 10,000 clients holding 10 synthetic 28×28 grey images each (a class pattern plus
   noise, 10 classes), 100 sampled per round, 50 rounds, the small CNN, one local epoch
   (batch 10), FedAvg, evaluation on 2,000 test images every round: wall time and the
   process's peak resident memory.

Writes ``benchmarks/results/cross-device-cpu.json`` with ``flower_s``, ``fedsieve_s``,
``flower_over_fedsieve`` (target >= 50), the accuracies per round of both sides, and the
10,000-client run's ``wall_s`` and ``peak_rss_gb`` (targets: 600 s and 4 GB).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "cross-device-cpu.json"
FLOWER_PYTHON = REPO / "benchmarks" / ".venv-flower" / "bin" / "python"
LR, BATCH = 0.05, 10


def synthetic_digits(
    train: int, test: int, seed: int, *, classes: int = 10, noise: float = 60.0
) -> dict[str, np.ndarray]:
    """MNIST-shaped arrays (MedMNIST's npz layout): each class a smooth random 28×28
    pattern, each image its class's pattern plus Gaussian pixel noise, as uint8."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, size=(classes, 7, 7))
    patterns = coarse.repeat(4, axis=1).repeat(4, axis=2)  # (classes, 28, 28)
    arrays = {}
    for split, count in (("train", train), ("test", test)):
        labels = rng.integers(0, classes, size=count)
        images = patterns[labels] + rng.normal(0, noise, size=(count, 28, 28))
        arrays[f"{split}_images"] = np.clip(images, 0, 255).astype(np.uint8)
        arrays[f"{split}_labels"] = labels.reshape(-1, 1).astype(np.uint8)
    return arrays


def engine_run(
    data: str, clients: int, per_round: int, rounds: int, model: str, threads: int
) -> None:
    """fedsieve's engine on the workload (run in a subprocess; prints JSON)."""
    import torch

    from aggregation import build_aggregator
    from federated.client import ClientData, LocalTraining
    from federated.loop import train
    from federated.partition import build_partitioner
    from federated.seeding import seeded_init
    from federated.server import Defence, EvaluationSets, Execution, Federation, FederationConfig
    from models import build_model

    torch.set_num_threads(threads)
    with np.load(data) as arrays:
        split = {k: torch.from_numpy(arrays[k]) for k in arrays.files}
    images = (split["train_images"].float().unsqueeze(1) / 255.0 - 0.5) / 0.5
    labels = split["train_labels"].reshape(-1).long()
    test = ((split["test_images"].float().unsqueeze(1) / 255.0 - 0.5) / 0.5,
            split["test_labels"].reshape(-1).long())  # fmt: skip
    parts = build_partitioner("iid")(labels.numpy(), clients, seed=0)
    federation = Federation(
        model=seeded_init(0, lambda: build_model(model, in_channels=1, num_classes=10)),
        clients=[ClientData(i, images[p], labels[p]) for i, p in enumerate(parts)],
        local=LocalTraining(epochs=1, lr=LR, momentum=0.0, batch_size=BATCH),
        config=FederationConfig(rounds=rounds, client_fraction=per_round / clients, seed=0),
        defence=Defence(rule=build_aggregator("fedavg")),
        evaluation=EvaluationSets(test=test),
        execution=Execution(backend="auto"),
    )
    accuracy: list[float] = []
    train(
        federation, federation.initial_state(), rounds,
        on_round=lambda report, _state: accuracy.append(report.metrics["test_acc"]),
    )  # fmt: skip
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # ru_maxrss is in kB
    print(json.dumps({"batched": federation.batched, "acc": accuracy, "peak_rss_gb": peak_gb}))


def timed_process(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall seconds and stdout of ``command``."""
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return seconds, done.stdout


def engine_command(*args: Any) -> list[str]:
    code = f"from benchmarks.cross_device import engine_run; engine_run(*{args!r})"
    return [sys.executable, "-c", code]


def lr_mnist(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    data = tmp / "lr-mnist.npz"
    np.savez(data, **synthetic_digits(60_000, 10_000, seed=0))
    wall, stdout = timed_process(
        engine_command(str(data), 1000, 10, args.rounds, "logreg", args.threads)
    )
    engine = json.loads(stdout.strip().splitlines()[-1])
    result: dict[str, Any] = {"fedsieve_s": round(wall, 2), "fedsieve_batched": engine["batched"],
                              "fedsieve_acc": engine["acc"]}  # fmt: skip
    print(f"fedsieve engine: {wall:.1f} s, final accuracy {engine['acc'][-1]:.4f}", flush=True)
    if args.skip_flower:
        return result
    if not FLOWER_PYTHON.exists():
        raise SystemExit(
            "no Flower environment: run `python -m benchmarks.flower_race --setup` first"
        )
    out = tmp / "flower.json"
    command = [str(FLOWER_PYTHON), "benchmarks/flower/run_cross_device.py", "--data", str(data),
               "--out", str(out), "--rounds", str(args.rounds), "--threads", str(args.threads),
               "--batch", str(BATCH), "--lr", str(LR)]  # fmt: skip
    wall, _ = timed_process(command)
    flower = json.loads(out.read_text())
    flower_acc = [
        row["acc"] for row in sorted(flower["rounds"], key=lambda r: r["round"]) if row["round"] > 0
    ]
    print(f"flower: {wall:.1f} s, final accuracy {flower_acc[-1]:.4f}", flush=True)
    return result | {
        "flower_s": round(wall, 2),
        "flower_acc": flower_acc,
        "flower_over_fedsieve": round(wall / result["fedsieve_s"], 1),
        "max_abs_acc_difference": max(
            abs(a - b) for a, b in zip(flower_acc, engine["acc"], strict=True)
        ),
    }


def ten_thousand_clients(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    data = tmp / "scale.npz"
    np.savez(data, **synthetic_digits(100_000, 2_000, seed=1))
    wall, stdout = timed_process(
        engine_command(str(data), 10_000, 100, 50, "small_cnn", args.threads)
    )
    engine = json.loads(stdout.strip().splitlines()[-1])
    peak_gb = engine["peak_rss_gb"]
    print(f"10,000 clients: {wall:.1f} s, peak RSS {peak_gb:.2f} GB", flush=True)
    return {"wall_s": round(wall, 1), "peak_rss_gb": round(peak_gb, 2),
            "batched": engine["batched"], "final_acc": engine["acc"][-1], "acc": engine["acc"]}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-flower", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    args = parser.parse_args(argv)
    from benchmarks.common import cpu_environment

    report: dict[str, Any] = {
        "benchmark": "cross_device",
        "command": " ".join(["python -m benchmarks.cross_device", *(argv or sys.argv[1:])]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **cpu_environment(),
        "lr_mnist_settings": {"train": 60_000, "test": 10_000, "clients": 1000, "per_round": 10,
                              "rounds": args.rounds, "model": "logreg", "local_epochs": 1,
                              "lr": LR, "batch": BATCH, "momentum": 0.0, "threads": args.threads,
                              "data": "synthetic MNIST-shaped (class patterns + noise), seed 0"},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="cross-device-") as tmp:
        report["lr_mnist"] = lr_mnist(args, Path(tmp))
        if not args.skip_scale:
            report["ten_thousand_clients"] = ten_thousand_clients(args, Path(tmp))
    report["targets"] = {
        "flower_over_fedsieve": 50,
        "ten_thousand_wall_s": 600,
        "ten_thousand_peak_gb": 4,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
