"""The whole pipeline as one Prefect flow: preflight, then partition -> pretest -> train ->
evaluate (the same stages, files and reports as ``dvc repro``; at real sites the partition
and pre-test stages only say that the sites hold the data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from config.params import Params
from flows.common import subflows_without_heartbeats
from flows.evaluate import evaluate_flow
from flows.partition import partition_flow
from flows.pretest import pretest_flow
from flows.train import train_flow
from tasks.preflight import preflight

__all__ = ["pipeline_flow"]


@flow(name="pipeline")
def pipeline_flow(
    params: Params,
    workdir: Path,
    resume: bool = False,
    parent_run_id: str | None = None,
    run_name: str | None = None,
) -> dict[str, Any]:
    """The four stages, after the preflight checks; ``parent_run_id``/``run_name`` make
    the MLflow run a named child (a cell of a comparison grid)."""
    preflight(params, workdir)
    with subflows_without_heartbeats():
        partition_flow(params, workdir)  # at real sites: the sites hold the data, said so
        pretest_flow(params, workdir)
        train_flow(params, workdir, resume=resume, parent_run_id=parent_run_id, run_name=run_name)
        return evaluate_flow(params, workdir)
