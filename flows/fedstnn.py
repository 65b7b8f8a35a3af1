"""FedStNN experiments (Sections 5.1-5.3 of the paper) as Prefect flows: run one preset
with the overrides from its params set, write reports/fedstnn/<name>.json and its figures,
and track it in MLflow (parameters, per-round global metrics, final metrics, figures)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from federated.fedstnn.experiments import (
    EXPERIMENTS,
    ExperimentResult,
    experiment_config,
    run_experiment,
)
from fedsieve.reports import write_json
from fedsieve.tracking import Tracker, flatten_params
from flows.common import git_commit

__all__ = ["fedstnn_flow", "load_fedstnn_params"]

PARAMS_FILE = "experiments/fedstnn/params.yaml"


def load_fedstnn_params(path: Path, name: str) -> dict[str, Any]:
    """The overrides for experiment ``name``, checked against the preset's fields."""
    if name not in EXPERIMENTS:
        raise ValueError(
            f"unknown FedStNN experiment {name!r}; available: {', '.join(EXPERIMENTS)}"
        )
    overrides = (yaml.safe_load(path.read_text()) or {}).get(name) or {}
    fields = {f.name for f in dataclasses.fields(EXPERIMENTS[name])}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"{path}: {name}.{unknown[0]} is not a setting of this experiment; allowed: {', '.join(sorted(fields))}"
        )
    experiment_config(name, **overrides)  # validates the values
    return overrides


@task(name="run-fedstnn-experiment", cache_policy=NO_CACHE)
def run_fedstnn(name: str, overrides: dict[str, Any]) -> ExperimentResult:
    return run_experiment(name, **overrides)


@flow(name="fedstnn")
def fedstnn_flow(name: str, overrides: dict[str, Any], workdir: Path) -> dict[str, float]:
    logger = get_run_logger()
    config = dataclasses.asdict(experiment_config(name, **overrides))
    # The run exists from the start, so a failed or killed experiment is on the record too
    # (closed FAILED or KILLED), with its parameters.
    tracker = Tracker("fedsieve-fedstnn")
    tracker.start(
        run_id=None,
        run_name=f"fedstnn-{name}",
        tags={"kind": "fedstnn", "experiment": name, "git_commit": git_commit(workdir)},
    )
    tracker.log_params(flatten_params({k: v for k, v in config.items() if v is not None}))
    with tracker.ended_on_failure():
        result = run_fedstnn(name, overrides)
        out = workdir / "reports" / "fedstnn"
        figures = {}
        for key, figure in result.figures.items():
            path = out / f"{name}-{key}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            figure.savefig(path, dpi=110)
            figures[key] = path
        report = {"experiment": name, **result.metrics, "config": config}
        write_json(out / f"{name}.json", report)
        for step, row in enumerate(result.history, start=1):
            tracker.log_metrics(
                {k: float(v) for k, v in row.items() if isinstance(v, int | float)}, step=step
            )
        tracker.log_metrics(result.metrics)
        tracker.log_artifact(out / f"{name}.json", "fedstnn")
        for path in figures.values():
            tracker.log_artifact(path, "fedstnn")
    tracker.end()
    logger.info(
        "FedStNN %s: %s", name, ", ".join(f"{k}={v:.4g}" for k, v in result.metrics.items())
    )
    return result.metrics
