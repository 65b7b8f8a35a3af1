"""End to end: the real flows on BreastMNIST under one Prefect test server, tracked in a
throw-away MLflow store; a killed run resumed; `dvc repro` in a temporary repository."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import mlflow.pytorch
import numpy as np
import pytest
import torch
import yaml
from mlflow import MlflowClient

from config.assembly import build_global_model
from config.params import load_params
from federated.data import dataset_info, load_medmnist, to_tensors
from flows.evaluate import evaluate_flow
from flows.partition import partition_flow
from flows.pipeline import pipeline_flow
from flows.pretest import pretest_flow
from flows.train import train_flow
from tests.limits import limit, poll
from tests.prefect_homes import made_home

REPO = Path(__file__).resolve().parents[2]
SMALL = ["partition.num_clients=3", "train.local_epochs=1", "eval.target_acc=0.5"]

pytestmark = pytest.mark.e2e


def read_rounds(project: Path) -> list[dict[str, str]]:
    with (project / "reports" / "rounds.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_pipeline_flow_tracks_every_round_and_registers_the_model(project, prefect_server):
    params = load_params(
        project / "params.yaml", [*SMALL, "train.rounds=2", "eval.select=best_val"]
    )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = pipeline_flow(params, project)

    metrics = json.loads((project / "reports" / "metrics.json").read_text())
    assert metrics == results
    # trained channels-last on CPU, saved and logged in the default layout
    saved = torch.load(project / "artifacts/model/model.pt", weights_only=True)
    assert all(tensor.is_contiguous() for tensor in saved.values())
    assert not [w for w in caught if "No complete tensor" in str(w.message)]
    assert {"test_acc", "test_auc", "test_loss", "rounds"} <= set(metrics) and metrics[
        "rounds"
    ] == 2
    assert metrics["rounds_to_target"] == 1
    val_aucs = [float(row["val_auc"]) for row in read_rounds(project)]
    assert metrics["selected_round"] == 1 + val_aucs.index(max(val_aucs))
    assert metrics["val_auc"] == pytest.approx(max(val_aucs))  # the selected round's model
    for name in (
        "partition.json",
        "partition.png",
        "rounds.csv",
        "exclusions.csv",
        "curves.png",
        "pretest.png",
        "calibration.png",
    ):
        assert (project / "reports" / name).exists(), name
    pretest = json.loads((project / "reports" / "pretest.json").read_text())
    assert (
        pretest["n_tests"] > 0
        and 0 <= pretest["shapiro_rate"] <= 1
        and 0 <= pretest["anderson_rate"] <= 1
    )
    noniid = json.loads((project / "reports" / "noniid.json").read_text())
    assert (
        noniid["threshold"] == 0.25
        and noniid["verdict"] in ("iid", "non_iid")
        and noniid["cv"] >= 0
    )
    assert 0 <= metrics["test_ece"] <= 1 and 0 <= metrics["test_brier"] <= 1  # calibration
    trained = noniid["trained_model"]  # the paper's check: the trained model, every client
    assert trained["verdict"] in ("iid", "non_iid") and len(trained["client_losses"]) == 3
    run = assert_the_run_is_tracked(project, metrics, trained)
    assert_every_site_is_scored(project, metrics, run)
    assert_the_registered_model_is_the_saved_one(params, metrics, saved, run)


def test_scored_at_the_sites_the_pretest_trains_its_rounds_as_training_would(
    project, prefect_server
):
    """``eval.where: sites`` in a simulation: the pretest's rounds (scored, as training's
    are, on the clients' local test splits) run on the same federation."""
    at_sites = ["eval.where=sites", "noniid.every=0", "noniid.final=false", "pretest.round=1"]
    params = load_params(project / "params.yaml", [*SMALL, *at_sites])

    partition_flow(params, project)
    result = pretest_flow(params, project)

    assert result["n_tests"] > 0 and (project / "reports" / "pretest.json").exists()


def assert_the_run_is_tracked(project, metrics, trained):
    """The MLflow run of a 2-round pipeline: params, tags, metrics by round, reports,
    dataset inputs."""
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    [run] = client.search_runs([client.get_experiment_by_name("fedsieve").experiment_id])
    assert run.info.run_name == "breastmnist-fedavg" and run.info.status == "FINISHED"
    assert (
        run.data.params["train.rounds"] == "2" and run.data.params["partition.num_clients"] == "3"
    )
    assert run.data.tags["dataset"] == "breastmnist" and len(run.data.tags["params_hash"]) == 12
    history = client.get_metric_history(run.info.run_id, "test_acc")
    assert [m.step for m in history] == [1, 2]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "client_loss/2")] == [1, 2]
    assert run.data.metrics["final_test_auc"] == pytest.approx(metrics["test_auc"])
    assert "pretest_shapiro_rate" in run.data.metrics and "noniid_cv" in run.data.metrics
    assert run.data.metrics["noniid_cv_trained"] == pytest.approx(trained["cv"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "reports")}
    assert {"reports/rounds.csv", "reports/metrics.json", "reports/exclusions.csv"} <= artifacts
    assert "reports/calibration.png" in artifacts
    experiment = client.get_experiment_by_name("fedsieve")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    inputs = {
        (i.dataset.name, i.tags[0].value): i.dataset.digest
        for i in client.get_run(run.info.run_id).inputs.dataset_inputs
    }
    assert inputs[("breastmnist", "train")] == dataset_info("breastmnist").md5
    partition = project / "artifacts" / "partition" / "clients.npz"
    assert inputs[("partition", "partition")] == hashlib.md5(partition.read_bytes()).hexdigest()
    return run


def assert_every_site_is_scored(project, metrics, run):
    """Per-site evaluation: every site's local test split, every round, and the final
    model, in reports/ and in the MLflow run."""
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "reports")}
    sites = json.loads((project / "reports" / "sites.json").read_text())
    partition_report = json.loads((project / "reports" / "partition.json").read_text())
    held = [c["local_test"] for c in partition_report["clients"]]
    assert [row["n"] for row in sites["sites"]] == held and min(held) >= 1
    assert metrics["site_acc_worst"] == min(row["acc"] for row in sites["sites"])
    assert all(0 <= row["ece"] <= 1 and 0 <= row["brier"] <= 2 for row in sites["sites"])
    with (project / "reports" / "sites.csv").open() as handle:
        per_round = list(csv.DictReader(handle))
    assert {(int(r["round"]), int(r["site"])) for r in per_round} == {
        (r, s) for r in (1, 2) for s in range(3)
    }
    assert [m.step for m in client.get_metric_history(run.info.run_id, "site_acc/1")] == [1, 2]
    assert "site_acc_worst" in run.data.metrics and "final_site_acc_worst" in run.data.metrics
    assert {"reports/sites.csv", "reports/sites.png", "reports/sites.json"} <= artifacts
    assert "sites.json" in {a.path for a in client.list_artifacts(run.info.run_id)}


def assert_the_registered_model_is_the_saved_one(params, metrics, saved, run):
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    [version] = client.search_model_versions("name='fedsieve-breastmnist'")
    assert version.run_id == run.info.run_id
    # through the gate: registered, and the champion (there was none)
    assert client.get_model_version_by_alias("fedsieve-breastmnist", "champion").version == (
        version.version
    )
    tags = client.get_run(run.info.run_id).data.tags
    assert (tags["gate.registration"], tags["gate.champion"]) == ("passed", "passed")
    # what a user does next: load the champion and apply it; it is the saved model, read
    # the way training read its images
    data = load_medmnist(params.data.dataset, Path(os.environ["MEDMNIST_ROOT"]))
    images, _ = to_tensors(data.test, data.info)
    registered = mlflow.pyfunc.load_model("models:/fedsieve-breastmnist@champion")
    classifier = registered.unwrap_python_model().classifier
    saved_model = build_global_model(params, data.info)
    saved_model.load_state_dict(saved)
    with torch.no_grad():
        expected = saved_model.eval()(images)
    applied = classifier.predict_images(data.test.images).probabilities
    assert np.allclose(applied, torch.softmax(expected, 1).numpy(), atol=1e-5)
    assert metrics["test_acc"] == pytest.approx(
        (expected.argmax(1) == torch.as_tensor(data.test.targets).view(-1)).float().mean().item()
    )


def test_a_spent_privacy_budget_ends_the_run_cleanly_with_the_last_admissible_model(
    project, prefect_server
):
    overrides = [
        *SMALL, "train.rounds=4", "partition.local_test=0", "privacy.mode=central",
        "privacy.noise_multiplier=5", "privacy.target_epsilon=1.2",
        # a small clip keeps the noise (std z·C/m) from breaking the model: a round whose
        # updates all break releases nothing and spends no ε, so it would not end the run
        "privacy.clip=0.01",
        "tracking.register_model=false",  # two noisy rounds: not a model the gate registers
    ]  # fmt: skip
    params = load_params(project / "params.yaml", overrides)

    results = pipeline_flow(params, project)

    assert results["rounds"] == 2  # ε after 3 rounds would be 1.446 > 1.2
    assert results["privacy_epsilon"] == pytest.approx(1.158, abs=1e-3)
    assert [float(r["privacy_epsilon"]) for r in read_rounds(project)] == [
        pytest.approx(0.795, abs=1e-3),
        pytest.approx(1.158, abs=1e-3),
    ]
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    [run] = client.search_runs([client.get_experiment_by_name("fedsieve").experiment_id])
    assert run.info.status == "FINISHED"
    assert "round 3 would take ε to 1.446" in run.data.tags["stopped_early"]
    assert (
        run.data.tags["privacy"] == "central" and run.data.tags["privacy_epsilon_holds"] == "true"
    )
    assert run.data.metrics["final_privacy_epsilon"] == pytest.approx(results["privacy_epsilon"])
    # without local test splits: no per-site numbers, and files that say why
    assert "site_acc_worst" not in results
    assert json.loads((project / "reports" / "sites.json").read_text())["sites"] == []
    assert (project / "reports" / "sites.csv").read_text().startswith("round,site,n,")


def test_a_killed_run_resumes_to_the_same_final_metrics(
    project, prefect_server, tmp_path, medmnist_root
):
    overrides = [*SMALL, "train.rounds=8"]
    params = load_params(project / "params.yaml", overrides)
    partition_flow(params, project)
    train_flow(params, project)
    evaluate_flow(params, project)
    uninterrupted_rounds = read_rounds(project)
    uninterrupted_metrics = json.loads((project / "reports" / "metrics.json").read_text())

    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copy(project / "params.yaml", killed / "params.yaml")
    partition_flow(params, killed)
    fedsieve = str(Path(sys.executable).parent / "fedsieve")
    command = [fedsieve, "train", "--resume", *[f"--set={o}" for o in overrides]]
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    process = subprocess.Popen(
        command, cwd=killed, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    checkpoint = killed / "artifacts" / "checkpoints" / "train.pt"
    deadline = time.monotonic() + limit(240)
    while time.monotonic() < deadline and process.poll() is None:
        state = torch.load(checkpoint, weights_only=True) if checkpoint.exists() else None
        if state is not None and state["state"]["round"] >= 2:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = torch.load(checkpoint, weights_only=True)["state"]["round"]
    assert 2 <= killed_at < 8, "the run should have been killed mid-way"

    train_flow(params, killed, resume=True)
    evaluate_flow(params, killed)

    assert read_rounds(killed) == uninterrupted_rounds
    assert json.loads((killed / "reports" / "metrics.json").read_text()) == uninterrupted_metrics
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            torch.load(project / "artifacts/model/model.pt", weights_only=True).values(),
            torch.load(killed / "artifacts/model/model.pt", weights_only=True).values(),
            strict=True,
        )
    )
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run_id = json.loads((killed / "artifacts/model/tracking.json").read_text())["run_id"]
    assert sorted({m.step for m in client.get_metric_history(run_id, "test_acc")}) == list(
        range(1, 9)
    )
    assert client.get_run(run_id).info.status == "FINISHED"  # reopened, then closed


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def _git_output(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def pipeline_repo(root: Path, medmnist_root: Path, rounds: int) -> tuple[Path, dict[str, str]]:
    """A git repository holding the DVC pipeline (3 clients, ``rounds`` rounds); the
    environment to run dvc in it with its own MLflow store and no Prefect server."""
    repo = root / "repo"
    repo.mkdir()
    for name in ("dvc.yaml", "params.yaml", ".gitignore", ".dvcignore"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, repo / name)
    for folder in (
        "federated", "aggregation", "models", "registry", "tasks", "flows", "config", "fedsieve",
        "flowerapp",
        ".dvc",
    ):  # fmt: skip
        shutil.copytree(
            REPO / folder,
            repo / folder,
            ignore=shutil.ignore_patterns("__pycache__", "tmp", "cache"),
        )
    text = (repo / "params.yaml").read_text()
    text = text.replace("num_clients: 10", "num_clients: 3").replace(
        "rounds: 20", f"rounds: {rounds}"
    )
    (repo / "params.yaml").write_text(text.replace("local_epochs: 2", "local_epochs: 1"))
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.email=ci@example.com", "-c", "user.name=ci", "add", "-A")
    _git(repo, "-c", "user.email=ci@example.com", "-c", "user.name=ci", "commit", "-qm", "pipeline")
    made_home(repo / ".prefect")  # where `fedsieve` keeps it, ignored by git: a clone has none
    env = {
        **{k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "MEDMNIST_ROOT": str(medmnist_root),
        "MLFLOW_TRACKING_URI": f"sqlite:///{repo / 'mlflow.db'}",
    }
    return repo, env


def terminated_in_its_train_stage(repo: Path, env: dict[str, str]) -> None:
    """`fedsieve dvc repro` stopped by SIGTERM (kill, a scheduler) in its train stage, 500
    rounds long: the stage ends with it (it used to train on, orphaned, against the server
    its parent had stopped) and its MLflow run is closed as KILLED."""
    committed = (repo / "params.yaml").read_text()
    (repo / "params.yaml").write_text(committed.replace("  rounds: 2\n", "  rounds: 500\n"))
    command = subprocess.Popen(
        [str(Path(sys.executable).parent / "fedsieve"), "dvc", "repro"],
        cwd=repo,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        poll(
            "the train stage",
            lambda: command.poll() is not None or (repo / "artifacts" / "checkpoints").exists(),
            timeout=limit(240),
            interval=0.2,
        )
        assert command.poll() is None, f"make run ended before its train stage ({command.poll()})"
        command.terminate()
        assert command.wait(timeout=limit(60)) == 128 + signal.SIGTERM
    finally:
        command.kill()
    assert not [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit() and _cwd_of(pid) == repo  # no stage, no dvc left in the project
    ]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "KILLED"
    (repo / "params.yaml").write_text(committed)


def _cwd_of(pid: str) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def test_dvc_repro_exp_run_and_metrics_diff(tmp_path, medmnist_root, prefect_server):
    repo, shared_server_env = pipeline_repo(tmp_path, medmnist_root, rounds=2)
    env = {**shared_server_env, "PREFECT_API_URL": prefect_server}
    dvc = [str(Path(sys.executable).parent / "dvc")]
    terminated_in_its_train_stage(repo, shared_server_env)

    # `make run` again: no PREFECT_API_URL, one server shared by the stages it runs (the
    # partition the terminated one made is kept; the others depend on the rounds)
    repro = subprocess.run(
        [str(Path(sys.executable).parent / "fedsieve"), "dvc", "repro"],
        cwd=repo,
        env=shared_server_env,
        capture_output=True,
        text=True,
        timeout=limit(600),
    )
    output = repro.stdout + repro.stderr
    assert repro.returncode == 0, output[-6000:]
    assert "Prefect server for every stage: http://127.0.0.1" in output, output[-6000:]
    assert "Starting temporary server" not in output, output[-6000:]  # no stage started one
    assert "Stage 'partition' didn't change, skipping" in output, output[-6000:]
    assert all(f"Running stage '{st}'" in output for st in ("pretest", "train", "evaluate"))
    first = json.loads((repo / "reports" / "metrics.json").read_text())
    assert first["rounds"] == 2
    again = subprocess.run(
        [*dvc, "repro"], cwd=repo, env=env, capture_output=True, text=True, timeout=limit(300)
    )
    assert "didn't change, skipping" in again.stdout

    _git(repo, "add", "dvc.lock", "reports")  # what DVC expects git to track is not ignored
    tracked = _git_output(repo, "diff", "--cached", "--name-only").split()
    assert {"dvc.lock", "reports/metrics.json", "reports/rounds.csv"} <= set(tracked)
    _git(repo, "-c", "user.email=ci@example.com", "-c", "user.name=ci", "commit", "-qm", "baseline")
    assert_a_fresh_clone_reproduces_the_committed_baseline(repo, env)
    exp = subprocess.run(
        [*dvc, "exp", "run", "-S", "train.rounds=3"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=limit(600),
    )
    assert exp.returncode == 0, exp.stdout[-3000:] + exp.stderr[-3000:]
    assert "Running stage 'partition'" not in exp.stdout  # only what depends on rounds re-ran
    diff = subprocess.run(
        [*dvc, "metrics", "diff", "--json"], cwd=repo, env=env, capture_output=True, text=True
    )
    changes = json.loads(diff.stdout)["reports/metrics.json"]
    assert changes["rounds"] == {"old": 2, "new": 3, "diff": 1}
    show = subprocess.run(
        [*dvc, "exp", "show", "--json"], cwd=repo, env=env, capture_output=True, text=True
    )
    assert show.returncode == 0, show.stderr[-3000:]

    def rounds_of(entry: dict) -> int:
        return entry["data"]["params"]["params.yaml"]["data"]["train"]["rounds"]

    [baseline] = [entry for entry in json.loads(show.stdout) if entry["rev"] != "workspace"]
    experiments = [group["revs"][0] for group in baseline["experiments"] or []]
    # the committed baseline, and the experiment beside it
    assert [rounds_of(baseline), *map(rounds_of, experiments)] == [2, 3], show.stdout[-3000:]


def assert_a_fresh_clone_reproduces_the_committed_baseline(repo: Path, env: dict) -> None:
    """`make run` in a fresh clone (no artifacts, no DVC cache, its own MLflow store) writes
    the committed dvc.lock and reports bit for bit: `git status` stays clean. Its MLflow
    run is closed with its model registered, though training gave the committed bits (DVC
    once skipped the evaluate stage then, and left the run RUNNING without a model). On
    the session's Prefect server (``env``): the test's first `make run` starts its own."""
    clone = repo.parent / "clone"
    _git(repo.parent, "clone", "-q", str(repo), str(clone))
    store = f"sqlite:///{clone / 'mlflow.db'}"
    repro = subprocess.run(
        [str(Path(sys.executable).parent / "fedsieve"), "dvc", "repro"],
        cwd=clone,
        env={**env, "MLFLOW_TRACKING_URI": store},
        capture_output=True,
        text=True,
        timeout=limit(600),
    )
    assert repro.returncode == 0, (repro.stdout + repro.stderr)[-6000:]
    status = _git_output(clone, "status", "--porcelain", "--untracked-files=no")
    assert status == "", status
    client = MlflowClient(store)
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED" and "final_test_auc" in run.data.metrics
    [version] = client.search_model_versions("name='fedsieve-breastmnist'")
    assert version.run_id == run.info.run_id


def test_the_baseline_dvc_compares_against_is_committed():
    # a fresh clone's `dvc metrics diff` and `dvc exp show` need the default pipeline's
    # dvc.lock and its metrics in git, the metrics matching the lock
    tracked = set(_git_output(REPO, "ls-files", "dvc.lock", "reports").split())
    assert {"dvc.lock", "reports/metrics.json", "reports/rounds.csv"} <= tracked
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())
    [metrics] = [
        o for o in lock["stages"]["evaluate"]["outs"] if o["path"] == "reports/metrics.json"
    ]
    assert (
        metrics["md5"] == hashlib.md5((REPO / "reports" / "metrics.json").read_bytes()).hexdigest()
    )
