"""Tracking unreachable (MLFLOW_TRACKING_URI at a closed loopback port): the pipeline still
trains and evaluates, writes reports/ and the checkpoint, and says what happened."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from config.environment import MLFLOW_HTTP_FAIL_FAST
from config.params import load_params
from flows.pipeline import pipeline_flow
from tests.limits import limit

pytestmark = pytest.mark.e2e

# three rounds: the first model that passes the registration gate (federated/gate.py)
TINY = ["partition.num_clients=3", "train.rounds=3", "train.local_epochs=1", "train.device=cpu"]


class Records(logging.Handler):
    """WARNING and above from every logger that could state the failure."""

    LOGGERS = ("", "prefect", "fedsieve", "mlflow", "urllib3")

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.records: dict[int, logging.LogRecord] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.records[id(record)] = record  # a record reaching two handlers counts once

    def mentioning(self, *needles: str) -> list[logging.LogRecord]:
        return [r for r in self.records.values() if any(n in r.getMessage() for n in needles)]


@pytest.fixture(scope="module")
def unreachable_run(
    tmp_path_factory: pytest.TempPathFactory, medmnist_root: Path, prefect_server: str, ops
) -> Iterator[dict[str, Any]]:
    """One pipeline run against a closed port, shared by the assertions below."""
    project = tmp_path_factory.mktemp("unreachable")
    (project / "params.yaml").write_text((ops.repo / "params.yaml").read_text())
    uri = f"http://127.0.0.1:{ops.free_port()}"  # nothing listens there
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MEDMNIST_ROOT")}
    os.environ.update(MLFLOW_TRACKING_URI=uri, MEDMNIST_ROOT=str(medmnist_root))
    handler = Records()
    for name in Records.LOGGERS:
        logging.getLogger(name).addHandler(handler)
    try:
        results = pipeline_flow(load_params(project / "params.yaml", TINY), project)
    finally:
        for name in Records.LOGGERS:
            logging.getLogger(name).removeHandler(handler)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield {"project": project, "uri": uri, "results": results, "logs": handler}


def test_mlflow_gives_up_within_seconds_not_minutes():
    # set by `import fedsieve` unless the user chose otherwise
    for key, value in MLFLOW_HTTP_FAIL_FAST.items():
        assert os.environ[key] == value
    assert int(os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]) <= 3


def test_training_goes_on_and_everything_is_kept_locally(unreachable_run):
    project = unreachable_run["project"]
    metrics = json.loads((project / "reports" / "metrics.json").read_text())
    assert metrics == unreachable_run["results"] and metrics["rounds"] == 3
    assert {"test_acc", "test_auc", "test_loss"} <= set(metrics)
    for name in ("rounds.csv", "exclusions.csv", "partition.json"):
        assert (project / "reports" / name).exists(), name
    checkpoint = torch.load(project / "artifacts/checkpoints/train.pt", weights_only=True)
    assert checkpoint["state"]["round"] == 3 and checkpoint["run_id"] is None
    model = torch.load(project / "artifacts/model/model.pt", weights_only=True)
    assert model and all(isinstance(v, torch.Tensor) for v in model.values())


def test_the_tracker_names_the_unreachable_server(unreachable_run):
    uri = unreachable_run["uri"]
    stated = [r for r in unreachable_run["logs"].mentioning(uri) if r.name == "fedsieve.tracking"]
    assert stated, "the failure must be stated"
    assert all("training goes on" in r.getMessage() for r in stated)
    assert not [r for r in unreachable_run["logs"].records.values() if r.exc_info]


def test_the_failure_is_stated_once(unreachable_run):
    port = unreachable_run["uri"].rsplit(":", 1)[1]
    statements = unreachable_run["logs"].mentioning(f":{port}", "port=" + port)
    assert len(statements) == 1, [f"{r.name}: {r.getMessage()[:120]}" for r in statements]


class MlflowServer:
    """``mlflow server`` on a loopback port with its store in ``folder``; stopped (by its
    PID) and started again on the same port and store: an outage a client cannot tell
    from a database gone away."""

    def __init__(self, ops: Any, processes: Any, folder: Path) -> None:
        self.ops, self.processes, self.folder = ops, processes, folder
        self.url = f"http://127.0.0.1:{ops.free_port()}"
        self.process: Any = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        port = self.url.rsplit(":", 1)[1]
        self.process = self.processes.start(
            self.ops.mlflow_server(port, self.folder),
            name=f"mlflow-{self.starts}", cwd=self.folder, env=self.ops.base_env(),
        )  # fmt: skip
        self.ops.wait_http(f"{self.url}/health", timeout=limit(600), process=self.process)

    def stop(self) -> None:
        self.processes.stop(self.process)


@pytest.fixture(scope="module")
def module_mlflow_server(ops: Any, processes: Any, tmp_path_factory: pytest.TempPathFactory):
    """One server for the module's outages (each test its own experiment and model names):
    a start costs about 20 s on a busy 2-core machine."""
    server = MlflowServer(ops, processes, tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def mlflow_server(module_mlflow_server: MlflowServer) -> MlflowServer:
    """The module's server, answering when the test starts (one a failed test left stopped
    is started again)."""
    if module_mlflow_server.process.poll() is not None:
        module_mlflow_server.start()
    return module_mlflow_server


def test_a_server_with_the_job_switch_off_runs_no_job_runner(mlflow_server: MlflowServer) -> None:
    """With ``MLFLOW_SERVER_NO_JOBS`` (as the compose service and the tests' servers have
    it), MLflow's job runner and its huey consumers (for GenAI jobs fedsieve does not use)
    are not started beside the server: they cost as much CPU as the server while it idles.
    MLflow launches them before its workers answer /health."""
    import psutil

    descendants = psutil.Process(mlflow_server.process.pid).children(recursive=True)
    commands = [" ".join(child.cmdline()) for child in descendants]
    assert commands, "the server started no worker"
    assert not [c for c in commands if "huey" in c or "jobs._job_runner" in c], commands


def test_a_model_the_store_missed_is_logged_and_registered_once_when_it_answers(
    mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    """The server goes away as the model is logged (the run's metrics already in): the
    model and its version are owed to the run; when it answers, one more try logs and
    registers it, and a later try does not register it twice."""
    from mlflow import MlflowClient

    from federated.data import dataset_info
    from federated.inference import save_classifier
    from models import build_model
    from tasks.tracking import Tracker

    tracker = Tracker("model-outage", mlflow_server.url)
    tracker.start(run_id=None, run_name="r", tags={})
    tracker.log_metrics({"final_test_acc": 0.8})
    info = dataset_info("breastmnist")
    model = build_model("logreg", in_channels=1, num_classes=2, image_size=28)
    classifier = save_classifier(tmp_path / "classifier", model, "logreg", info)

    def log_model() -> None:
        tracker.log_model(classifier, info, registered_name="owed")

    mlflow_server.stop()
    log_model()
    assert tracker.failed is not None
    assert not tracker.retried("the model", log_model)  # still away
    mlflow_server.start()
    assert tracker.retried("the model", log_model) and tracker.failed is None
    log_model()  # registered already: not again
    tracker.end()

    client = MlflowClient(mlflow_server.url)
    [version] = client.search_model_versions("name='owed'")
    assert version.run_id == tracker.run_id
    assert client.get_run(tracker.run_id).info.status == "FINISHED"


def test_a_run_reopened_while_its_store_is_away_stays_that_run_when_the_store_returns(
    mlflow_server: MlflowServer, monkeypatch
) -> None:
    """The evaluate stage reopens the training run while the server is away, and the
    server answers again just after that call gave up (found by make container-faults:
    the model went to a new run and the training run stayed without its version). The
    record stays owed to the training run; no second run is created."""
    from mlflow import MlflowClient

    from tasks.tracking import Tracker

    training = Tracker("reopened", mlflow_server.url)
    training.start(run_id=None, run_name="r", tags={})
    training.end()
    real_get_run = MlflowClient.get_run

    def away_then_back(client: MlflowClient, run_id: str) -> Any:
        mlflow_server.stop()
        try:
            return real_get_run(client, run_id)
        finally:
            mlflow_server.start()  # back before the tracker's next call

    monkeypatch.setattr(MlflowClient, "get_run", away_then_back)
    evaluation = Tracker("reopened", mlflow_server.url)
    evaluation.start(run_id=training.run_id, run_name="", tags={})
    monkeypatch.setattr(MlflowClient, "get_run", real_get_run)

    assert evaluation.run_id == training.run_id and evaluation.failed is not None
    assert evaluation.retried(
        "the final results", lambda: evaluation.log_metrics({"final_test_acc": 0.8})
    )
    evaluation.end()
    client = MlflowClient(mlflow_server.url)
    experiment = client.get_experiment_by_name("reopened")
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [
        training.run_id
    ]
    assert client.get_run(training.run_id).data.metrics["final_test_acc"] == 0.8


def test_a_store_away_at_evaluation_fails_the_stage_and_evaluate_later_registers_the_model(
    project: Path, prefect_server: str, mlflow_server: MlflowServer, monkeypatch
) -> None:
    """No green run without its model: the tracking server away while the evaluate stage
    logs the final results and the model fails the stage in one line saying what to run
    (its reports kept); run once the server answers, the same MLflow run gets them and
    the model its version."""
    from mlflow import MlflowClient

    from config.errors import ServiceError
    from flows.evaluate import evaluate_flow
    from flows.partition import partition_flow
    from flows.train import train_flow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    params = load_params(project / "params.yaml", TINY)
    partition_flow(params, project)
    train_flow(params, project)
    mlflow_server.stop()

    with pytest.raises(ServiceError, match=r"run `fedsieve evaluate` .* once the tracking"):
        evaluate_flow(params, project)
    assert json.loads((project / "reports" / "metrics.json").read_text())["rounds"] == 3
    mlflow_server.start()
    results = evaluate_flow(params, project)

    client = MlflowClient(mlflow_server.url)
    run_id = json.loads((project / "artifacts/model/tracking.json").read_text())["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["final_test_acc"] == pytest.approx(results["test_acc"])
    [version] = client.search_model_versions(f"name='fedsieve-{params.data.dataset}'")
    assert version.run_id == run_id
