"""The deployable pipeline (what workers run) checks its params before anything runs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from mlflow import MlflowClient

from config.errors import ConfigError
from flows.deployment import pipeline_from_file

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["aggregate={name: krum, f: 4}"], "aggregate (krum) with 10 clients per round"),
        (["partition.num_clients=600"], "fewer clients"),
        (["train.rounds=0"], "train.rounds = 0"),
    ],
)
def test_a_deployment_run_with_bad_params_fails_before_anything_runs(
    project, prefect_server, overrides, expected
):
    workdir = project / "checkout"
    workdir.mkdir()
    shutil.copy(REPO / "params.yaml", workdir / "params.yaml")

    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        pipeline_from_file(overrides=overrides, workdir=str(workdir))

    assert sorted(p.name for p in workdir.iterdir()) == ["params.yaml"]  # no reports
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])
