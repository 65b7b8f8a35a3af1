"""Evaluate stage: the final global model on the test and validation splits (the hub's,
or under ``eval.where: sites`` the sites' pooled scores of the selected round: no data
file is opened here); final metrics to reports/metrics.json and MLflow, and the model
logged and registered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from config.assembly import dataset_info_of
from config.params import Params
from tasks.data import load_verified_dataset
from tasks.evaluation import log_final_results, reopen_training_run, score_final_model
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
        log_final_results(tracker, params, paths, results, model, dataset_info_of(params.data))
        tracker.end()
    return results
