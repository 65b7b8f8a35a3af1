"""A comparison grid's cells: each one the train stage's run with its extras off.

A cell (method × attack × fraction × seed) is one federated training through the same
round loop, reports and final scoring as the pipeline's train and evaluate stages
(:func:`tasks.training.train_federation`, :func:`tasks.training.write_reports`,
:func:`tasks.evaluation.final_results`), with :data:`CELL_OUTPUTS`: no per-round
checkpoint (a cell is rerun, not resumed), no figures, no model file. What every cell of
a grid shares is done once: the dataset is loaded once, and each distinct partition
(seed and partition settings) is drawn once. Per cell there is one Prefect task, one
MLflow child run (its params and tags when it starts; its per-round metrics, final
metrics and reports when it ends), and the reports under
``artifacts/compare/<cell>/reports/``; no pre-test. The validation split is scored every
round only when ``eval.select: best_val`` needs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from config.errors import RunHalted
from config.params import AttackParams, Params
from federated.data import MedMNISTData
from tasks.data import data_root
from tasks.evaluation import final_results
from tasks.partition import Partition, split_partition
from tasks.reports import ProjectPaths
from tasks.stopping import RunStopped, stop_if_requested
from tasks.tracking import Tracker, flatten_params, run_tags
from tasks.training import (
    RunOutputs,
    federation_from_params,
    train_federation,
    trained_model_noniid,
    write_reports,
)

__all__ = [
    "Cell",
    "cell_threads",
    "grid_cells",
    "partition_key",
    "partitions_for",
    "run_cell_on_worker",
    "run_grid_cell",
]


@dataclass(frozen=True)
class Cell:
    """One cell of the grid: its coordinates and its full, validated params."""

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
    """Every cell of the grid as validated params (cells never register models)."""
    # the settings given, not every default: a default is not a setting a cell would ignore
    base = params.model_dump(mode="json", exclude_unset=True)
    base.setdefault("data", {})["root"] = str(data_root(params.data.root, workdir))
    base.setdefault("tracking", {})["register_model"] = False  # cells live elsewhere
    cells = []
    grid = params.compare
    for attack in grid.attacks:
        for fraction in grid.fractions if attack.name != "none" else [0.0]:
            for method, spec in grid.methods.items():
                for seed in grid.seeds:
                    # a cell is one run: it carries no grid (another method's train
                    # settings are no cell's business)
                    child = {key: value for key, value in base.items() if key != "compare"}
                    child["train"] = {**base.get("train", {}), **spec.train}
                    child.update(
                        seed=seed,
                        aggregate=spec.aggregate.model_dump(mode="json"),
                        filters=[f.model_dump(mode="json") for f in spec.filters],
                        preaggregators=[p.model_dump(mode="json") for p in spec.preaggregators],
                        attack=cell_attack(attack, fraction),
                    )
                    cells.append(
                        Cell(method, attack.name, fraction, seed, Params.model_validate(child))
                    )
    return cells


def cell_attack(attack: AttackParams, fraction: float) -> dict[str, Any]:
    """A cell's attack settings: the grid's attack at ``fraction`` (none takes none)."""
    settings = attack.model_dump(mode="json", exclude_unset=True)
    return settings if attack.name == "none" else {**settings, "fraction": fraction}


def partition_key(params: Params) -> str:
    """What a partition depends on: the dataset, the seed and the partition settings."""
    return json.dumps(
        [params.data.dataset, params.seed, params.partition.model_dump(mode="json")],
        sort_keys=True,
    )


@task(name="partition-grid", cache_policy=NO_CACHE)
def partitions_for(cells: Sequence[Cell], data: MedMNISTData) -> dict[str, Partition]:
    """Each distinct partition of the grid, drawn once (cells of the same seed share it)."""
    parts: dict[str, Partition] = {}
    for cell in cells:
        key = partition_key(cell.params)
        if key not in parts:
            scheme = cell.params.partition
            parts[key] = split_partition(
                data.train.targets, scheme.scheme, scheme.num_clients, cell.params.seed,
                scheme.partitioner_params(), scheme.root_size, scheme.local_test,
            )  # fmt: skip
    return parts


def default_threads(max_parallel: int) -> int:
    """Torch threads per cell when ``max_parallel`` cells train at once: the machine's
    cores shared out, at least one."""
    return max(
        1,
        (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        // max_parallel,
    )


@contextlib.contextmanager
def cell_threads(threads: int) -> Iterator[None]:
    """Torch's intra-op threads for the block (one pool for the process: the cells that
    train at once share it, ``threads`` each)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# A cell is the train stage with its extras off: no per-round checkpoints (it is rerun, not
# resumed), no figures, no model file, no per-round log lines (hundreds of cells at once).
CELL_OUTPUTS = RunOutputs(checkpoints=False, figures=False, model_file=False, progress=False)


@task(name="run-grid-cell", cache_policy=NO_CACHE)
def run_grid_cell(
    cell: Cell,
    data: MedMNISTData,
    parts: Partition,
    workdir: Path,
    parent_run_id: str | None,
) -> dict[str, Any]:
    """Train one cell as the train stage does (the same round loop, reports and final
    scoring, with :data:`CELL_OUTPUTS`); its final metrics and accuracy per round (what
    the grid's summary needs)."""
    params, paths = cell.params, ProjectPaths(workdir)
    tracker = open_cell_run(cell, workdir, parent_run_id)
    with tracker.ended_on_failure():
        federation = federation_from_params(
            params, data, parts.clients, parts.root, parts.local_tests,
            validation_every_round=False,
        )  # fmt: skip
        state = train_federation(
            federation, federation.initial_state(), params, tracker, None, CELL_OUTPUTS
        )
        model = federation.selected_model(state)
        trained_noniid = trained_model_noniid(federation, model, params)
        write_reports(paths, model, state, params, tracker, trained_noniid, CELL_OUTPUTS)
        run_info = {"rounds": state.round, "selected_round": state.selected_round}
        results = final_results(
            model, params, data, paths, parts.held_local_tests, state.history, run_info,
            figures=False,
        )  # fmt: skip
        tracker.log_metrics({f"final_{k}": v for k, v in results.items() if v is not None})
        if state.halted is not None:  # fail closed: the cell, and so the grid, stops here
            raise RunHalted(f"{cell.name}: {state.halted}")
        tracker.end()
    return {"metrics": results, "accuracy": [row["test_acc"] for row in state.history]}


def open_cell_run(cell: Cell, workdir: Path, parent_run_id: str | None) -> Tracker:
    """The cell's MLflow run, a named child of the grid's, with its params and tags."""
    params = cell.params
    tracker = Tracker(params.tracking.experiment)
    tags = run_tags(params, workdir) | {"cell": cell.name}
    if parent_run_id is not None:
        tags["mlflow.parentRunId"] = parent_run_id
    tracker.start(run_id=None, run_name=cell.name, tags=tags)
    tracker.log_params(flatten_params(params.model_dump(mode="json")))
    return tracker


WORKER_POLL_SECONDS = 2  # how often a dispatched cell's state is read


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

    params = cell.params.model_dump(mode="json", exclude_unset=True)
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
