"""A comparison grid's cells: what they share is done once, and a cell gives the numbers
the whole pipeline gives for the same params."""

from __future__ import annotations

import csv
import json
import os

import pytest
from mlflow import MlflowClient

from config.params import load_params
from federated.data import load_medmnist
from flows.evaluate import evaluate_flow
from flows.partition import partition_flow
from flows.train import train_flow
from tasks.grid import default_threads, grid_cells, partition_key, partitions_for, run_grid_cell

GRID = (
    "compare={methods: {fedavg: {}, krum: {aggregate: {name: krum, f: 1}}}, "
    "attacks: [{name: sign_flip}], fractions: [0.25], seeds: [0, 1]}"
)
SMALL = ["partition.num_clients=5", "train.rounds=2", "train.local_epochs=1", GRID]


def test_each_distinct_partition_is_drawn_once_and_shared(project, medmnist_root):
    params = load_params(project / "params.yaml", SMALL)
    cells = grid_cells(params, project)
    data = load_medmnist("breastmnist", medmnist_root)

    parts = partitions_for.fn(cells, data)

    assert len(cells) == 4 and len(parts) == 2  # one partition per seed
    by_seed = {cell.seed: parts[partition_key(cell.params)][0] for cell in cells}
    assert not all((a == b).all() for a, b in zip(by_seed[0], by_seed[1], strict=True))


def test_a_method_changes_the_train_settings_it_names_and_keeps_the_rest(project):
    methods = (
        "compare={methods: {fedavg: {}, fedadam: {train: {server_optimizer: {name: adam}}}, "
        "scaffold: {train: {scaffold: true, momentum: 0}}}, attacks: [{name: none}]}"
    )
    params = load_params(project / "params.yaml", [*SMALL[:-1], methods])

    cells = {cell.method: cell.params.train for cell in grid_cells(params, project)}

    assert cells["fedavg"].server_step() == ("sgd", {"lr": 1.0}) and not cells["fedavg"].scaffold
    assert cells["fedadam"].server_step() == ("adam", {})
    assert cells["scaffold"].scaffold and cells["scaffold"].momentum == 0
    assert all(train.rounds == 2 for train in cells.values())  # the run's own, kept


def test_the_default_threads_share_the_cores_out():
    cores = len(os.sched_getaffinity(0))

    assert default_threads(1) == cores
    assert default_threads(cores) == 1
    assert default_threads(4 * cores) == 1


def read_column(path, key):
    with path.open() as handle:
        return [float(row[key]) for row in csv.DictReader(handle)]


@pytest.mark.e2e
def test_a_cell_gives_the_pipelines_numbers_and_is_tracked_as_a_child(
    project, medmnist_root, prefect_server
):
    params = load_params(project / "params.yaml", SMALL)
    cell = next(c for c in grid_cells(params, project) if c.method == "krum" and c.seed == 1)
    data = load_medmnist("breastmnist", medmnist_root)
    parts = partitions_for.fn([cell], data)[partition_key(cell.params)]

    result = run_grid_cell(cell, data, parts, project / "cell", None)
    partition_flow(cell.params, project / "pipeline")
    train_flow(cell.params, project / "pipeline")
    pipeline = evaluate_flow(cell.params, project / "pipeline")

    for key in ("test_acc", "test_auc", "test_loss", "rounds", "total_false_positives"):
        assert result["metrics"][key] == pytest.approx(pipeline[key], abs=1e-9), key
    cell_rounds = project / "cell" / "reports" / "rounds.csv"
    assert read_column(cell_rounds, "test_acc") == read_column(
        project / "pipeline" / "reports" / "rounds.csv", "test_acc"
    )
    assert result["accuracy"] == read_column(cell_rounds, "test_acc")
    metrics = json.loads((project / "cell" / "reports" / "metrics.json").read_text())
    assert metrics["rounds"] == 2
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("fedsieve").experiment_id
    [run] = client.search_runs([experiment], f"tags.cell = '{cell.name}'")
    assert run.info.status == "FINISHED" and run.info.run_name == cell.name
    assert [m.step for m in client.get_metric_history(run.info.run_id, "test_acc")] == [1, 2]
    assert run.data.metrics["final_test_acc"] == pytest.approx(result["metrics"]["test_acc"])


def test_a_cell_is_checked_with_its_own_methods_settings_only(project):
    """FedProx's prox_mu beside SCAFFOLD in one grid: each cell carries its own train
    settings and no grid, so SCAFFOLD's cell is not refused for FedProx's μ."""
    methods = (
        "compare={methods: {fedprox: {train: {prox_mu: 0.01}}, "
        "scaffold: {train: {scaffold: true, momentum: 0}}}, attacks: [{name: none}]}"
    )
    params = load_params(project / "params.yaml", [*SMALL[:-1], methods])

    cells = {cell.method: cell.params for cell in grid_cells(params, project)}

    assert cells["fedprox"].train.prox_mu == 0.01 and not cells["fedprox"].train.scaffold
    assert cells["scaffold"].train.scaffold and cells["scaffold"].train.prox_mu == 0
    assert all("compare" not in cell.model_fields_set for cell in cells.values())
