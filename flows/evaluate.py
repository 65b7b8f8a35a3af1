"""Evaluate stage: the final global model on the test and validation splits (the hub's,
or under ``eval.where: sites`` the sites' pooled scores of the selected round: no data
file is opened here); final metrics to reports/metrics.json and MLflow, and the model
logged, and registered and made champion through the gate (tasks/registration.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from config.assembly import dataset_info_of
from config.errors import ModelRefused
from config.params import Params
from tasks.data import load_verified_dataset
from tasks.evaluation import log_final_results, reopen_training_run, score_final_model
from tasks.registration import crown_champion, publish_card, registration_gate
from tasks.reports import ProjectPaths

__all__ = ["evaluate_flow"]


@flow(name="evaluate")
def evaluate_flow(params: Params, workdir: Path) -> dict[str, Any]:
    paths = ProjectPaths(workdir)
    tracker, run_info = reopen_training_run(params, paths)
    with tracker.ended_on_failure():
        data = None
        if params.eval.where == "hub":
            data = load_verified_dataset(params.data, workdir)
        results, model = score_final_model(params, data, paths, run_info)
        gate = registration_gate(results, data, paths)
        version = log_final_results(tracker, params, paths, results, model, gate)
        if params.tracking.register_model and not gate.passed:
            raise ModelRefused(f"the model is not registered: {gate.reason}")
        if version is not None:
            info = dataset_info_of(params.data)
            champion = crown_champion(tracker, params, version, model, data, info, paths)
            gates = {"registration": gate, "champion": champion}
            publish_card(tracker, params, paths, results, run_info, version, gates, info)
        tracker.end()
    return results
