"""FedStNN experiments (Sections 5.1-5.3 of the paper) as a Prefect flow: run one preset
with the overrides from its params set, write reports/fedstnn/<name>.json and its figures,
and track it in MLflow (parameters, per-round global metrics, final metrics, figures)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from prefect import flow

from federated.fedstnn.experiments import experiment_config
from tasks.fedstnn import open_fedstnn_run, plot_fedstnn, run_fedstnn, write_fedstnn_report

__all__ = ["fedstnn_flow"]


@flow(name="fedstnn")
def fedstnn_flow(name: str, overrides: dict[str, Any], workdir: Path) -> dict[str, float]:
    config = dataclasses.asdict(experiment_config(name, **overrides))
    tracker = open_fedstnn_run(name, config, workdir)
    with tracker.ended_on_failure():
        result = run_fedstnn(name, overrides)
        plot_fedstnn(name, result, workdir, tracker)
        metrics = write_fedstnn_report(name, config, result, workdir, tracker)
        tracker.end()
    return metrics
