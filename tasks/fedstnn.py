"""FedStNN tasks: validated experiment settings, the experiment itself, its figures
(:mod:`tasks.plots_fedstnn`), its report and MLflow run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from config.errors import ConfigError
from federated.fedstnn.experiments import (
    EXPERIMENTS,
    ExperimentResult,
    experiment_config,
    run_experiment,
)
from tasks.plots_fedstnn import save_fedstnn_figures
from tasks.reports import write_json
from tasks.tracking import Tracker, flatten_params, git_commit

__all__ = [
    "load_fedstnn_params",
    "open_fedstnn_run",
    "plot_fedstnn",
    "run_fedstnn",
    "write_fedstnn_report",
]

EXPERIMENT = "fedsieve-fedstnn"  # the MLflow experiment of every FedStNN run


def load_fedstnn_params(path: Path, name: str) -> dict[str, Any]:
    """The overrides for experiment ``name`` in ``path`` (nested as the experiment's
    settings are), checked against the preset's settings and values (a one-line
    :class:`ConfigError` otherwise)."""
    if name not in EXPERIMENTS:
        raise ConfigError(
            f"unknown FedStNN experiment {name!r}; available: {', '.join(EXPERIMENTS)}"
        )
    try:
        experiments = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"{path}: {str(error).splitlines()[0]}") from None
    if not isinstance(experiments, dict):
        raise ConfigError(f"{path}: expected a mapping of experiments ({', '.join(EXPERIMENTS)})")
    overrides = experiments.get(name) or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"{path}: {name} takes a mapping of settings, got {overrides!r}")
    try:
        experiment_config(name, **overrides)  # validates the names and the values
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{path}: {name}: {error}") from None
    return overrides


@task(name="open-fedstnn-run", cache_policy=NO_CACHE)
def open_fedstnn_run(name: str, config: dict[str, Any], workdir: Path) -> Tracker:
    """The experiment's MLflow run, open from the start with its parameters, so a failed
    or killed experiment is on the record too."""
    tracker = Tracker(EXPERIMENT)
    tags = {"kind": "fedstnn", "experiment": name, "git_commit": git_commit(workdir)}
    tracker.start(run_id=None, run_name=f"fedstnn-{name}", tags=tags)
    tracker.log_params({k: v for k, v in flatten_params(config).items() if v is not None})
    return tracker


@task(name="run-fedstnn-experiment", cache_policy=NO_CACHE)
def run_fedstnn(name: str, overrides: dict[str, Any]) -> ExperimentResult:
    return run_experiment(name, **overrides)


@task(name="plot-fedstnn-figures", cache_policy=NO_CACHE)
def plot_fedstnn(
    name: str, result: ExperimentResult, workdir: Path, tracker: Tracker
) -> list[Path]:
    """``reports/fedstnn/<name>-<figure>.png``, each logged to the run."""
    paths = save_fedstnn_figures(result, workdir / "reports" / "fedstnn", name)
    for path in paths:
        tracker.log_artifact(path, "fedstnn")
    return paths


@task(name="write-fedstnn-report", cache_policy=NO_CACHE)
def write_fedstnn_report(
    name: str, config: dict[str, Any], result: ExperimentResult, workdir: Path, tracker: Tracker
) -> dict[str, float]:
    """``reports/fedstnn/<name>.json``, the per-round and final metrics logged to the run."""
    out = workdir / "reports" / "fedstnn"
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{name}.json", {"experiment": name, **result.metrics, "config": config})
    for step, row in enumerate(result.history, start=1):
        numbers = {k: float(v) for k, v in row.items() if isinstance(v, int | float)}
        tracker.log_metrics(numbers, step=step)
    tracker.log_metrics(result.metrics)
    tracker.log_artifact(out / f"{name}.json", "fedstnn")
    get_run_logger().info(
        "FedStNN %s: %s", name, ", ".join(f"{k}={v:.4g}" for k, v in result.metrics.items())
    )
    return result.metrics
