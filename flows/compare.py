"""Comparison flow: a grid of methods x attacks x malicious fractions x seeds, each cell a
federated training tracked as a child of one MLflow parent run, then one summary table
and two plots.

``compare.dispatch: local`` runs the cells in this process at the engine's own speed
(:mod:`tasks.grid`: the dataset loaded once, each partition drawn once, one task and one
MLflow run per cell), ``compare.max_parallel`` at a time on Prefect's thread-pool task
runner, each with ``compare.threads_per_cell`` torch threads. ``deployment`` submits every
cell at once as a run of ``compare.deployment`` (``pipeline-from-file``, the whole
pipeline), so the sweep spreads over every worker of that pool; the cells' results are
then read back from the shared MLflow server (a worker's files stay on its machine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from config.params import Params
from tasks.comparison import CellResult, open_grid_run, write_comparison_reports
from tasks.data import load_verified_dataset
from tasks.grid import (
    Cell,
    cell_threads,
    default_threads,
    grid_cells,
    partition_key,
    partitions_for,
    run_cell_on_worker,
    run_grid_cell,
)
from tasks.stopping import stoppable_runs
from tasks.tracking import child_run_results

__all__ = ["compare_flow"]


def run_cells_here(
    params: Params, cells: list[Cell], workdir: Path, parent_run_id: str | None
) -> list[dict[str, Any]]:
    """Every cell in this process, ``compare.max_parallel`` at a time; a failed or
    cancelled grid stops the running cells at their next round."""
    data = load_verified_dataset(params.data, workdir)
    partitions = partitions_for(cells, data)
    grid = params.compare
    threads = grid.threads_per_cell or default_threads(grid.max_parallel)
    root = workdir / "artifacts" / "compare"
    with (
        cell_threads(threads),
        ThreadPoolTaskRunner(max_workers=grid.max_parallel) as runner,
        stoppable_runs(),
    ):
        futures = [
            runner.submit(
                run_grid_cell,
                {
                    "cell": cell,
                    "data": data,
                    "parts": partitions[partition_key(cell.params)],
                    "workdir": root / cell.name,
                    "parent_run_id": parent_run_id,
                },
            )
            for cell in cells
        ]
        return [future.result() for future in futures]


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


@flow(name="compare")
def compare_flow(params: Params, workdir: Path) -> list[dict[str, Any]]:
    cells = grid_cells(params, workdir)
    parent = open_grid_run(params, workdir, len(cells))
    with parent.ended_on_failure():  # a cancelled or failed grid is not left RUNNING
        get_run_logger().info("comparison grid: %d cells (%s)", len(cells), params.compare.dispatch)
        if params.compare.dispatch == "deployment":
            results = run_cells_on_workers(params, cells, parent.run_id)
        else:
            results = run_cells_here(params, cells, workdir, parent.run_id)
        done = [
            CellResult(c.method, c.attack, c.fraction, c.seed, r["metrics"], r["accuracy"])
            for c, r in zip(cells, results, strict=True)
        ]
        rows, markdown = write_comparison_reports(
            workdir / "reports" / "compare", done, list(params.compare.methods), parent
        )
        parent.end()
    get_run_logger().info("comparison summary:\n%s", markdown)
    return rows
