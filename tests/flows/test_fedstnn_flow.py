"""The FedStNN experiment flow end to end on a tiny preset: report, figures, MLflow run."""

from __future__ import annotations

import json
import os

import pytest
from mlflow import MlflowClient

import tasks.fedstnn
from flows.fedstnn import fedstnn_flow
from tasks.fedstnn import load_fedstnn_params

pytestmark = pytest.mark.e2e

TINY = """\
1d_noniid_60:
  trainer: smp
  federation: {rounds: 2, fraction: 0.5, local: {epochs: 2}}
  model: {n_paths: 4}
  n_clients: 10
  n_groups: 5
  n_points: 500
  main_points: 20
  other_points: 4
  eval_paths: 8
"""


def test_fedstnn_flow_writes_its_report_and_tracks_the_run(project, prefect_server):
    (project / "fedstnn.yaml").write_text(TINY)
    overrides = load_fedstnn_params(project / "fedstnn.yaml", "1d_noniid_60")

    metrics = fedstnn_flow("1d_noniid_60", overrides, project)

    report = json.loads((project / "reports" / "fedstnn" / "1d_noniid_60.json").read_text())
    for key in ("mse", "sigma_pred", "sigma_rel_error", "coverage_2sigma"):
        assert report[key] == pytest.approx(metrics[key])
    assert report["config"]["federation"]["rounds"] == 2
    assert report["config"]["partition"] == "noniid"
    assert list((project / "reports" / "fedstnn").glob("1d_noniid_60-*.png"))
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    [run] = client.search_runs([client.get_experiment_by_name("fedsieve-fedstnn").experiment_id])
    assert run.data.tags["experiment"] == "1d_noniid_60"
    assert run.data.metrics["coverage_2sigma"] == pytest.approx(metrics["coverage_2sigma"])
    assert len(client.get_metric_history(run.info.run_id, "global_mse")) == 2
    assert run.info.status == "FINISHED" and run.data.params["federation.rounds"] == "2"
    assert run.data.params["trainer"] == "smp"
    assert run.data.params["federation.local.gradient"] == "smp"
    local = report["config"]["federation"]["local"]
    assert local["optimizer"] == "sgd" and local["loss"] == "squared_error"


def test_a_failed_experiment_is_on_the_record_as_failed(project, prefect_server, monkeypatch):
    def broken(name, **overrides):
        raise RuntimeError("diverged")

    monkeypatch.setattr(tasks.fedstnn, "run_experiment", broken)

    with pytest.raises(RuntimeError, match="diverged"):
        fedstnn_flow("2d", {"federation": {"rounds": 3}}, project)

    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    [run] = client.search_runs([client.get_experiment_by_name("fedsieve-fedstnn").experiment_id])
    assert run.info.status == "FAILED"
    assert run.data.tags["experiment"] == "2d" and run.data.params["federation.rounds"] == "3"


def test_a_file_that_is_no_mapping_of_experiments_is_refused_naming_them(tmp_path):
    (tmp_path / "bad.yaml").write_text("- 1d_iid\n")

    with pytest.raises(ValueError, match=r"expected a mapping of experiments \(1d_iid, "):
        load_fedstnn_params(tmp_path / "bad.yaml", "2d")


def test_unknown_settings_are_refused_naming_the_key(tmp_path):
    (tmp_path / "bad.yaml").write_text("2d: {federation: {roundz: 3}}\n")

    with pytest.raises(ValueError, match=r"2d: federation.roundz is not a setting here"):
        load_fedstnn_params(tmp_path / "bad.yaml", "2d")


def test_an_unknown_trainer_is_refused_naming_the_choices(tmp_path):
    (tmp_path / "bad.yaml").write_text("2d: {trainer: adam}\n")

    with pytest.raises(ValueError, match="unknown trainer 'adam'; available: autograd, smp"):
        load_fedstnn_params(tmp_path / "bad.yaml", "2d")
