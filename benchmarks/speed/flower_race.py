"""Benchmark: fedsieve's engine against Flower's simulation, same workload (not a test).

    python -m benchmarks.speed.flower_race [--setup] [--repeats 3] [--rounds 10] [--clients 10]

Workload (issue 8): BreastMNIST (``MEDMNIST_ROOT`` or ../shared/data/medmnist), 10 IID
clients, the small CNN of models/cnn.py under the same init seed, 1 local epoch of SGD
(lr 0.01, momentum 0.9, batch 32), FedAvg, the global model evaluated on the test split
every round, 2 CPU threads. Client shuffles are seeded by (round, client) the same way on
both sides, so both see the same batches and reach the same accuracy every round (up
to float rounding of the two FedAvg formulas).

Each contestant runs in its own process, one after the other, timed from process start
to exit (interpreter, imports, data, every round):

1. fedsieve's engine: ``Federation.run_round`` x rounds, no Prefect, no MLflow, once
   with each client-training backend;
2. Flower 1.32 (Message API ServerApp/ClientApp in benchmarks/flower/, built-in FedAvg,
   ``run_simulation`` on the Ray backend, ``num_cpus=threads`` per client) in its own
   environment benchmarks/.venv-flower: Flower's pins conflict with Prefect's
   (../shared/ENVIRONMENT.md). The setup step creates it when missing (``--setup``
   recreates it): ``flwr[simulation]==1.32.1`` and ``torch==2.13.0`` from the registry;
3. ``fedsieve run`` (Prefect flows on the command's own Prefect server, MLflow tracking to the
   project's SQLite store, the pipeline's own pre-test, non-IID screen and validation
   scores, model registration) in a temporary project with the same settings: first in
   a fresh project and PREFECT_HOME (cold), then again in the same one (warm), then
   against a running ``prefect server start`` (``PREFECT_API_URL``, as deployments run).

With ``--repeats N`` the contestants alternate N times and the medians are compared.
Prints the wall times, the per-round accuracies side by side and ``flower_over_fedsieve``,
and writes ``benchmarks/results/flower-race-cpu.json`` (device, versions, date, load). Each
run also records its CPU seconds, and each ``fedsieve run`` where its wall time went
(before the pipeline flow, each stage's flow, after it: from the Prefect database).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import itertools
import json
import os
import platform
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FLOWER_DIR = REPO / "benchmarks" / "flower"
FLOWER_VENV = REPO / "benchmarks" / ".venv-flower"
FLOWER_PINS = ["flwr[simulation]==1.32.1", "torch==2.13.0", "numpy"]
LR, MOMENTUM, BATCH = 0.01, 0.9, 32


def flower_python(force: bool = False) -> Path:
    """The Flower environment's interpreter, created (or recreated) first if needed."""
    python = FLOWER_VENV / "bin" / "python"
    if force and FLOWER_VENV.exists():
        shutil.rmtree(FLOWER_VENV)
    if not python.exists() or force:
        print(f"setting up {FLOWER_VENV} ({' '.join(FLOWER_PINS)}); Ray is large", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(FLOWER_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
             *FLOWER_PINS],
            check=True,
        )  # fmt: skip
    return python


def data_file() -> Path:
    root = Path(os.environ.get("MEDMNIST_ROOT") or REPO.parent / "shared" / "data" / "medmnist")
    path = root / "breastmnist.npz"
    if not path.exists():
        raise SystemExit(f"{path} not found: set MEDMNIST_ROOT to a folder with breastmnist.npz")
    return path


def engine_main(backend: str, out: Path, clients: int, rounds: int, threads: int) -> None:
    """fedsieve's engine on the race workload; timings and accuracies to ``out``."""
    started = time.time()
    import torch

    from aggregation import build_aggregator
    from federated.client import ClientData, LocalTraining
    from federated.data import load_medmnist, to_tensors
    from federated.loop import train
    from federated.partition import build_partitioner
    from federated.seeding import seeded_init
    from federated.server import (
        Defence,
        EvaluationSets,
        Execution,
        Federation,
        FederationConfig,
        RoundReport,
        ServerState,
    )
    from models import build_model

    sys.path.insert(0, str(FLOWER_DIR))
    from task import digest  # the same digest as Flower's side

    torch.set_num_threads(threads)
    imported = time.time()
    data = load_medmnist("breastmnist", data_file().parent)
    images, targets = to_tensors(data.train, data.info)
    parts = build_partitioner("iid")(data.train.targets, clients, seed=0)
    model = seeded_init(
        0,
        lambda: build_model(
            "small_cnn", in_channels=data.info.n_channels, num_classes=data.info.n_classes
        ),
    )
    federation = Federation(
        model=model,
        clients=[ClientData(i, images[p], targets[p]) for i, p in enumerate(parts)],
        local=LocalTraining(epochs=1, lr=LR, momentum=MOMENTUM, weight_decay=0.0, batch_size=BATCH),
        config=FederationConfig(rounds=rounds, seed=0),
        defence=Defence(rule=build_aggregator("fedavg")),
        evaluation=EvaluationSets(test=to_tensors(data.test, data.info)),
        execution=Execution(backend=backend),  # type: ignore[arg-type]
    )
    init = digest(list(model.state_dict().values()))
    state = federation.initial_state()
    ready = time.time()
    history = []

    def on_round(report: RoundReport, _state: ServerState) -> None:
        history.append(
            {"round": report.round, "acc": report.metrics["test_acc"],
             "loss": report.metrics["test_loss"], "time": time.time()}
        )  # fmt: skip

    state = train(federation, state, rounds, on_round=on_round)
    result = {
        "started": started,
        "imported": imported,
        "ready": ready,
        "finished": time.time(),
        "init_digest": init,
        "partition_digest": digest([p.astype("int64") for p in parts]),
        "rounds": history,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")


def timed(command: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None):
    """(wall seconds, CPU seconds, completed process) of a subprocess; raises with its
    output tail. CPU counts the processes the command waited for: for ``fedsieve run`` its
    Prefect server but not its tracking process (which ends after it), and not Ray's
    daemons for Flower, so both are lower bounds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-4000:]
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{tail}")
    return wall, cpu, done


def pipeline_phases(db: Path, started: float, finished: float) -> dict[str, float]:
    """Where the latest ``fedsieve run``'s wall time went, read from its Prefect database:
    before the pipeline flow started (interpreter, imports, input checks, the server),
    each stage's flow, the pipeline's own time between them, and after it ended (exit
    hooks, stopping the server). ``started``/``finished``: the command's epoch seconds."""

    def epoch(value: str) -> float:
        moment = dt.datetime.fromisoformat(value.replace(" ", "T").replace("Z", "+00:00"))
        return (moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)).timestamp()

    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        runs = connection.execute(
            "select f.name, r.start_time, r.end_time, r.parent_task_run_id from flow_run r "
            "join flow f on f.id = r.flow_id where r.end_time is not null order by r.start_time"
        ).fetchall()
    _, first, last, _ = [r for r in runs if r[0] == "pipeline" and r[3] is None][-1]
    start, end = epoch(first), epoch(last)
    stages = {
        f"{name}_s": round(epoch(stage_end) - epoch(stage_start), 2)
        for name, stage_start, stage_end, parent in runs
        if parent is not None and start <= epoch(stage_start) <= end
    }
    return {
        "before_pipeline_s": round(start - started, 2),
        **stages,
        "pipeline_between_stages_s": round(end - start - sum(stages.values()), 2),
        "after_pipeline_s": round(finished - end, 2),
    }


def round_seconds(rounds: list[dict[str, float]], start: float) -> list[float]:
    times = [start] + [r["time"] for r in rounds]
    return [round(b - a, 3) for a, b in itertools.pairwise(times)]


def fedsieve_run(
    clients: int, rounds: int, project: Path, prefect_home: Path, api_url: str | None = None
) -> dict[str, Any]:
    """``fedsieve run`` end to end in ``project`` (its params.yaml copied in first), on
    the command's own Prefect server, or on the running server at ``api_url``."""
    shutil.copy(REPO / "params.yaml", project / "params.yaml")
    env = {**os.environ, "MEDMNIST_ROOT": str(data_file().parent),
           "PREFECT_HOME": str(prefect_home), "OMP_NUM_THREADS": "2"}  # fmt: skip
    env.pop("MLFLOW_TRACKING_URI", None)  # the project's own sqlite store
    env.pop("PREFECT_API_URL", None)
    if api_url is not None:
        env["PREFECT_API_URL"] = api_url
    overrides = [
        f"partition.num_clients={clients}", f"train.rounds={rounds}", "train.local_epochs=1",
        f"train.lr={LR}", f"train.batch_size={BATCH}", f"train.momentum={MOMENTUM}",
        "train.weight_decay=0.0",
    ]  # fmt: skip
    command = [str(Path(sys.executable).parent / "fedsieve"), "run"]
    for item in overrides:
        command += ["--set", item]
    started = time.time()
    wall, cpu, _ = timed(command, env=env, cwd=project)
    phases = pipeline_phases(prefect_home / "prefect.db", started, time.time())
    with (project / "reports" / "rounds.csv").open() as handle:
        accs = [float(row["test_acc"]) for row in csv.DictReader(handle)]
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "phases": phases,
            "overrides": overrides, "acc": accs}  # fmt: skip


def record_run(runs: dict[str, Any], kind: str, result: dict[str, Any]) -> None:
    entry = runs.setdefault(kind, {"walls_s": [], "cpus_s": [], "phases_each": [], **result})
    entry["walls_s"].append(result["wall_s"])
    entry["cpus_s"].append(result["cpu_s"])
    entry["phases_each"].append(result["phases"])
    entry["wall_s"] = statistics.median(entry["walls_s"])
    entry["cpu_s"] = statistics.median(entry["cpus_s"])
    print(f"fedsieve run ({kind}): {result['wall_s']:.2f} s wall, {result['cpu_s']:.1f} s CPU, "
          f"{result['phases']}", flush=True)  # fmt: skip


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", action="store_true", help="recreate the Flower environment")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-run", action="store_true", help="leave out `fedsieve run`")
    parser.add_argument("--repeats", type=int, default=1, help="runs per contestant (median)")
    parser.add_argument("--engine", choices=["sequential", "batched"], help=argparse.SUPPRESS)
    parser.add_argument("--engine-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/flower-race-cpu.json"))
    return parser.parse_args(argv)


def _header(args: argparse.Namespace, argv: list[str] | None, python: Path) -> dict[str, Any]:
    """The report's description of the race: command, date, device, both environments'
    versions, the workload."""
    versions = subprocess.run(
        [str(python), "-c", "import flwr, ray, torch, numpy; "
         "print(flwr.__version__, ray.__version__, torch.__version__, numpy.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    import numpy as np
    import torch

    return {
        "benchmark": "flower_race",
        "command": " ".join(["python -m benchmarks.speed.flower_race", *(argv or sys.argv[1:])]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": {"kind": "cpu", "nproc": len(os.sched_getaffinity(0)),
                   "threads": args.threads, "platform": platform.platform()},
        "versions": {
            "fedsieve_env": {"python": platform.python_version(), "torch": torch.__version__,
                             "numpy": np.__version__},
            "flower_env": dict(zip(["flwr", "ray", "torch", "numpy"], versions, strict=True)),
        },
        "workload": {"dataset": "breastmnist", "clients": args.clients, "rounds": args.rounds,
                     "local_epochs": 1, "lr": LR, "momentum": MOMENTUM, "batch_size": BATCH,
                     "aggregation": "fedavg", "model": "small_cnn"},
    }  # fmt: skip


def engine_once(backend: str, tmp: Path, common: list[str]) -> tuple[float, dict[str, Any]]:
    """One engine process with ``backend``: its wall seconds and its output (timings,
    accuracies, digests) with this run's timings summarised under ``"run"``."""
    out = tmp / f"engine-{backend}.json"
    wall, cpu, _ = timed(
        [sys.executable, "-m", "benchmarks.speed.flower_race", "--engine", backend,
         "--engine-out", str(out), *common],
        cwd=REPO,
    )  # fmt: skip
    result = json.loads(out.read_text())
    result["run"] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                     "startup_s": round(result["ready"] - result["started"], 2),
                     "round_s": round_seconds(result["rounds"], result["ready"])}  # fmt: skip
    return wall, result


def flower_once(python: Path, tmp: Path, common: list[str]) -> tuple[float, dict[str, Any]]:
    """One Flower simulation process: its wall seconds and its output, with this run's
    timings summarised under ``"run"``."""
    out = tmp / "flower.json"
    wall, cpu, _ = timed(
        [str(python), str(FLOWER_DIR / "launch.py"), "race", "--data", str(data_file()),
         "--out", str(out), *common],
        cwd=REPO,
    )  # fmt: skip
    result = json.loads(out.read_text())
    first_eval = result["rounds"][0]["time"]  # Flower evaluates the initial model too
    result["run"] = {"wall_s": round(wall, 2), "cpu_s_lower_bound": round(cpu, 2),
                     "before_first_client_s": round(result["first_client_start"] - result["started"], 2),
                     "round_s": round_seconds(result["rounds"][1:], first_eval),
                     "client_training_s": round(result["client_seconds"], 2)}  # fmt: skip
    return wall, result


@dataclass(frozen=True)
class Race:
    """The contestants' results over the repeats (filled in as they run)."""

    walls: dict[str, list[float]]  # contestant -> wall seconds per repeat
    engines: dict[str, dict[str, Any]]  # backend -> runs, accuracies, digests
    flower: dict[str, Any]  # runs, accuracies, digest


def race(repeats: int, python: Path, common: list[str], load: dict[str, list[float]]) -> Race:
    """The engine (each backend) and Flower, alternating ``repeats`` times so that load
    drifts hit all; the load average after each is added to ``load``."""
    result = Race(walls={"sequential": [], "batched": [], "flower": []}, engines={}, flower={})
    with tempfile.TemporaryDirectory(prefix="flower-race-") as tmp:
        for repeat in range(repeats):
            for backend in ("sequential", "batched"):
                wall, engine = engine_once(backend, Path(tmp), common)
                result.walls[backend].append(round(wall, 2))
                entry = result.engines.setdefault(backend, {"runs": []})
                entry["runs"].append(engine["run"])
                entry.update(
                    acc=[r["acc"] for r in engine["rounds"]],
                    init_digest=engine["init_digest"],
                    partition_digest=engine["partition_digest"],
                )
                print(f"[{repeat}] fedsieve engine ({backend}): {wall:.2f} s wall", flush=True)
            load[f"after_engines_{repeat}"] = _load()

            wall, flower = flower_once(python, Path(tmp), common)
            result.walls["flower"].append(round(wall, 2))
            result.flower.setdefault("runs", []).append(flower["run"])
            result.flower.update(
                acc=[r["acc"] for r in flower["rounds"][1:]],
                acc_initial=flower["rounds"][0]["acc"],
                init_digest=flower["init_digest"],
            )
            print(f"[{repeat}] flower simulation: {wall:.2f} s wall", flush=True)
            load[f"after_flower_{repeat}"] = _load()
    return result


def comparison(result: Race) -> dict[str, Any]:
    """The report's race entries: medians per contestant, Flower over the fastest engine
    backend, and whether both sides started from the same weights and agree."""
    walls, engines, flower = result.walls, result.engines, result.flower
    for backend, engine in engines.items():
        engine["wall_s"] = statistics.median(walls[backend])
    flower["wall_s"] = statistics.median(walls["flower"])
    best = min(engines, key=lambda b: engines[b]["wall_s"])
    return {
        "fedsieve_engine": engines,
        "flower": flower,
        "wall_s_median_of_repeats": {k: statistics.median(v) for k, v in walls.items()},
        "wall_s_min_of_repeats": {k: min(v) for k, v in walls.items()},
        "flower_over_fedsieve_min_of_repeats": round(
            min(walls["flower"]) / min(min(walls["sequential"]), min(walls["batched"])), 2
        ),
        "same_initial_weights": all(
            e["init_digest"] == flower["init_digest"] for e in engines.values()
        ),
        "max_abs_acc_difference": {
            b: max(abs(a - f) for a, f in zip(e["acc"], flower["acc"], strict=True))
            for b, e in engines.items()
        },
        "flower_over_fedsieve": round(flower["wall_s"] / engines[best]["wall_s"], 2),
        "flower_over_fedsieve_backend": best,
        "flower_over_fedsieve_by_backend": {
            b: round(flower["wall_s"] / e["wall_s"], 2) for b, e in engines.items()
        },
        "targets": {"flower_over_fedsieve": 2.5, "flower_over_fedsieve_run": 1.5},
    }


def fedsieve_runs(
    clients: int, rounds: int, repeats: int, load: dict[str, list[float]]
) -> dict[str, Any]:
    """``fedsieve run`` in a temporary project: cold, warm ``repeats`` times, and against a
    running ``prefect server start`` ``repeats`` times; the load after each is added to
    ``load``."""
    with tempfile.TemporaryDirectory(prefix="flower-race-run-") as tmp:
        project, home = Path(tmp) / "project", Path(tmp) / "prefect-home"
        project.mkdir()
        runs: dict[str, Any] = {}
        # imported here: the engine's own process must not pay for torch early
        from benchmarks.common import prefect_server_running
        from config.environment import TELEMETRY_OFF

        # a fresh project and PREFECT_HOME (a user's first run: Prefect's and MLflow's
        # databases created), then the same project again (every later run)
        for kind in ["cold"] + ["warm"] * repeats:
            record_run(runs, kind, fedsieve_run(clients, rounds, project, home))
            load[f"after_fedsieve_run_{kind}_{len(runs[kind]['walls_s'])}"] = _load()
        # and against a running `prefect server start`, as scheduled deployments run
        server_env = {**os.environ, "PREFECT_HOME": str(home), **TELEMETRY_OFF}
        server_env.pop("PREFECT_API_URL", None)
        with prefect_server_running(server_env) as url:
            if url is not None:
                for _ in range(repeats):
                    result = fedsieve_run(clients, rounds, project, home, url)
                    record_run(runs, "running_server", result)
                load["after_fedsieve_run_running_server"] = _load()
    return runs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _arguments(argv)
    if args.engine:
        engine_main(args.engine, args.engine_out, args.clients, args.rounds, args.threads)
        return {}

    python = flower_python(force=args.setup)
    report = _header(args, argv, python)
    common = ["--clients", str(args.clients), "--rounds", str(args.rounds),
              "--threads", str(args.threads)]  # fmt: skip
    load: dict[str, list[float]] = {"start": _load()}
    result = race(args.repeats, python, common, load)
    report.update(comparison(result))
    engines, flower = result.engines, result.flower

    if not args.skip_run:
        runs = fedsieve_runs(args.clients, args.rounds, args.repeats, load)
        report["fedsieve_run"] = runs
        report["flower_over_fedsieve_run"] = {
            k: round(flower["wall_s"] / r["wall_s"], 2) for k, r in runs.items()
        }
        report["fedsieve_run_max_abs_acc_difference_to_engine"] = max(
            abs(a - b)
            for a, b in zip(runs["warm"]["acc"], engines["sequential"]["acc"], strict=True)
        )
    report["load_avg"] = load

    print(f"\n{'round':>5} {'fedsieve seq':>13} {'fedsieve bat':>13} {'flower':>8}")
    for i, f in enumerate(flower["acc"]):
        seq, bat = engines["sequential"]["acc"][i], engines["batched"]["acc"][i]
        print(f"{i + 1:>5} {seq:>13.4f} {bat:>13.4f} {f:>8.4f}")
    best = report["flower_over_fedsieve_backend"]
    print(f"flower_over_fedsieve = {report['flower_over_fedsieve']} ({best} backend)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
