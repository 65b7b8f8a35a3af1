"""A comparison grid's cells, run at the engine's own speed.

A cell (method × attack × fraction × seed) is one federated training: the engine's rounds
with nothing around them but what the grid's summary needs. What every cell of a grid
shares is done once: the dataset is loaded once, and each distinct partition (seed and
partition settings) is drawn once. Per cell there is one Prefect task, one MLflow child
run (its params and tags when it starts; its per-round metrics, final metrics and two
CSV reports when it ends), and ``rounds.csv``, ``exclusions.csv`` and ``metrics.json``
under ``artifacts/compare/<cell>/reports/``; no pre-test, no figures and no per-round
checkpoint (a cell is rerun, not resumed). The validation split is scored every round
only when ``eval.select: best_val`` needs it.
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

from federated.data import MedMNISTData
from federated.metrics import site_summary
from federated.server import Federation, ServerState
from fedsieve.config import Params
from fedsieve.errors import RunHalted
from tasks.data import data_root
from tasks.evaluation import detection_totals, privacy_spent, rounds_to_target
from tasks.partition import Partition, split_partition
from tasks.reports import write_csv, write_json
from tasks.stopping import RunStopped, stop_if_requested
from tasks.tracking import Tracker, flatten_params, run_tags
from tasks.training import federation_from_params, trail_columns

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
    base = params.model_dump(mode="json")
    base["data"]["root"] = str(data_root(params.data.root, workdir))  # cells live elsewhere
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
                        preaggregators=[p.model_dump(mode="json") for p in spec.preaggregators],
                        attack={**attack.model_dump(mode="json"), "fraction": fraction},
                    )
                    cells.append(
                        Cell(method, attack.name, fraction, seed, Params.model_validate(child))
                    )
    return cells


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


@task(name="run-grid-cell", cache_policy=NO_CACHE)
def run_grid_cell(
    cell: Cell,
    data: MedMNISTData,
    parts: Partition,
    workdir: Path,
    parent_run_id: str | None,
) -> dict[str, Any]:
    """Train one cell and write and log its results; its final metrics and accuracy per
    round (what the grid's summary needs)."""
    params = cell.params
    tracker = Tracker(params.tracking.experiment)
    tags = run_tags(params, workdir) | {"cell": cell.name}
    if parent_run_id is not None:
        tags["mlflow.parentRunId"] = parent_run_id
    tracker.start(run_id=None, run_name=cell.name, tags=tags)
    tracker.log_params(flatten_params(params.model_dump(mode="json")))
    with tracker.ended_on_failure():
        federation = federation_from_params(
            params, data, parts.clients, parts.root, parts.local_tests,
            validation_every_round=False,
        )  # fmt: skip
        state = federation.initial_state()
        while state.round < params.train.rounds and state.halted is None:
            if federation.budget_spent(state):  # the privacy budget: the cell ends cleanly
                break
            stop_if_requested()  # a cancelled or failed grid stops its cells between rounds
            state, _ = federation.run_round(state)
        results = cell_results(federation, state, params)
        reports = workdir / "reports"
        write_csv(reports / "rounds.csv", state.history)
        write_csv(reports / "exclusions.csv", state.trail, columns=trail_columns(state.trail))
        write_json(reports / "metrics.json", results)
        tracker.log_history(state.history)
        tracker.log_metrics({f"final_{k}": v for k, v in results.items() if v is not None})
        for name in ("rounds.csv", "exclusions.csv"):
            tracker.log_artifact(reports / name, "reports")
        if state.halted is not None:  # fail closed: the cell, and so the grid, stops here
            raise RunHalted(f"{cell.name}: {state.halted}")
        tracker.end()
    return {"metrics": results, "accuracy": [row["test_acc"] for row in state.history]}


def cell_results(federation: Federation, state: ServerState, params: Params) -> dict[str, Any]:
    """The cell's final numbers, with the keys of the pipeline's ``reports/metrics.json``."""
    scores = federation.evaluate(state, "test", selected=True)
    asr = federation.backdoor_asr(state, selected=True)
    sites = federation.site_scores(federation.selected_model(state)) if federation.sites else []
    return {
        **{f"test_{k}": v for k, v in scores.items()},
        **(site_summary(sites, params.eval.target_acc) if sites else {}),
        **({} if asr is None else {"backdoor_asr": asr}),
        "rounds": state.round,
        "selected_round": state.selected_round,
        "rounds_to_target": rounds_to_target(
            state.history, params.eval.target_acc, params.eval.target_loss
        ),
        **detection_totals(state.history),
        **privacy_spent(params, state.history),
    }


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
