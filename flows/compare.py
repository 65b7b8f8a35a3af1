"""Comparison flow: a grid of methods x attacks x malicious fractions x seeds, each cell a
full pipeline run (its own directory under artifacts/compare/) tracked as a child of one
MLflow parent run, then one summary table and two plots.

``compare.dispatch: local`` runs the cells in this process, concurrently up to
``compare.max_parallel`` (Prefect's thread-pool task runner). ``deployment`` submits every
cell at once as a run of ``compare.deployment`` (``pipeline-from-file``), so the sweep
spreads over every worker of that pool; the cells' results are then read back from the
shared MLflow server (a worker's files stay on its machine).
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from fedsieve.config import Params
from flows.common import (
    RunStopped,
    stop_if_requested,
    stoppable_runs,
    subflows_without_heartbeats,
)
from flows.evaluate import evaluate_flow
from flows.partition import partition_flow
from flows.train import train_flow
from tasks.comparison import CellResult, write_comparison_reports
from tasks.data import data_root
from tasks.tracking import Tracker, child_run_results, flatten_params, run_tags

__all__ = ["Cell", "compare_flow", "grid_cells"]

WORKER_POLL_SECONDS = 2  # how often a dispatched cell's state is read


@dataclass(frozen=True)
class Cell:
    method: str
    attack: str
    fraction: float
    seed: int
    params: Params

    @property
    def name(self) -> str:
        return f"{self.method}-{self.attack}-f{self.fraction:g}-s{self.seed}"

    @property
    def scenario(self) -> str:
        return f"{self.attack} @ {self.fraction:g}"


def grid_cells(params: Params, workdir: Path) -> list[Cell]:
    """Every cell of the grid as validated params (children never register models)."""
    base = params.model_dump(mode="json")
    base["data"]["root"] = str(data_root(params.data.root, workdir))  # children live elsewhere
    base["tracking"]["register_model"] = False
    cells = []
    grid = params.compare
    for attack in grid.attacks:
        for fraction in grid.fractions if attack.name != "none" else [0.0]:
            for method, spec in grid.methods.items():
                for seed in grid.seeds:
                    child = dict(base)
                    child.update(
                        seed=seed,
                        aggregate=spec.aggregate.model_dump(mode="json"),
                        filters=[f.model_dump(mode="json") for f in spec.filters],
                        attack={**attack.model_dump(mode="json"), "fraction": fraction},
                    )
                    cells.append(
                        Cell(method, attack.name, fraction, seed, Params.model_validate(child))
                    )
    return cells


@task(name="run-cell", cache_policy=NO_CACHE)
def run_cell(cell: Cell, root: Path, parent_run_id: str | None) -> dict[str, Any]:
    workdir = root / cell.name
    workdir.mkdir(parents=True, exist_ok=True)
    partition_flow(cell.params, workdir)
    train_flow(cell.params, workdir, parent_run_id=parent_run_id, run_name=cell.name)
    metrics = evaluate_flow(cell.params, workdir)
    with (workdir / "reports" / "rounds.csv").open() as handle:
        accuracy = [float(row["test_acc"]) for row in csv.DictReader(handle)]
    return {"metrics": metrics, "accuracy": accuracy}


@task(name="run-cell-on-a-worker", cache_policy=NO_CACHE)
def run_cell_on_worker(
    cell: Cell, deployment: str, parent_run_id: str, configured_data_root: str
) -> None:
    """One cell as a deployment run (blocks until it ends); its MLflow run is the parent's
    child named after the cell, in ``artifacts/compare/<cell>`` of the worker's checkout.
    Should the grid be stopped meanwhile, the run is cancelled (its worker stops it)."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    params = cell.params.model_dump(mode="json")
    params["data"]["root"] = configured_data_root  # resolved on the worker, not here
    flow_run = run_deployment(
        deployment,
        parameters={
            "params": params,
            "workdir": f"artifacts/compare/{cell.name}",
            "parent_run_id": parent_run_id,
            "run_name": cell.name,
        },
        flow_run_name=cell.name,
        timeout=0,  # created, not awaited: the wait below can be stopped
    )
    with get_client(sync_client=True) as client:
        while flow_run.state is None or not flow_run.state.is_final():
            try:
                stop_if_requested()
            except RunStopped:
                client.set_flow_run_state(
                    flow_run.id, Cancelling(message="its comparison was stopped"), force=True
                )
                raise
            time.sleep(WORKER_POLL_SECONDS)
            flow_run = client.read_flow_run(flow_run.id)
    state = flow_run.state
    if state is None or not state.is_completed():
        raise RuntimeError(
            f"comparison cell {cell.name}: deployment run {flow_run.name!r} ended "
            f"{state.name if state else 'without a state'}"
            f"{f': {state.message}' if state and state.message else ''}"
        )


def run_cells_on_workers(
    params: Params, cells: list[Cell], parent_run_id: str | None
) -> list[dict[str, Any]]:
    """Every cell submitted at once to ``compare.deployment``; results from MLflow."""
    if parent_run_id is None:
        raise RuntimeError(
            "compare.dispatch: deployment reads the cells' results from MLflow, and tracking "
            "is off for this run; set MLFLOW_TRACKING_URI to the workers' tracking server"
        )
    with ThreadPoolTaskRunner(max_workers=len(cells)) as runner, stoppable_runs():
        futures = [
            runner.submit(
                run_cell_on_worker,
                {
                    "cell": cell,
                    "deployment": params.compare.deployment,
                    "parent_run_id": parent_run_id,
                    "configured_data_root": params.data.root,
                },
            )
            for cell in cells
        ]
        for future in futures:
            future.result()
    children = child_run_results(parent_run_id)
    missing = [cell.name for cell in cells if cell.name not in children]
    if missing:
        raise RuntimeError(
            f"comparison cells {', '.join(missing)} finished but have no MLflow run under "
            f"parent {parent_run_id}: the workers must track to the same MLflow server"
        )
    return [children[cell.name] for cell in cells]


def run_cells_here(
    params: Params, cells: list[Cell], root: Path, parent_run_id: str | None
) -> list[dict[str, Any]]:
    """Every cell in this process, ``compare.max_parallel`` at a time (Prefect's thread-pool
    task runner); a failed or cancelled grid stops the running cells at their next round."""
    with (
        ThreadPoolTaskRunner(max_workers=params.compare.max_parallel) as runner,
        stoppable_runs(),
        subflows_without_heartbeats(),  # the runner copies it into its threads
    ):
        futures = [
            runner.submit(run_cell, {"cell": c, "root": root, "parent_run_id": parent_run_id})
            for c in cells
        ]
        return [future.result() for future in futures]


@flow(name="compare")
def compare_flow(params: Params, workdir: Path) -> list[dict[str, Any]]:
    logger = get_run_logger()
    cells = grid_cells(params, workdir)
    parent = Tracker(params.tracking.experiment)
    parent.start(
        run_id=None,
        run_name=f"compare-{params.data.dataset}",
        tags=run_tags(params, workdir) | {"kind": "compare", "cells": str(len(cells))},
    )
    with parent.ended_on_failure():  # a cancelled or failed grid is not left RUNNING
        parent.log_params(flatten_params({"compare": params.compare.model_dump(mode="json")}))
        logger.info("comparison grid: %d runs (%s)", len(cells), params.compare.dispatch)
        if params.compare.dispatch == "deployment":
            results = run_cells_on_workers(params, cells, parent.run_id)
        else:
            results = run_cells_here(
                params, cells, workdir / "artifacts" / "compare", parent.run_id
            )
        done: list[CellResult] = [
            (c.method, c.attack, c.fraction, c.seed, c.scenario, r)
            for c, r in zip(cells, results, strict=True)
        ]
        rows, markdown = write_comparison_reports(
            workdir / "reports" / "compare", done, list(params.compare.methods), parent
        )
        parent.end()
    logger.info("comparison summary:\n%s", markdown)
    return rows
