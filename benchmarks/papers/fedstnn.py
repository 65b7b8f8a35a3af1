"""FedStNN's experiments, both trainers, over seeds: mean and 95 % interval per metric.

Runs the presets of :mod:`federated.fedstnn.experiments` (the FedStNN paper's Sec. 5)
with each trainer (``smp``: the paper's recipe; ``autograd``: this project's variant;
:data:`~federated.fedstnn.experiments.TRAINERS`) and ``--seeds`` seeds, each run in a
worker process of one torch thread. Every finished run is appended to
``benchmarks/results/fedstnn-<name>-cells.jsonl`` (git-ignored; a rerun skips what is
there), every run's metrics to ``fedstnn-<name>-seeds.csv`` (committed: one row per
trainer and seed, what docs/results.md's FedStNN tables are recomputed from by
``python -m benchmarks.evidence.report``), the summary (mean, standard deviation and 95 %
t-interval per trainer and metric: :func:`tasks.comparison.interval`) to
``fedstnn-<name>.json``, and seed 0's figures to
``fedstnn-<name>-<trainer>-<figure>.png``. Run from the repository root:

    python -m benchmarks.papers.fedstnn --experiment 1d_iid [--seeds 5] [--trainers smp autograd]
    python -m benchmarks.papers.fedstnn --experiment image --set federation.rounds=20
    python -m benchmarks.papers.fedstnn --experiment gradient    # autograd vs SMP step time
    python -m benchmarks.papers.fedstnn --experiment all --seeds 1 --check   # against the records

``--check`` reruns the first ``--seeds`` seeds in a temporary folder and compares every
metric with the committed per-seed records at the digits they hold (6 significant); it
writes nothing under ``--out`` and exits 1 naming each metric that moved.

CPU time is the process's user + system time, which the machine's other load does not
inflate the way it inflates wall time.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as dt
import json
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import cpu_environment
from federated.fedstnn.experiments import EXPERIMENTS, TRAINERS, Function1DConfig, run_experiment
from federated.fedstnn.losses import build_loss
from federated.fedstnn.smp import smp_gradients
from fedsieve.arguments import positive_int
from models.snn import SNN
from tasks.plots_fedstnn import save_fedstnn_figures

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def run_cell(
    name: str, trainer: str, seed: int, overrides: dict[str, Any], out: Path
) -> dict[str, Any]:
    """One run (in a worker process): its metrics, CPU time and, for seed 0, its figures;
    or the error that stopped it (a diverged run is a result, not a crash)."""
    torch.set_num_threads(1)
    cpu = time.process_time()
    record: dict[str, Any] = {"trainer": trainer, "seed": seed}
    try:
        result = run_experiment(name, trainer=trainer, seed=seed, track_rounds=False, **overrides)
    except (ValueError, RuntimeError) as error:
        error_text = f"{type(error).__name__}: {error}"
        return record | {"error": error_text, "cpu_seconds": round(time.process_time() - cpu, 1)}
    if seed == 0:
        save_fedstnn_figures(result, out, f"fedstnn-{name}-{trainer}")
    return record | {
        "metrics": result.metrics,
        "local_loss": [h["local_loss"] for h in result.history],
        "cpu_seconds": round(time.process_time() - cpu, 1),
        "config": dataclasses.asdict(result.config),
    }


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per trainer: the seeds, its config (seed 0's) and each metric's mean, std and 95 %
    half-width over seeds."""
    from tasks.comparison import interval

    out: dict[str, Any] = {}
    for trainer in dict.fromkeys(r["trainer"] for r in records):
        mine = sorted((r for r in records if r["trainer"] == trainer), key=lambda r: r["seed"])
        runs = [r for r in mine if "error" not in r]
        failed = {r["seed"]: r["error"] for r in mine if "error" in r}
        if not runs:
            out[trainer] = {"seeds": [], "failed": failed}
            continue
        metrics = {}
        for key in runs[0]["metrics"]:
            mean, std, half = interval([r["metrics"][key] for r in runs])
            metrics[key] = {"mean": mean, "std": std, "ci95": half}
        config = {k: v for k, v in runs[0]["config"].items() if k != "seed"}
        out[trainer] = {
            "seeds": [r["seed"] for r in runs],
            "failed": failed,
            "config": config,
            "metrics": metrics,
            "cpu_seconds_per_run": sum(r["cpu_seconds"] for r in runs) / len(runs),
        }
    return out


def run_seeds(
    name: str, trainers: list[str], seeds: int, overrides: dict[str, Any], out: Path, workers: int
) -> dict[str, Any]:
    cells_file = out / f"fedstnn-{name}-cells.jsonl"
    done = (
        [json.loads(line) for line in cells_file.read_text().splitlines()]
        if cells_file.exists()
        else []
    )
    have = {(r["trainer"], r["seed"]) for r in done}
    todo = [(t, s) for t in trainers for s in range(seeds) if (t, s) not in have]
    print(f"== {name}: {len(todo)} runs to do, {len(have)} done")
    with ProcessPoolExecutor(max_workers=workers) as pool, cells_file.open("a") as log:
        futures = [pool.submit(run_cell, name, t, s, overrides, out) for t, s in todo]
        for future in as_completed(futures):
            record = future.result()
            log.write(json.dumps(record) + "\n")
            log.flush()
            done.append(record)
            m = record.get("metrics", {})
            shown = {k: round(m[k], 4) for k in SHOWN if k in m} or record.get("error")
            print(
                f"  {record['trainer']} seed {record['seed']}: {shown} ({record['cpu_seconds']} s CPU)"
            )
    wanted = [r for r in done if r["trainer"] in trainers and r["seed"] < seeds]
    report = {
        "benchmark": "fedstnn",
        "experiment": name,
        "command": " ".join(["python -m benchmarks.papers.fedstnn", *sys.argv[1:]]),
        **cpu_environment(),
        "trainers": summary(wanted),
    }
    (out / f"fedstnn-{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    write_seed_rows(out / f"fedstnn-{name}-seeds.csv", wanted)
    return report


def write_seed_rows(path: Path, records: list[dict[str, Any]]) -> None:
    """One row per trainer and seed: every metric (6 significant digits), the CPU
    seconds, or the error that stopped the run."""
    metrics = list(dict.fromkeys(k for r in records for k in r.get("metrics", {})))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(
            handle, ["trainer", "seed", *metrics, "cpu_seconds", "error"], lineterminator="\n"
        )
        writer.writeheader()
        for record in sorted(records, key=lambda r: (r["trainer"], r["seed"])):
            values = {k: f"{v:.6g}" for k, v in record.get("metrics", {}).items()}
            writer.writerow(
                {"trainer": record["trainer"], "seed": record["seed"], **values,
                 "cpu_seconds": record["cpu_seconds"], "error": record.get("error", "")}
            )  # fmt: skip


def check_records(name: str, trainers: list[str], seeds: int, workers: int) -> list[str]:
    """Rerun seeds ``0..seeds-1`` of each trainer (the committed config, no overrides) and
    compare each metric with ``fedstnn-<name>-seeds.csv`` at its 6 significant digits: one
    line per metric that moved (or run that failed)."""
    with (RESULTS / f"fedstnn-{name}-seeds.csv").open() as handle:
        committed = {(r["trainer"], int(r["seed"])): r for r in csv.DictReader(handle)}
    moved = []
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(max_workers=workers) as pool:
        cells = [(t, s) for t in trainers for s in range(seeds)]
        futures = [pool.submit(run_cell, name, t, s, {}, Path(tmp)) for t, s in cells]
        for (trainer, seed), future in zip(cells, futures, strict=True):
            record, row = future.result(), committed[(trainer, seed)]
            if "error" in record:
                moved.append(f"{name} {trainer} seed {seed}: {record['error']}")
                continue
            for metric, value in record["metrics"].items():
                if f"{value:.6g}" != row[metric]:
                    moved.append(
                        f"{name} {trainer} seed {seed} {metric}: {value:.6g}, committed {row[metric]}"
                    )
            print(f"  {name} {trainer} seed {seed}: checked ({record['cpu_seconds']} s CPU)")
    return moved


SHOWN = ("mse_over_sigma2", "sigma_rel_error", "coverage_2sigma", "global_iou")


def gradient_cost(out: Path, steps: int = 30) -> dict[str, Any]:
    """Time one training step's gradient, autograd vs SMP, on the 1-D model and batch."""
    config = Function1DConfig()
    model = SNN(config.model, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    x = torch.rand(110, 1, generator=g) * 2 - 1
    y = torch.sin(2 * torch.pi * x)
    loss_fn = build_loss(config.federation.local.loss)
    timings: dict[str, float] = {}
    for method in ("autograd", "smp"):
        best = float("inf")
        for _ in range(3):
            start = time.process_time()
            for _ in range(steps):
                noise = model.sample_noise(110, generator=g)  # K = model.n_paths
                if method == "smp":
                    smp_gradients(model, x, y, loss_fn, noise)
                else:
                    model.zero_grad()
                    loss_fn(model(x, noise=noise), y).backward()
            best = min(best, (time.process_time() - start) / steps)
        timings[method] = best * 1e3
    print(
        f"== gradient: autograd {timings['autograd']:.1f} ms/step, SMP {timings['smp']:.1f} ms/step (CPU)"
    )
    report = {
        "benchmark": "fedstnn",
        "experiment": "gradient",
        "command": " ".join(["python -m benchmarks.papers.fedstnn", *sys.argv[1:]]),
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **cpu_environment(),
        "setting": "1-D default model, batch 110, K = model.n_paths, CPU time per gradient, best of 3",
        "ms_per_step": timings,
    }
    (out / "fedstnn-gradient.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", choices=[*EXPERIMENTS, "gradient", "all"], default="all")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a setting (JSON value), e.g. --set federation.local.epochs=50",
    )
    parser.add_argument("--trainers", nargs="+", choices=list(TRAINERS), default=list(TRAINERS))
    parser.add_argument("--seeds", type=positive_int, default=5)
    parser.add_argument("--workers", type=positive_int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--check", action="store_true", help="rerun seeds and compare with the committed records"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    overrides: dict[str, Any] = {}
    for item in args.set:  # federation.local.epochs=50 -> {"federation": {"local": {...}}}
        key, _, value = item.partition("=")
        *outer, last = key.split(".")
        level = overrides
        for name in outer:
            level = level.setdefault(name, {})
        level[last] = _parse_value(value)
    args.out.mkdir(parents=True, exist_ok=True)
    names = [*EXPERIMENTS, "gradient"] if args.experiment == "all" else [args.experiment]
    if args.check:
        moved = [
            line
            for name in names
            if name != "gradient"
            for line in check_records(name, args.trainers, args.seeds, args.workers)
        ]
        print("\n".join(moved) or "every metric equals its committed record")
        raise SystemExit(1 if moved else 0)
    for name in names:
        if name == "gradient":
            gradient_cost(args.out)
        else:
            run_seeds(name, args.trainers, args.seeds, overrides, args.out, args.workers)


if __name__ == "__main__":
    main()
