"""Benchmark: cross-device federations, fedsieve's engine against Flower's simulation
(CPU), a round's profile, and federations of 10,000 and 100,000 clients.

    python -m benchmarks.speed.cross_device [--rounds 100] [--skip-flower] [--skip-scale]
                                      [--device cpu|cuda]

1. FLUTE's LR-MNIST comparison shape (its README: Flower 30 min 14 s, FLUTE 3 min 20 s):
   MNIST-shaped data, 60,000 training and 10,000 test images of 28×28 grey in 10
   classes, synthetic because MNIST cannot be obtained on these machines, with
   overlapping classes so that the model learns over rounds (each class a smooth random
   pattern pulled towards the classes' mean, each image its class's pattern plus pixel
   noise, as uint8, seeded); 1,000 IID clients (60 images each), 10 sampled per round,
   100 rounds, multinomial logistic regression, one local epoch of plain SGD (lr 0.05,
   batch 10), FedAvg, the global model's test loss and accuracy after every round. Both
   sides start from the same initial weights, train the same sampled clients on the same
   batches (the engine's sampling and batch order) and read the same data file, so their
   accuracy per round agrees up to float rounding. Each side runs in its own process,
   timed from process start to exit and, inside, from the first round to the last:
   fedsieve's engine (``Federation`` with ``train.backend: auto``, which batches this
   convolution-free model on a CPU, and ``round_scores: accuracy``) and Flower 1.32's
   ``run_simulation`` with 1,000 supernodes on Ray, in its own environment
   (benchmarks/.venv-flower, made by ``python -m benchmarks.speed.flower_race --setup``).
2. A round's profile: the LR-MNIST run and ten rounds of the 10,000-client one under
   cProfile, the time split into sampling, data gathering (the batched backend's
   concatenation and batch schedule), local steps, aggregation, evaluation and the rest
   of the round (the trail, metrics, the next state), plus what precedes the rounds.
3. 10,000 clients holding 10 synthetic 28×28 grey images each (the same generator),
   100 sampled per round, 50 rounds, the small CNN, one local epoch (batch 10), FedAvg,
   test loss and accuracy on 2,000 images every round: wall time and the process's peak
   resident memory.
4. 100,000 clients of 10 images: the partition and one round of 100 clients (the same
   model, training and evaluation), wall time and peak resident memory.

Clients are views of one training tensor put in partition order (no copy per client);
in the runs of 10,000 and 100,000 clients that tensor holds the images as bytes and the
model's first layer scales them (``byte_images_model``), as a cross-device simulator
keeps many clients' data.
Writes ``benchmarks/results/cross-device-cpu.json`` (``--device cuda``: the engine on the
GPU, its backend batching every model there, Flower left out: its environment is made on
this machine; ``cross-device-cuda.json``).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import itertools
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
FLOWER_PYTHON = REPO / "benchmarks" / ".venv-flower" / "bin" / "python"
LR, BATCH = 0.05, 10
SEPARATION = 0.07  # class patterns' distance from their mean: small enough to overlap
TARGETS = {
    "lr_mnist_fedsieve_s": 2.0,
    "flower_over_fedsieve": 15,
    "ten_thousand_wall_s": 20,
    "ten_thousand_peak_gb": 4,
    "hundred_thousand_wall_s": 30,
    "hundred_thousand_peak_gb": 4,
}
# The profile's phases: which function's cumulative time each is (file, function name)
PHASES = {
    "sampling": ("federated/server.py", ("sample_clients",)),
    "data gathering": ("federated/batched.py", ("_chunk_data", "_schedule", "_to_device")),
    "local training": ("federated/server.py", ("_train_clients",)),
    "aggregation": ("federated/defence.py", ("aggregate",)),
    "evaluation": ("federated/scoring.py", ("scores",)),
    "round": ("federated/server.py", ("run_round",)),
}


def synthetic_digits(
    train: int,
    test: int,
    seed: int,
    *,
    classes: int = 10,
    noise: float = 60.0,
    separation: float = SEPARATION,
) -> dict[str, np.ndarray]:
    """MNIST-shaped arrays (MedMNIST's npz layout): each class a smooth random 28×28
    pattern moved to ``separation`` of its distance from the classes' mean (1: apart,
    small: overlapping), each image its class's pattern plus Gaussian pixel noise, uint8."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, size=(classes, 7, 7))
    coarse = coarse.mean(axis=0) + separation * (coarse - coarse.mean(axis=0))
    patterns = coarse.repeat(4, axis=1).repeat(4, axis=2)  # (classes, 28, 28)
    arrays = {}
    for split, count in (("train", train), ("test", test)):
        labels = rng.integers(0, classes, size=count)
        images = np.empty((count, 28, 28), dtype=np.uint8)
        for start in range(0, count, 50_000):  # float64 a chunk at a time
            rows = labels[start : start + 50_000]
            noisy = patterns[rows] + rng.normal(0, noise, size=(len(rows), 28, 28))
            images[start : start + len(rows)] = np.clip(noisy, 0, 255)
        arrays[f"{split}_images"] = images
        arrays[f"{split}_labels"] = labels.reshape(-1, 1).astype(np.uint8)
    return arrays


def byte_images_model(name: str) -> Any:
    """``name`` behind a first layer that turns uint8 images into floats in [-1, 1]
    (``(x/255 − 0.5)/0.5``), so a federation of many clients keeps its data as bytes: a
    quarter of the memory of float32 images, converted a batch at a time as clients train."""
    from torch import nn

    from models import build_model

    class ByteImages(nn.Module):
        def forward(self, x: Any) -> Any:
            return x.float().div(127.5).sub(1.0)

    return nn.Sequential(ByteImages(), build_model(name, in_channels=1, num_classes=10))


def normalised(images: np.ndarray, rows: np.ndarray | None = None, chunk: int = 65536) -> Any:
    """``images[rows]`` (uint8 ``(N, 28, 28)``) as float32 ``(N, 1, 28, 28)`` in [-1, 1],
    converted a chunk at a time so only the float copy is whole."""
    import torch

    rows = np.arange(len(images)) if rows is None else rows
    out = torch.empty((len(rows), 1, *images.shape[1:]), dtype=torch.float32)
    for start in range(0, len(rows), chunk):
        block = torch.from_numpy(images[rows[start : start + chunk]]).float()
        out[start : start + chunk, 0] = block.div_(127.5).sub_(1.0)  # (x/255 - 0.5)/0.5
    return out


@dataclass(frozen=True)
class Workload:
    """One run's shape: the data file, the federation's size, the model, where it runs."""

    data: str
    clients: int
    per_round: int
    rounds: int
    model: str
    as_bytes: bool = False  # uint8 images and :func:`byte_images_model`
    device: str = "cpu"


def build_federation(work: Workload) -> tuple[Any, float]:
    """The workload's federation (clients as views of one tensor in partition order) and
    the seconds its partition took."""
    import torch

    from aggregation import build_aggregator
    from federated.client import ClientData, LocalTraining
    from federated.partition import build_partitioner
    from federated.seeding import seeded_init
    from federated.server import Defence, EvaluationSets, Execution, Federation, FederationConfig
    from models import build_model

    def inputs(images: np.ndarray, rows: np.ndarray | None = None) -> Any:
        if not work.as_bytes:
            return normalised(images, rows)
        return torch.from_numpy(images if rows is None else images[rows]).unsqueeze(1)

    device = work.device
    with np.load(work.data) as arrays:
        train_images, train_labels = arrays["train_images"], arrays["train_labels"].reshape(-1)
        test = (inputs(arrays["test_images"]).to(device),
                torch.from_numpy(arrays["test_labels"].reshape(-1).astype(np.int64)).to(device))  # fmt: skip
    started = time.perf_counter()
    parts = build_partitioner("iid")(train_labels, work.clients, seed=0)
    partition_s = time.perf_counter() - started
    order = np.concatenate(parts)
    images = inputs(train_images, order).to(device)
    labels = torch.from_numpy(train_labels[order].astype(np.int64)).to(device)
    del train_images
    network = (
        (lambda: byte_images_model(work.model))
        if work.as_bytes
        else (lambda: build_model(work.model, in_channels=1, num_classes=10))
    )
    bounds = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).tolist()
    federation = Federation(
        model=seeded_init(0, network).to(device),
        clients=[
            ClientData(i, images[a:b], labels[a:b])
            for i, (a, b) in enumerate(itertools.pairwise(bounds))
        ],
        local=LocalTraining(epochs=1, lr=LR, momentum=0.0, batch_size=BATCH),
        config=FederationConfig(
            rounds=work.rounds,
            client_fraction=work.per_round / work.clients,
            seed=0,
            round_scores="accuracy",
        ),
        defence=Defence(rule=build_aggregator("fedavg")),
        evaluation=EvaluationSets(test=test),
        execution=Execution(backend="auto"),
    )
    return federation, partition_s


def engine_run(workload: dict[str, Any], threads: int) -> dict[str, Any]:
    """fedsieve's engine on the workload (a :class:`Workload`'s fields; run in a
    subprocess, prints JSON): accuracy per round, the seconds of the partition and of the
    rounds, peak resident memory. ``threads`` torch threads for the run only: a caller in
    this process keeps its own count."""
    import torch

    from federated.loop import train
    from tasks.grid import cell_threads

    work = Workload(**workload)
    accuracy: list[float] = []
    with cell_threads(threads):
        federation, partition_s = build_federation(work)
        started = time.perf_counter()
        train(
            federation, federation.initial_state(), work.rounds,
            on_round=lambda report, _state: accuracy.append(report.metrics["test_acc"]),
        )  # fmt: skip
    result = {
        "batched": federation.batched,
        "acc": accuracy,
        "partition_s": round(partition_s, 2),
        "rounds_s": round(time.perf_counter() - started, 2),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,  # kB
    }
    if work.device == "cuda":
        result["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 1024**3
    print(json.dumps(result))
    return result


def arithmetic_floor(threads: int, clients: int = 100, images: int = 10, test: int = 2000) -> dict:
    """The 10,000-client round's arithmetic and this machine's speed at it: the FLOPs of
    ``clients`` one-step trainings on ``images`` images (forward and backward) and of a
    ``test``-image scoring pass of the small CNN, counted by torch's ``FlopCounterMode``,
    and the best of 5 timed scoring passes; the round's floor is their quotient."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from federated.layout import use_fast_layout_
    from federated.metrics import logits_of
    from models import build_model

    torch.set_num_threads(threads)
    model = use_fast_layout_(build_model("small_cnn", in_channels=1, num_classes=10), "cpu")
    scoring = torch.randn(test, 1, 28, 28)
    with FlopCounterMode(display=False) as counter:
        logits_of(model, scoring)
    scoring_flops = counter.get_total_flops()
    batch, labels = torch.randn(images, 1, 28, 28), torch.randint(0, 10, (images,))
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model.train()(batch), labels).backward()
    step_flops = counter.get_total_flops()

    def best_of(work: Any, repeats: int) -> float:
        work()  # warm-up
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            work()
            timings.append(time.perf_counter() - started)
        return min(timings)

    scoring_s = best_of(lambda: logits_of(model, scoring), 5)
    weights = list(model.parameters())
    step_s = best_of(
        lambda: torch.autograd.grad(
            torch.nn.functional.cross_entropy(model.train()(batch), labels), weights
        ),
        50,
    )
    rate = scoring_flops / scoring_s
    round_flops = clients * step_flops + scoring_flops
    result = {
        "client_step_gflop": round(step_flops / 1e9, 3),
        "scoring_gflop": round(scoring_flops / 1e9, 2),
        "scoring_s": round(scoring_s, 3),
        "gflop_per_s": round(rate / 1e9, 1),
        "round_floor_s": round(round_flops / rate, 3),
        "client_step_s": round(step_s, 4),
        "client_step_gflop_per_s": round(step_flops / step_s / 1e9, 1),
        "round_client_by_client_s": round(clients * step_s + scoring_s, 3),
    }
    print(json.dumps(result))
    return result


def profile_breakdown(workload: dict[str, Any], threads: int) -> dict[str, Any]:
    """:func:`engine_run` under cProfile, its time split into the round's phases (cProfile
    slows Python-heavy code more than arithmetic, so the shares are approximate)."""
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.runcall(engine_run, workload, threads)
    wall = time.perf_counter() - started
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    seconds = dict.fromkeys(PHASES, 0.0)
    for (path, _line, name), (_calls, _prim, _tottime, cumtime, _callers) in stats.items():
        for phase, (suffix, names) in PHASES.items():
            if path.endswith(suffix) and name in names:
                seconds[phase] += cumtime
    seconds["local steps"] = seconds.pop("local training") - seconds["data gathering"]
    round_total = seconds.pop("round")
    phases = ["sampling", "data gathering", "local steps", "aggregation", "evaluation"]
    seconds["rest of the round"] = round_total - sum(seconds[p] for p in phases)
    seconds["before the rounds"] = wall - round_total
    result = {
        "profiled_s": round(wall, 2),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "share": {k: round(v / wall, 3) for k, v in seconds.items()},
    }
    print(json.dumps(result))
    return result


def timed_process(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall seconds and stdout of ``command``."""
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return seconds, done.stdout


def engine_process(function: str, *args: Any) -> tuple[float, dict[str, Any]]:
    """``function(*args)`` of this module in a fresh process: its wall seconds from start
    to exit and the JSON it printed last."""
    code = f"from benchmarks.speed.cross_device import {function}; {function}(*{args!r})"
    wall, stdout = timed_process([sys.executable, "-c", code])
    return wall, json.loads(stdout.strip().splitlines()[-1])


def lr_mnist(args: argparse.Namespace, data: Path, tmp: Path) -> dict[str, Any]:
    work = Workload(str(data), 1000, 10, args.rounds, "logreg", device=args.device)
    wall, engine = engine_process("engine_run", asdict(work), args.threads)
    result: dict[str, Any] = {
        "fedsieve_s": round(wall, 2),
        "fedsieve_rounds_s": engine["rounds_s"],
        "fedsieve_batched": engine["batched"],
        "fedsieve_acc": engine["acc"],
    }
    print(f"fedsieve: {wall:.1f} s ({engine['rounds_s']} s of rounds), "
          f"final accuracy {engine['acc'][-1]:.4f}", flush=True)  # fmt: skip
    if args.skip_flower or args.device == "cuda":  # Flower's environment is this machine's
        return result
    if not FLOWER_PYTHON.exists():
        raise SystemExit(
            "no Flower environment: run `python -m benchmarks.speed.flower_race --setup` first"
        )
    out = tmp / "flower.json"
    command = [str(FLOWER_PYTHON), "benchmarks/flower/launch.py", "cross-device", "--data", str(data),
               "--out", str(out), "--rounds", str(args.rounds), "--threads", str(args.threads),
               "--batch", str(BATCH), "--lr", str(LR)]  # fmt: skip
    wall, _ = timed_process(command)
    rounds = sorted(json.loads(out.read_text())["rounds"], key=lambda r: r["round"])
    flower_acc = [row["acc"] for row in rounds if row["round"] > 0]
    flower_rounds_s = rounds[-1]["time"] - rounds[0]["time"]  # the initial evaluation to the last
    print(f"flower: {wall:.1f} s ({flower_rounds_s:.1f} s of rounds), "
          f"final accuracy {flower_acc[-1]:.4f}", flush=True)  # fmt: skip
    return result | {
        "flower_s": round(wall, 2),
        "flower_rounds_s": round(flower_rounds_s, 2),
        "flower_acc": flower_acc,
        "flower_over_fedsieve": round(wall / result["fedsieve_s"], 1),
        "flower_over_fedsieve_rounds": round(flower_rounds_s / engine["rounds_s"], 1),
        "max_abs_acc_difference": max(
            abs(a - b) for a, b in zip(flower_acc, engine["acc"], strict=True)
        ),
    }


def scale_run(work: Workload, threads: int) -> dict:
    wall, engine = engine_process("engine_run", asdict(work), threads)
    print(f"{work.clients:,} clients, {work.rounds} rounds: {wall:.1f} s, "
          f"peak RSS {engine['peak_rss_gb']:.2f} GB", flush=True)  # fmt: skip
    return {
        "wall_s": round(wall, 1),
        "partition_s": engine["partition_s"],
        "rounds_s": engine["rounds_s"],
        "peak_rss_gb": round(engine["peak_rss_gb"], 2),
        "batched": engine["batched"],
        "acc": engine["acc"],
    } | ({"peak_gpu_gb": round(engine["peak_gpu_gb"], 2)} if "peak_gpu_gb" in engine else {})


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-flower", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args(argv)
    import torch

    from benchmarks.common import cpu_environment, versions

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no CUDA device")
    environment = cpu_environment()
    if args.device == "cuda":
        environment = {
            "device": {"kind": "cuda", "name": torch.cuda.get_device_name(0),
                       "cpu_count": os.cpu_count()},
            "versions": versions(cuda=torch.version.cuda),
        }  # fmt: skip

    report: dict[str, Any] = {
        "benchmark": "cross_device",
        "command": " ".join(["python -m benchmarks.speed.cross_device", *(argv or sys.argv[1:])]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **environment,
        "lr_mnist_settings": {"train": 60_000, "test": 10_000, "clients": 1000, "per_round": 10,
                              "rounds": args.rounds, "model": "logreg", "local_epochs": 1,
                              "lr": LR, "batch": BATCH, "momentum": 0.0, "threads": args.threads,
                              "round_scores": "accuracy",
                              "data": f"synthetic MNIST-shaped, class separation {SEPARATION}, "
                                      "noise 60, seed 0"},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="cross-device-") as name:
        tmp = Path(name)
        lr_data = tmp / "lr-mnist.npz"
        np.savez(lr_data, **synthetic_digits(60_000, 10_000, seed=0))
        report["lr_mnist"] = lr_mnist(args, lr_data, tmp)
        # cProfile sees a GPU's kernels only where the host waits for them: CPU runs only
        profiled = args.device == "cpu"
        if profiled:
            work = Workload(str(lr_data), 1000, 10, args.rounds, "logreg")
            report["profile"] = {
                "lr_mnist": engine_process("profile_breakdown", asdict(work), args.threads)[1]
            }
        if not args.skip_scale:
            scale_data = tmp / "scale.npz"
            np.savez(scale_data, **synthetic_digits(100_000, 2_000, seed=1, separation=0.25))
            if profiled:
                work = Workload(str(scale_data), 10_000, 100, 10, "small_cnn", as_bytes=True)
                report["profile"]["ten_thousand_10_rounds"] = engine_process(
                    "profile_breakdown", asdict(work), args.threads
                )[1]
            report["ten_thousand_clients"] = scale_run(
                Workload(str(scale_data), 10_000, 100, 50, "small_cnn", True, args.device),
                args.threads,
            )
            if args.device == "cpu":  # what 50 such rounds cost in arithmetic alone here
                floor = engine_process("arithmetic_floor", args.threads)[1]
                floor["fifty_rounds_floor_s"] = round(50 * floor["round_floor_s"], 1)
                floor["fifty_rounds_client_by_client_s"] = round(
                    50 * floor["round_client_by_client_s"], 1
                )
                report["ten_thousand_clients"]["floor"] = floor
            scale_data.unlink()
            huge_data = tmp / "huge.npz"
            np.savez(huge_data, **synthetic_digits(1_000_000, 2_000, seed=2, separation=0.25))
            report["hundred_thousand_clients"] = scale_run(
                Workload(str(huge_data), 100_000, 100, 1, "small_cnn", True, args.device),
                args.threads,
            )
    report["targets"] = TARGETS
    out = RESULTS / f"cross-device-{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
