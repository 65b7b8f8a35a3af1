"""Benchmark: whole federated rounds, sequential vs batched client training (not a test).

    python -m benchmarks.speed.round_speed [--device cpu|cuda] [--quick] [--threads N]
                                     [--channels-last] [--skip-memory]

Workload (issue 8): a BloodMNIST-sized set of 12,000 synthetic 3x28x28 images in 8
classes (class prototypes plus noise, so training means something), split IID over 50
clients; one local epoch of SGD (lr 0.01, momentum 0.9, batch 32), FedAvg, evaluation on
3,421 test images. A round is one ``Federation.run_round`` (train, screen, aggregate,
evaluate), timed after a warm-up round, median of ``--repeats`` rounds that all start
from the same state.

1. small_cnn: a sequential round vs a batched round (target on an H100: >= 8x).
2. ResNet-18 (BatchNorm): a batched round vs one centralized epoch over the same images
   (plain torch SGD, batch 32) (target: the round within 1.15x of the epoch).
3. On CUDA only: the peak memory of a 100-client ResNet-18 batched round with the chunk
   size sized to a 16 GB budget (target: fits in 16 GB).

``--channels-last`` builds every model with channels-last convolution weights. The engine
does that itself on a CPU (:mod:`federated.layout`) and leaves CUDA models contiguous;
on CUDA the flag measures whether it should. ``--skip-memory`` leaves out part 3.

Peak memory: ``torch.cuda.max_memory_allocated`` on GPU; on CPU the peak resident set
size above the level before the phase, sampled every 5 ms (tracemalloc does not see
torch's allocator). ``--quick`` shrinks the workload (fewer images and clients) so a
loaded 2-core CPU finishes in a few minutes; its numbers are not the issue's targets.
Writes ``benchmarks/results/round-speed-<device>[-quick].json`` with device, versions,
date and the load average before and after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aggregation import build_aggregator
from benchmarks.common import cpu_model, versions
from federated.batched import auto_max_parallel
from federated.client import ClientData, LocalTraining
from federated.seeding import seeded_init, torch_generator
from federated.server import (
    Defence,
    EvaluationSets,
    Execution,
    Federation,
    FederationConfig,
    ServerState,
)
from models import build_model

CLASSES, SHAPE = 8, (3, 28, 28)
LOCAL = LocalTraining(epochs=1, lr=0.01, momentum=0.9, batch_size=32)


def synthetic_images(n: int, seed: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """``n`` images ``(n, 3, 28, 28)`` and labels ``(n,)``: a fixed prototype per class
    plus unit noise."""
    generator = torch_generator(seed)
    prototypes = torch.randn(CLASSES, *SHAPE, generator=torch_generator(12345))
    labels = torch.randint(0, CLASSES, (n,), generator=generator)
    images = prototypes[labels] + torch.randn(n, *SHAPE, generator=generator)
    return images.to(device), labels.to(device)


def iid_clients(images: Tensor, labels: Tensor, n_clients: int, seed: int) -> list[ClientData]:
    order = torch.randperm(len(labels), generator=torch_generator(seed)).to(images.device)
    return [
        ClientData(i, images[part], labels[part])
        for i, part in enumerate(order.tensor_split(n_clients))
    ]


def synthetic_federation(
    n_images: int, n_clients: int, n_test: int, device: torch.device
) -> tuple[Tensor, Tensor, list[ClientData], tuple[Tensor, Tensor]]:
    """Training images and labels, their IID split over clients, and a test set."""
    images, labels = synthetic_images(n_images, seed=1, device=device)
    test = synthetic_images(n_test, seed=2, device=device)
    return images, labels, iid_clients(images, labels, n_clients, seed=3), test


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def peak_memory(device: torch.device) -> Iterator[dict[str, float]]:
    """Peak bytes allocated during the block (GPU), or peak RSS above the start (CPU)."""
    out: dict[str, float] = {}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        yield out
        torch.cuda.synchronize(device)
        out["peak_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        out["allocated_before_gb"] = before / 1e9
        return
    start, peak, stop = _rss_bytes(), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            stop.wait(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield out
    finally:
        stop.set()
        sampler.join()
        peak[0] = max(peak[0], _rss_bytes())
        out["rss_before_gb"] = start / 1e9
        out["rss_peak_above_before_gb"] = (peak[0] - start) / 1e9


def time_rounds(
    federation: Federation, state: ServerState, repeats: int, warmup: bool
) -> tuple[list[float], ServerState]:
    """Seconds of ``repeats`` rounds, each from ``state``; the last resulting state."""
    if warmup:
        federation.run_round(state)
    seconds, result = [], state
    for _ in range(repeats):
        _sync(federation.device)
        start = time.perf_counter()
        result, _ = federation.run_round(state)
        _sync(federation.device)
        seconds.append(time.perf_counter() - start)
    return seconds, result


def centralized_epoch(
    build: Callable[[], torch.nn.Module], images: Tensor, labels: Tensor, seed: int
) -> float:
    """Seconds for one epoch of plain torch SGD (the same LocalTraining) over all images."""
    model = seeded_init(seed, build).to(images.device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LOCAL.lr, momentum=LOCAL.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    order = torch.randperm(len(labels), generator=torch_generator(seed)).to(images.device)
    _sync(images.device)
    start = time.perf_counter()
    for index in order.split(LOCAL.batch_size):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(images[index]), labels[index]).backward()
        optimizer.step()
    _sync(images.device)
    return time.perf_counter() - start


def federation(
    build: Callable[[], torch.nn.Module],
    clients: list[ClientData],
    test: tuple[Tensor, Tensor],
    backend: str,
    max_parallel: int | None = None,
) -> Federation:
    device = test[0].device
    return Federation(
        model=seeded_init(0, build).to(device),
        clients=clients,
        local=LOCAL,
        config=FederationConfig(rounds=1, seed=0),
        defence=Defence(rule=build_aggregator("fedavg")),
        evaluation=EvaluationSets(test=test),
        execution=Execution(backend=backend, max_parallel=max_parallel),  # type: ignore[arg-type]
    )


def _summary(seconds: list[float]) -> dict[str, Any]:
    return {
        "median_s": round(statistics.median(seconds), 3),
        "all_s": [round(s, 3) for s in seconds],
    }


@dataclass(frozen=True)
class _Run:
    """One benchmark run's settings, from the command line."""

    device: torch.device
    quick: bool  # the small workload
    repeats: int  # timed rounds (or epochs) per measurement
    warmup: bool  # an untimed round (or epoch) first
    channels_last: bool  # models with channels-last convolution weights

    def builder(self, name: str) -> Callable[[], torch.nn.Module]:
        """Builds the registered model ``name`` for the workload, in the run's layout."""

        def build() -> torch.nn.Module:
            model = build_model(name, in_channels=3, num_classes=CLASSES)
            return model.to(memory_format=torch.channels_last) if self.channels_last else model

        return build


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--quick", action="store_true", help="a small workload for a busy CPU")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--channels-last", action="store_true", help="channels-last models")
    parser.add_argument("--skip-memory", action="store_true", help="leave out part 3 (CUDA)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no CUDA device")
    return args


def _header(run: _Run, argv: list[str] | None) -> dict[str, Any]:
    """The report's description of the run: command, date, device, versions, settings."""
    device = run.device
    load_before = os.getloadavg()
    return {
        "benchmark": "round_speed",
        "command": " ".join(["python -m benchmarks.speed.round_speed", *(argv or sys.argv[1:])]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": {
            "kind": device.type,
            "name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model(),
            "nproc": len(os.sched_getaffinity(0)),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
        },
        "versions": versions(cuda=torch.version.cuda),
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_fp32_precision": torch.get_float32_matmul_precision(),
        "model_layout": "channels_last" if run.channels_last else "default",
        "quick": run.quick,
        "repeats": run.repeats,
        "warmup_round": run.warmup,
        "local": {"epochs": LOCAL.epochs, "lr": LOCAL.lr, "momentum": LOCAL.momentum,
                  "batch_size": LOCAL.batch_size},
        "load_avg_before": [round(x, 2) for x in load_before],
    }  # fmt: skip


def small_cnn_round(run: _Run) -> dict[str, Any]:
    """Part 1: a small_cnn round, sequential vs batched."""
    # (images, clients, test images); --quick keeps ~1-2 minutes a part on 2 cores
    n_images, n_clients, n_test = (3_200, 50, 1_000) if run.quick else (12_000, 50, 3_421)
    _, _, clients, test = synthetic_federation(n_images, n_clients, n_test, run.device)
    cnn = run.builder("small_cnn")
    part: dict[str, Any] = {"images": n_images, "clients": n_clients, "test_images": n_test}
    finals = {}
    start = federation(cnn, clients, test, "sequential").initial_state().global_vector
    for backend in ("sequential", "batched"):
        fed = federation(cnn, clients, test, backend)
        state = fed.initial_state()
        with peak_memory(run.device) as memory:
            seconds, finals[backend] = time_rounds(fed, state, run.repeats, run.warmup)
        part[backend] = {**_summary(seconds), "memory": memory}
        print(f"small_cnn {backend}: round {part[backend]['median_s']:.2f} s", flush=True)
    moved = (finals["sequential"].global_vector - start).norm()
    part["batched_speedup"] = round(part["sequential"]["median_s"] / part["batched"]["median_s"], 2)
    part["global_update_relative_difference"] = float(
        (finals["batched"].global_vector - finals["sequential"].global_vector).norm() / moved
    )
    part["test_acc"] = {b: finals[b].history[-1]["test_acc"] for b in finals}
    part["target_speedup_h100"] = 8.0
    return part


def resnet18_round_vs_centralized_epoch(run: _Run) -> dict[str, Any]:
    """Part 2: a batched ResNet-18 round vs one centralized epoch over the same images."""
    n_images, n_clients, n_test = (192, 6, 200) if run.quick else (12_000, 50, 3_421)
    images, labels, clients, test = synthetic_federation(n_images, n_clients, n_test, run.device)
    resnet = run.builder("resnet18")
    part = {"images": n_images, "clients": n_clients, "test_images": n_test, "norm": "batch"}
    fed = federation(resnet, clients, test, "batched")
    part["max_parallel"] = auto_max_parallel(fed.model, images, LOCAL.batch_size)
    with peak_memory(run.device) as memory:
        seconds, _ = time_rounds(fed, fed.initial_state(), run.repeats, run.warmup)
    part["batched_round"] = {**_summary(seconds), "memory": memory}
    print(f"resnet18 batched: round {part['batched_round']['median_s']:.2f} s", flush=True)
    if run.warmup:
        centralized_epoch(resnet, images, labels, seed=0)
    with peak_memory(run.device) as memory:
        epochs = [centralized_epoch(resnet, images, labels, seed=0) for _ in range(run.repeats)]
    part["centralized_epoch"] = {**_summary(epochs), "memory": memory}
    print(f"resnet18 centralized epoch: {part['centralized_epoch']['median_s']:.2f} s", flush=True)
    part["round_over_epoch"] = round(
        part["batched_round"]["median_s"] / part["centralized_epoch"]["median_s"], 3
    )
    part["target_round_over_epoch"] = 1.15
    return part


def resnet18_100_clients_memory(run: _Run) -> dict[str, Any]:
    """Part 3 (CUDA): 100 ResNet-18 clients, batched, chunked to a 16 GB budget."""
    device = run.device
    resnet = run.builder("resnet18")
    images, _, clients, test = synthetic_federation(12_000, 100, 3_421, device)
    model = seeded_init(0, resnet).to(device)
    d = sum(v.numel() for v in model.state_dict().values() if v.is_floating_point())
    deltas_gb = 100 * d * 4 / 1e9
    # two copies of the deltas exist at once (the chunks' and the server's stack)
    chunk_budget = int(16e9 - 2 * 100 * d * 4 - 1e9)
    max_parallel = auto_max_parallel(
        model, images, LOCAL.batch_size, budget_fraction=1.0, budget_bytes=chunk_budget
    )
    fed = federation(resnet, clients, test, "batched", max_parallel=max_parallel)
    del model
    torch.cuda.empty_cache()
    with peak_memory(device) as memory:
        seconds, _ = time_rounds(fed, fed.initial_state(), 1, warmup=False)
    return {
        "clients": 100,
        "max_parallel": max_parallel,
        "round_s": round(seconds[0], 3),
        "deltas_gb": round(deltas_gb, 2),
        "memory": memory,
        "fits_16gb": memory["peak_allocated_gb"] <= 16.0,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _arguments(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    run = _Run(
        device=device,
        quick=args.quick,
        repeats=args.repeats or (1 if args.quick else 3),
        warmup=device.type == "cuda" or not args.quick,
        channels_last=args.channels_last,
    )
    suffix = ("-quick" if run.quick else "") + ("-channels-last" if run.channels_last else "")
    out = args.out or Path(f"benchmarks/results/round-speed-{device.type}{suffix}.json")

    report = _header(run, argv)
    report["small_cnn_round"] = small_cnn_round(run)
    report["resnet18_round_vs_centralized_epoch"] = resnet18_round_vs_centralized_epoch(run)
    if device.type == "cuda" and not args.skip_memory:
        report["resnet18_100_clients_memory"] = resnet18_100_clients_memory(run)
    else:
        report["resnet18_100_clients_memory"] = (
            "not measured: needs --device cuda (and no --skip-memory)"
        )

    report["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
