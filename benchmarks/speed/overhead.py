"""Benchmark: what a pipeline run spends on Prefect, MLflow and DVC besides compute (CPU).

    python -m benchmarks.speed.overhead [--rounds 3] [--skip-dvc] [--skip-server]

Every measurement runs in fresh processes (what a user's ``make run`` pays), with
telemetry off and the shared BreastMNIST file; the pipeline runs use the repository's
params.yaml with ``train.rounds`` lowered (overhead is per run, not per round, except the
per-round MLflow metrics and checkpoint, which the ``train`` flow body time includes).

Method, phase by phase (no flow is changed; nothing is patched):

- imports: ``python -c "import X"`` for torch, prefect, mlflow, dvc.repo, federated.data and the
  pipeline module, each minus a bare ``python -c pass`` (second of two runs: warm disk);
- Prefect: a one-line ``@flow`` run as a script, so Prefect starts its temporary local
  server (SQLite under PREFECT_HOME): a fresh PREFECT_HOME (cold), the same one again
  (warm), and against a running ``prefect server start`` (PREFECT_API_URL), each minus
  the ``import prefect`` time;
- MLflow: ``tasks.tracking.Tracker`` doing what the train and evaluate flows do (create
  the store and run, log params, per-round metrics, the report artifacts, then
  ``log_model`` with registration), each call timed, on a fresh SQLite store;
- ``fedsieve run`` end to end (one process, four flows) in a warm project (a first run
  creates its Prefect database and MLflow store; the second is measured), with the
  command's own Prefect server, against a running server (``PREFECT_API_URL``), and with
  tracking off (an unreachable ``MLFLOW_TRACKING_URI`` with retries off: the Tracker
  disables itself at its first call). The Prefect database of the run is read back for
  every task's duration: the engine's tasks (:data:`COMPUTE_TASKS`) are the compute,
  everything else (imports, the server, Prefect's orchestration, MLflow, reports,
  figures, checkpoints) is overhead;
- DVC (one process per stage): ``make run`` (``fedsieve dvc repro``: one Prefect server
  for all four stages) and plain ``dvc repro`` (a temporary server per stage), each in a
  temporary git repository holding the pipeline, ``dvc repro`` again (nothing to do:
  DVC's own cost per call), and the four stage commands run directly one after another.

Writes ``benchmarks/results/overhead-cpu.json`` with device, versions, date and the load
average; the target is less than 15 s of overhead per run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import free_port, prefect_server_running
from config.environment import TELEMETRY_OFF

REPO = Path(__file__).resolve().parents[2]
# the tasks that run the engine's work: training, scoring, partitioning, the pre-test
COMPUTE_TASKS = (
    "partition-clients", "build-federation", "train-round", "collect-client-updates",
    "test-normality", "score-final-model",
)  # fmt: skip
BIN = Path(sys.executable).parent
# what config.environment sets: telemetry off, and a cold temporary server on a busy machine is slow
SUBPROCESS_ENV = {**TELEMETRY_OFF, "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90"}
NOOP_FLOW = "from prefect import flow\n@flow\ndef noop():\n    return 1\nnoop()\n"
TRACKING = """
import json, sys, time
from pathlib import Path
import numpy as np
t = time.perf_counter(); times = {}
def lap(name):
    global t
    now = time.perf_counter(); times[name] = round(now - t, 3); t = now
from config.params import load_params
from tasks.tracking import Tracker, flatten_params
from federated.seeding import seeded_init
from models import build_model
from federated.data import dataset_info
from federated.inference import save_classifier
import mlflow, mlflow.pytorch
params = load_params(Path("params.yaml"), [])
tracker = Tracker("overhead")
lap("imports")
tracker.start(run_id=None, run_name="overhead", tags={"dataset": "breastmnist"})
lap("store_and_run_created")
tracker.log_params(flatten_params(params.model_dump(mode="json")))
lap("log_params")
for step in range(1, ROUNDS + 1):
    tracker.log_metrics({"test_acc": 0.5, "test_loss": 0.7, **{f"client_loss/{i}": 0.6 for i in range(10)}}, step=step)
lap("log_metrics_all_rounds")
Path("report.csv").write_text("round,test_acc\\n1,0.5\\n")
for _ in range(4):
    tracker.log_artifact(Path("report.csv"), "reports")
lap("log_4_artifacts")
model = seeded_init(0, lambda: build_model("small_cnn", in_channels=1, num_classes=2)).eval()
info = dataset_info("breastmnist")
classifier = save_classifier(Path("classifier"), model, "small_cnn", info)
tracker.log_model(classifier, info, registered_name="fedsieve-overhead")
lap("log_and_register_model")
tracker.end()
lap("end_run")
print(json.dumps({"failed": tracker.failed, **times}))
"""


def environment(**extra: str) -> dict[str, str]:
    env = {**os.environ, **SUBPROCESS_ENV, **extra}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    root = os.environ.get("MEDMNIST_ROOT") or str(REPO.parent / "shared" / "data" / "medmnist")
    env.setdefault("MEDMNIST_ROOT", root)
    return env


def timed(
    command: list[str], env: dict[str, str], cwd: Path | None = None
) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return seconds, done


def python_seconds(code: str, env: dict[str, str], cwd: Path | None = None, runs: int = 2) -> float:
    """Wall seconds of ``python -c code``: the last of ``runs`` (warm disk cache)."""
    seconds = 0.0
    for _ in range(runs):
        seconds, _ = timed([sys.executable, "-c", code], env, cwd)
    return seconds


def import_costs(env: dict[str, str]) -> dict[str, float]:
    bare = python_seconds("pass", env, runs=3)
    modules = ["torch", "prefect", "mlflow", "dvc.repo", "federated.data", "flows.pipeline"]
    costs = {m: round(python_seconds(f"import {m}", env, REPO) - bare, 2) for m in modules}
    return {"python_startup_s": round(bare, 2), **{f"import_{m}_s": s for m, s in costs.items()}}


def prefect_costs(env: dict[str, str], import_prefect: float, with_server: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="overhead-prefect-") as home:
        flow_env = {**env, "PREFECT_HOME": home}
        flow_env.pop("PREFECT_API_URL", None)
        cold = python_seconds(NOOP_FLOW, flow_env, runs=1)
        warm = python_seconds(NOOP_FLOW, flow_env, runs=2)
        out["noop_flow_cold_home_s"] = round(cold, 2)
        out["noop_flow_warm_home_s"] = round(warm, 2)
        out["temporary_server_cold_s"] = round(cold - import_prefect, 2)
        out["temporary_server_warm_s"] = round(warm - import_prefect, 2)
        if with_server:
            started = time.perf_counter()
            with prefect_server_running(flow_env) as url:
                ready = time.perf_counter() - started
                out["server_start_s"] = round(ready, 2) if url is not None else None
                if url is not None:
                    served = python_seconds(NOOP_FLOW, {**flow_env, "PREFECT_API_URL": url})
                    out["noop_flow_running_server_s"] = round(served, 2)
                    out["running_server_overhead_s"] = round(served - import_prefect, 2)
    return out


def tracking_costs(env: dict[str, str], rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="overhead-mlflow-") as tmp:
        shutil.copy(REPO / "params.yaml", Path(tmp) / "params.yaml")
        run_env = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{Path(tmp) / 'mlflow.db'}"}
        _, done = timed(
            [sys.executable, "-c", TRACKING.replace("ROUNDS", str(rounds))], run_env, Path(tmp)
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def prefect_runs(db: Path) -> dict[str, Any]:
    """Durations of the flow and task runs recorded in a PREFECT_HOME database."""

    def seconds(value: str | None) -> float:
        if not value:
            return 0.0
        moment = dt.datetime.fromisoformat(value.replace(" ", "T"))
        return (moment - dt.datetime(1970, 1, 1)).total_seconds()

    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        flows = connection.execute(
            "select f.name, r.id, r.total_run_time, r.start_time, r.end_time, r.parent_task_run_id "
            "from flow_run r join flow f on f.id = r.flow_id order by r.start_time"
        ).fetchall()
        wrappers = {
            row[0]
            for row in connection.execute(
                "select parent_task_run_id from flow_run where parent_task_run_id is not null"
            )
        }  # a subflow shows up as a task run of its parent too: not compute
        tasks = [
            (name, flow_run, total)
            for task_id, name, flow_run, total in connection.execute(
                "select id, name, flow_run_id, total_run_time from task_run order by start_time"
            )
            if task_id not in wrappers
        ]
    by_flow: dict[str, Any] = {}
    top = None
    for name, run_id, total, start, end, parent in flows:
        task_time = sum(seconds(t) for _, flow_run, t in tasks if flow_run == run_id)
        by_flow[name] = {"flow_s": round(seconds(total), 2), "tasks_s": round(task_time, 2)}
        if parent is None and name == "pipeline":
            top = (seconds(total), start, end)
    task_totals: dict[str, float] = {}
    for name, _, total in tasks:
        key = name.rsplit("-", 1)[0]
        task_totals[key] = round(task_totals.get(key, 0.0) + seconds(total), 2)
    return {"flows": by_flow, "tasks_by_name_s": task_totals,
            "pipeline_flow_s": round(top[0], 2) if top else None}  # fmt: skip


def fedsieve_run(
    env: dict[str, str], rounds: int, home: Path, *, tracking: bool, api_url: str | None
) -> dict[str, Any]:
    """The second of two ``fedsieve run`` in one project (the first warms its Prefect
    database and MLflow store), with its task durations from the Prefect database."""
    with tempfile.TemporaryDirectory(prefix="overhead-run-") as tmp:
        project = Path(tmp)
        shutil.copy(REPO / "params.yaml", project / "params.yaml")
        run_env = {**env, "PREFECT_HOME": str(home)}
        run_env.pop("PREFECT_API_URL", None)
        if api_url is not None:
            run_env["PREFECT_API_URL"] = api_url
        if tracking:
            run_env.pop("MLFLOW_TRACKING_URI", None)  # the project's own sqlite:///mlflow.db
        else:  # unreachable: the Tracker's first call fails fast and it goes quiet
            run_env.update(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{free_port()}",
                           MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
                           MLFLOW_HTTP_REQUEST_TIMEOUT="2")  # fmt: skip
        command = [str(BIN / "fedsieve"), "run", "--set", f"train.rounds={rounds}"]
        timed(command, run_env, project)  # warm-up: creates the stores
        for name in ("prefect.db", "prefect.db-wal", "prefect.db-shm"):
            if api_url is None:  # only this run's records (a running server keeps its own)
                (home / name).unlink(missing_ok=True)
        if api_url is None:
            timed([sys.executable, "-c", NOOP_FLOW], run_env, project)  # recreate the tables
        wall, _ = timed(command, run_env, project)
        runs = prefect_runs(home / "prefect.db") if api_url is None else {}
    runs["wall_s"] = round(wall, 2)
    return runs


def dvc_costs(env: dict[str, str], rounds: int, home: Path) -> dict[str, Any]:
    """``dvc repro`` (make run) in a temporary git repository, a no-op repro, and the same
    stage commands run directly."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="overhead-dvc-") as tmp:
        for label in ("make_run", "dvc", "direct"):
            repo = Path(tmp) / label
            repo.mkdir()
            for name in ("dvc.yaml", "params.yaml", ".gitignore", ".dvcignore"):
                if (REPO / name).exists():
                    shutil.copy(REPO / name, repo / name)
            for folder in (
                "federated",
                "aggregation",
                "models",
                "tasks",
                "flows",
                "fedsieve",
                ".dvc",
            ):
                if (REPO / folder).exists():
                    shutil.copytree(REPO / folder, repo / folder,
                                    ignore=shutil.ignore_patterns("__pycache__", "tmp", "cache"))  # fmt: skip
            text = (repo / "params.yaml").read_text().replace("rounds: 20", f"rounds: {rounds}")
            (repo / "params.yaml").write_text(text)
            git = ["git", "-c", "user.email=bench@example.com", "-c", "user.name=bench"]
            for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "pipeline"]):
                subprocess.run([*git, *args], cwd=repo, check=True, capture_output=True)
            run_env = {**env, "PREFECT_HOME": str(home)}
            run_env.pop("PREFECT_API_URL", None)
            run_env.pop("MLFLOW_TRACKING_URI", None)
            if label == "make_run":  # one Prefect server shared by the four stages
                wall, _ = timed([str(BIN / "fedsieve"), "dvc", "repro"], run_env, repo)
                out["make_run_fedsieve_dvc_repro_s"] = round(wall, 2)
            elif label == "dvc":
                wall, _ = timed([str(BIN / "dvc"), "repro"], run_env, repo)
                out["dvc_repro_s"] = round(wall, 2)
                noop, done = timed([str(BIN / "dvc"), "repro"], run_env, repo)
                out["dvc_repro_nothing_to_do_s"] = round(noop, 2)
                out["nothing_to_do_skipped"] = "didn't change, skipping" in done.stdout
            else:
                stages = {}
                for stage in ("partition", "pretest", "train --resume", "evaluate"):
                    wall, _ = timed([str(BIN / "fedsieve"), *stage.split()], run_env, repo)
                    stages[stage.split()[0]] = round(wall, 2)
                out["stage_commands_s"] = stages
                out["stage_commands_total_s"] = round(sum(stages.values()), 2)
    out["dvc_own_s"] = round(out["dvc_repro_s"] - out["stage_commands_total_s"], 2)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-dvc", action="store_true")
    parser.add_argument("--skip-server", action="store_true", help="no `prefect server start`")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/overhead-cpu.json"))
    args = parser.parse_args(argv)
    env = environment()
    load = {"start": [round(x, 2) for x in os.getloadavg()]}
    import mlflow
    import prefect
    import torch

    report: dict[str, Any] = {
        "benchmark": "overhead",
        "command": " ".join(["python -m benchmarks.speed.overhead", *(argv or sys.argv[1:])]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": {"kind": "cpu", "nproc": len(os.sched_getaffinity(0)),
                   "platform": platform.platform()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "prefect": prefect.__version__, "mlflow": mlflow.__version__},
        "rounds": args.rounds,
    }  # fmt: skip

    report["imports"] = imports = import_costs(env)
    print("imports:", imports, flush=True)
    load["after_imports"] = [round(x, 2) for x in os.getloadavg()]
    report["prefect"] = prefect_costs(env, imports["import_prefect_s"], not args.skip_server)
    print("prefect:", report["prefect"], flush=True)
    load["after_prefect"] = [round(x, 2) for x in os.getloadavg()]
    report["mlflow_tracker"] = tracking_costs(env, args.rounds)
    print("mlflow:", report["mlflow_tracker"], flush=True)
    load["after_mlflow"] = [round(x, 2) for x in os.getloadavg()]

    with tempfile.TemporaryDirectory(prefix="overhead-home-") as home:
        home_path = Path(home)
        runs = {}
        for key, tracking in (("own_server", True), ("tracking_off", False)):
            runs[key] = fedsieve_run(env, args.rounds, home_path, tracking=tracking, api_url=None)
            print(f"fedsieve run ({key}): {runs[key]['wall_s']} s", flush=True)
            load[f"after_run_{key}"] = [round(x, 2) for x in os.getloadavg()]
        if not args.skip_server:
            with prefect_server_running({**env, "PREFECT_HOME": home}) as url:
                runs["running_server"] = fedsieve_run(
                    env, args.rounds, home_path, tracking=True, api_url=url
                )
            print(
                f"fedsieve run (running server): {runs['running_server']['wall_s']} s", flush=True
            )
        report["fedsieve_run"] = runs
        if not args.skip_dvc:
            report["dvc"] = dvc_costs(env, args.rounds, home_path)
            print("dvc:", report["dvc"], flush=True)
            load["after_dvc"] = [round(x, 2) for x in os.getloadavg()]

    own, off = runs["own_server"], runs["tracking_off"]
    compute = sum(own["tasks_by_name_s"].get(name, 0.0) for name in COMPUTE_TASKS)
    in_tasks = sum(own["tasks_by_name_s"].values())
    report["attribution_fedsieve_run"] = {
        "wall_s": own["wall_s"],
        "compute_s": round(compute, 2),
        "overhead_s": round(own["wall_s"] - compute, 2),
        "outside_pipeline_flow_s": round(own["wall_s"] - (own["pipeline_flow_s"] or 0.0), 2),
        "other_tasks_s": round(in_tasks - compute, 2),
        "tasks_by_name_s": own["tasks_by_name_s"],
        "tracking_on_minus_off_s": round(own["wall_s"] - off["wall_s"], 2),
        "running_server_wall_s": runs.get("running_server", {}).get("wall_s"),
        "target_overhead_s": 15.0,
    }
    report["load_avg"] = load
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["attribution_fedsieve_run"], indent=2))
    return report


if __name__ == "__main__":
    main()
