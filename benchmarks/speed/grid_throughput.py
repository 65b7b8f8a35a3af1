"""Benchmark: how many robustness-grid cells an hour, against the engine alone and the
machine's compute floor (CPU).

    python -m benchmarks.speed.grid_throughput [--seeds 2] [--max-parallel 2] [--without fedlag]

The cells are the BreastMNIST fidelity grid (``benchmarks/params/fidelity-breastmnist.yaml``:
20 IID clients, 4 label flippers, 30 rounds of 2 local epochs at batch 8, the small CNN,
ten methods) with ``--seeds`` seeds each, less the methods named by ``--without``
(default: FedLag, whose exact rule alone costs several times a cell's training at these
sizes on a CPU; every method's cell time is measured and reported apart). Measured, each
in fresh processes timed from start to exit:

1. the grid through ``fedsieve compare`` (its own Prefect server, MLflow child runs,
   summary and figures), ``--max-parallel`` cells at once with the default threads;
2. the same cells through the engine alone (``Federation.run_round`` in a thread pool of
   the same size, one torch pool of cores / max_parallel threads), nothing written;
3. the compute floor: the cells' training images (clients' images × local epochs ×
   rounds) over the best images per second that local training alone reached here
   (``train_client`` on the cells' clients, 1 or 2 workers × 1 or 2 threads);
4. where one cell's time goes beside training (the engine's own steps, and the grid
   cell's MLflow calls and reports), and the threads-per-cell choice (the engine-only
   grid at 1 × 2, 2 × 1 and 1 × 1 cells × threads);
5. the client-training backends on this CPU at the batch sizes and client counts grids
   and cross-device runs use, for ``train.backend: auto``.

Writes ``benchmarks/results/grid-throughput-cpu.json`` with ``cells``, ``grid_wall_s``,
``engine_only_s``, ``grid_over_engine`` (target <= 1.3), ``cells_per_hour`` (target >= 520)
and the floor.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fedsieve.arguments import positive_int

REPO = Path(__file__).resolve().parents[2]
PARAMS = REPO / "benchmarks" / "params" / "fidelity-breastmnist.yaml"
OUT = REPO / "benchmarks" / "results" / "grid-throughput-cpu.json"


def data_root() -> Path:
    return Path(os.environ.get("MEDMNIST_ROOT") or REPO.parent / "shared" / "data" / "medmnist")


WITHOUT: list[str] = []  # methods left out of the measured grid (set from --without)


def overrides(seeds: int, max_parallel: int, threads: int | None = None) -> list[str]:
    import yaml

    methods = yaml.safe_load(PARAMS.read_text())["compare"]["methods"]
    kept = {name: spec for name, spec in methods.items() if name not in WITHOUT}
    grid = [
        f"compare.seeds={list(range(seeds))}",
        f"compare.max_parallel={max_parallel}",
        f"compare.methods={json.dumps(kept)}",
    ]
    if threads is not None:
        grid.append(f"compare.threads_per_cell={threads}")
    return [*grid, "tracking.experiment=grid-throughput", "train.device=cpu"]


def grid_cells_of(seeds: int, max_parallel: int) -> list[Any]:
    from config.params import load_params
    from tasks.grid import grid_cells

    return grid_cells(load_params(PARAMS, overrides(seeds, max_parallel)), REPO)


def engine_only(seeds: int, max_parallel: int, threads: int, without: list[str]) -> None:
    """The grid's cells through the engine alone (run in a subprocess; prints JSON)."""
    import torch

    WITHOUT[:] = without
    from federated.data import load_medmnist
    from federated.loop import train as run_rounds
    from tasks.grid import partition_key, partitions_for
    from tasks.training import federation_from_params

    torch.set_num_threads(threads)
    cells = grid_cells_of(seeds, max_parallel)
    data = load_medmnist("breastmnist", data_root())
    parts = partitions_for.fn(cells, data)

    def train(cell: Any) -> float:
        started = time.perf_counter()
        params = cell.params
        clients, root, _ = parts[partition_key(params)]
        federation = federation_from_params(
            params, data, clients, root, validation_every_round=False
        )
        run_rounds(federation, federation.initial_state(), params.train.rounds)
        return time.perf_counter() - started

    with ThreadPoolExecutor(max_workers=max_parallel) as pool:
        seconds = list(pool.map(train, cells))
    cell_s = {cell.name: round(s, 2) for cell, s in zip(cells, seconds, strict=True)}
    print(json.dumps({"cells": len(cells), "cell_s": cell_s}))


def local_training_rate(workers: int, threads: int, steps: int = 3) -> None:
    """Images per second of local training alone on the fidelity cell's clients (run in a
    subprocess; prints JSON)."""
    import torch

    from federated.client import LocalTraining, train_client
    from federated.data import load_medmnist
    from federated.metrics import loss_function
    from federated.vectors import model_to_vector
    from tasks.grid import partition_key, partitions_for
    from tasks.training import federation_from_params

    torch.set_num_threads(threads)
    [cell] = grid_cells_of(1, 1)[:1]
    data = load_medmnist("breastmnist", data_root())
    parts, _ = partitions_for.fn([cell], data)[partition_key(cell.params)]
    train = cell.params.train
    local = LocalTraining(
        epochs=train.local_epochs, lr=train.lr, momentum=train.momentum,
        weight_decay=train.weight_decay, batch_size=train.batch_size,
    )  # fmt: skip

    def one_worker(_: int) -> int:
        federation = federation_from_params(cell.params, data, parts)
        start = model_to_vector(federation.model)
        images = 0
        for _ in range(steps):
            for client in federation.clients:
                train_client(federation.model, start, client, local, loss_function(False), seed=0)
                images += len(client) * local.epochs
        return images

    one_worker(0)  # warm-up
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        images = sum(pool.map(one_worker, range(workers)))
    seconds = time.perf_counter() - started
    print(json.dumps({"images_per_s": round(images / seconds, 1)}))


def cell_profile() -> None:
    """Where one fidelity cell's time goes (run in a subprocess; prints JSON): each engine
    step of a round, and the grid cell's MLflow calls and reports."""
    import torch

    from federated.data import load_medmnist
    from federated.defence import RoundDefence
    from federated.noniid_screen import NonIIDScreen
    from federated.scoring import RoundScorer
    from federated.server import Federation
    from tasks.grid import partition_key, partitions_for, run_grid_cell

    torch.set_num_threads(1)
    [cell] = [c for c in grid_cells_of(1, 1) if c.method == "fedavg"]
    data = load_medmnist("breastmnist", data_root())
    parts = partitions_for.fn([cell], data)[partition_key(cell.params)]
    spent: dict[str, float] = {}
    steps = {  # the round's parts, each timed where it runs
        "training": (Federation, "_train_clients"),
        "noniid_screen": (NonIIDScreen, "screen"),
        "attack_filters_aggregation": (RoundDefence, "aggregate"),
        "per_round_evaluation": (RoundScorer, "round_metrics"),
    }
    for label, (part, name) in steps.items():
        original = getattr(part, name)

        def timed(*args: Any, _original: Any = original, _label: str = label, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.perf_counter() - started

        setattr(part, name, timed)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        from tasks.tracking import Tracker

        Tracker("warm-up").start(run_id=None, run_name="warm-up", tags={})  # the store exists
        started = time.perf_counter()
        run_grid_cell.fn(cell, data, parts, Path(tmp) / "cell", None)
        total = time.perf_counter() - started
    engine = sum(spent.values())
    spent = {k: round(v, 3) for k, v in spent.items()}
    print(json.dumps({
        "cell_s": round(total, 2),
        "engine_steps_s": spent,
        "tracking_and_reports_s": round(total - engine, 3),
        "beside_training_s": round(total - spent["training"], 3),
        "beside_training_share_of_training": round((total - spent["training"]) / spent["training"], 3),
    }))  # fmt: skip


def backend_sweep() -> None:
    """Seconds per round of each client-training backend on this CPU (subprocess; JSON)."""
    import torch

    from benchmarks.speed.round_speed import iid_clients, synthetic_images
    from federated.batched import train_clients_batched
    from federated.client import LocalTraining, train_client
    from federated.layout import use_fast_layout_
    from federated.metrics import loss_function
    from federated.vectors import model_to_vector
    from models import build_model

    torch.set_num_threads(1)
    rows = []
    for model_name, channels, size in (("small_cnn", 1, 28), ("logreg", 1, 28)):
        for clients, batch in ((10, 8), (20, 8), (20, 32), (100, 10)):
            images, labels = synthetic_images(clients * 24, 0, torch.device("cpu"))
            data = iid_clients(images[:, :channels, :size, :size], labels % 10, clients, 0)
            model = build_model(model_name, in_channels=channels, num_classes=10)
            use_fast_layout_(model, torch.device("cpu"))
            start = model_to_vector(model)
            local = LocalTraining(epochs=1, lr=0.01, batch_size=batch)
            loss = loss_function(False)
            timing = {}
            for backend in ("sequential", "batched"):
                best = float("inf")
                for _ in range(3):
                    started = time.perf_counter()
                    if backend == "batched":
                        train_clients_batched(
                            model, start, data, local, loss, seeds=list(range(clients))
                        )
                    else:
                        for client in data:
                            train_client(model, start, client, local, loss, seed=client.client_id)
                    best = min(best, time.perf_counter() - started)
                timing[backend] = round(best, 4)
            rows.append({"model": model_name, "clients": clients, "batch": batch, **timing,
                         "batched_speedup": round(timing["sequential"] / timing["batched"], 2)})  # fmt: skip
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps(rows))


def subprocess_json(
    function: str, *args: Any, env: dict[str, str] | None = None
) -> tuple[float, Any]:
    """Wall seconds from process start to exit, and the JSON it printed last."""
    code = f"from benchmarks.speed.grid_throughput import {function}; {function}(*{args!r})"
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{function}{args} failed:\n{done.stderr[-4000:]}")
    return seconds, json.loads(done.stdout.strip().splitlines()[-1])


def grid_run(seeds: int, max_parallel: int) -> float:
    """``fedsieve compare`` of the grid in a fresh project, wall seconds start to exit."""
    with tempfile.TemporaryDirectory(prefix="grid-") as tmp:
        project = Path(tmp)
        shutil.copy(PARAMS, project / "params.yaml")
        command = [str(Path(sys.executable).parent / "fedsieve"), "compare"]
        for item in overrides(seeds, max_parallel):
            command += ["--set", item]
        env = {
            **os.environ,
            "MEDMNIST_ROOT": str(data_root()),
            "PREFECT_HOME": str(project / ".prefect"),
        }
        env.pop("PREFECT_API_URL", None)
        env.pop("MLFLOW_TRACKING_URI", None)
        started = time.perf_counter()
        done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"fedsieve compare failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return seconds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=2)
    parser.add_argument("--max-parallel", type=positive_int, default=2)
    parser.add_argument("--skip-grid", action="store_true", help="leave out fedsieve compare")
    parser.add_argument("--skip-sweep", action="store_true", help="leave out the backend sweep")
    parser.add_argument("--without", nargs="*", default=["fedlag"], help="methods left out")
    args = parser.parse_args(argv)
    WITHOUT[:] = args.without
    from benchmarks.common import cpu_environment

    cores = len(os.sched_getaffinity(0))
    cells = len(grid_cells_of(args.seeds, args.max_parallel))
    threads = max(1, cores // args.max_parallel)
    report: dict[str, Any] = {
        "benchmark": "grid_throughput",
        "command": " ".join(["python -m benchmarks.speed.grid_throughput", *(argv or sys.argv[1:])]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **cpu_environment(),
        "settings": {"params": str(PARAMS.relative_to(REPO)), "seeds": args.seeds,
                     "max_parallel": args.max_parallel, "threads_per_cell": threads,
                     "methods_left_out": args.without},
        "cells": cells,
    }  # fmt: skip
    rates = {}
    for workers, per in ((1, 1), (1, cores), (cores, 1)):
        _, rate = subprocess_json("local_training_rate", workers, per)
        rates[f"{workers}x{per}"] = rate["images_per_s"]
        print(
            f"local training, {workers} workers x {per} threads: {rate['images_per_s']} img/s",
            flush=True,
        )
    report["local_training_images_per_s"] = rates
    _, profile = subprocess_json("cell_profile")
    report["one_cell"] = profile
    print("one cell:", profile, flush=True)
    choices = {}
    _, every_method = subprocess_json("engine_only", 1, 1, 1, [])
    report["one_cell_per_method_s"] = every_method["cell_s"]  # one seed, one thread each
    print("one cell per method:", every_method["cell_s"], flush=True)
    for parallel, per in ((args.max_parallel, threads), (1, cores), (1, 1)):
        wall, _ = subprocess_json("engine_only", args.seeds, parallel, per, args.without)
        choices[f"{parallel}x{per}"] = {
            "wall_s": round(wall, 1),
            "cells_per_hour": round(3600 * cells / wall),
        }
        print(f"engine only, {parallel} cells x {per} threads: {wall:.1f} s", flush=True)
    report["engine_only_by_cells_x_threads"] = choices
    engine_s = choices[f"{args.max_parallel}x{threads}"]["wall_s"]
    report["engine_only_s"] = engine_s
    first = grid_cells_of(1, 1)[0].params
    images_per_cell = 546 * first.train.local_epochs * first.train.rounds
    report["compute_floor"] = {
        "training_images": images_per_cell * cells,
        "best_images_per_s": max(rates.values()),
        "floor_s": round(images_per_cell * cells / max(rates.values()), 1),
        "floor_cells_per_hour": round(3600 * max(rates.values()) / images_per_cell),
    }
    if not args.skip_grid:
        grid_s = grid_run(args.seeds, args.max_parallel)
        report |= {
            "grid_wall_s": round(grid_s, 1),
            "grid_over_engine": round(grid_s / engine_s, 2),
            "cells_per_hour": round(3600 * cells / grid_s),
        }
        print(f"fedsieve compare: {grid_s:.1f} s for {cells} cells", flush=True)
    if not args.skip_sweep:
        _, report["backend_sweep"] = subprocess_json("backend_sweep")
    report["targets"] = {"grid_over_engine": 1.3, "cells_per_hour": 520}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report.get(k) for k in ("cells", "grid_wall_s", "engine_only_s",
                                                  "grid_over_engine", "cells_per_hour")}))  # fmt: skip
    return report


if __name__ == "__main__":
    main()
