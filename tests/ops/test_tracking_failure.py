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

pytestmark = pytest.mark.e2e

TINY = ["partition.num_clients=3", "train.rounds=1", "train.local_epochs=1", "train.device=cpu"]


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
    assert metrics == unreachable_run["results"] and metrics["rounds"] == 1
    assert {"test_acc", "test_auc", "test_loss"} <= set(metrics)
    for name in ("rounds.csv", "exclusions.csv", "partition.json"):
        assert (project / "reports" / name).exists(), name
    checkpoint = torch.load(project / "artifacts/checkpoints/train.pt", weights_only=True)
    assert checkpoint["state"]["round"] == 1 and checkpoint["run_id"] is None
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
