"""End to end on volumes: the whole pipeline (partition, normality pre-test, rounds under
an attack with a filter and a robust rule, CV non-IID check, evaluation) and the
comparison grid on real AdrenalMNIST3D volumes at 64 voxels with the small 3-D CNN.

So that the runs take seconds on CI's two cores, they read a seeded subset of the official
file's volumes (both classes in every split), written to a temporary folder and registered
under its own md5 in the test's copy of ``medmnist.INFO``, as the MedMNIST+ tests do
(conftest.py, ``breast_64``); the official file itself is checked in
tests/federated/test_data.py."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from config.params import load_params
from federated.data import file_md5, load_medmnist
from flows.compare import compare_flow
from flows.pipeline import pipeline_flow

pytestmark = pytest.mark.e2e
SUBSET = {"train": 96, "val": 24, "test": 32}  # volumes per split
VOLUMES = [
    "data.dataset=adrenalmnist3d",
    "data.size=64",
    "model.name=small_cnn3d",
    "tracking.register_model=false",
    "train.local_epochs=1",
    "train.batch_size=8",
]


@pytest.fixture
def adrenal_subset(adrenal_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A seeded subset of the official AdrenalMNIST3D-64 volumes as ``adrenalmnist3d_64.npz``
    under its own md5 and split sizes; MEDMNIST_ROOT points at it."""
    import federated.data as data_module

    official = load_medmnist("adrenalmnist3d", adrenal_root, 64)
    rng = np.random.default_rng(0)
    arrays = {}
    for split, count in SUBSET.items():
        part = getattr(official, split)
        by_class = [np.flatnonzero(part.targets == c) for c in (0, 1)]
        rows = np.sort(np.concatenate([rng.choice(r, count // 2, replace=False) for r in by_class]))
        arrays[f"{split}_images"] = part.images[rows]
        arrays[f"{split}_labels"] = part.labels[rows].astype(np.uint8)
    folder = tmp_path / "medmnist"
    folder.mkdir()
    np.savez_compressed(folder / "adrenalmnist3d_64.npz", **arrays)
    table = copy.deepcopy(data_module._info_table())
    table["adrenalmnist3d"]["MD5_64"] = file_md5(folder / "adrenalmnist3d_64.npz")
    table["adrenalmnist3d"]["n_samples"] = dict(SUBSET)
    monkeypatch.setattr(data_module, "_info_table", lambda: table)
    monkeypatch.setenv("MEDMNIST_ROOT", str(folder))
    return folder


def test_the_pipeline_trains_a_3d_cnn_on_volumes_under_attack_end_to_end(
    project, prefect_server, adrenal_subset
):
    params = load_params(
        project / "params.yaml",
        [
            *VOLUMES,
            "partition.num_clients=4",
            "train.rounds=2",
            "train.backend=batched",
            "attack={name: sign_flip, ids: [2]}",
            "aggregate={name: trimmed_mean, f: 1}",
            "filters=[{name: pid_made}]",
        ],
    )

    metrics = pipeline_flow(params, project)

    assert metrics["rounds"] == 2 and 0 <= metrics["test_acc"] <= 1
    assert 0 <= metrics["test_auc"] <= 1
    state = torch.load(project / "artifacts" / "model" / "model.pt", weights_only=True)
    assert state["features.0.weight"].shape == (16, 1, 3, 3, 3)  # a 3-D kernel
    pretest = json.loads((project / "reports" / "pretest.json").read_text())
    assert pretest["n_tests"] > 0 and 0 <= pretest["shapiro_rate"] <= 1
    noniid = json.loads((project / "reports" / "noniid.json").read_text())
    trained = noniid["trained_model"]  # the CV check on every client's volumes
    assert trained["verdict"] in ("iid", "non_iid") and len(trained["client_losses"]) == 4
    with (project / "reports" / "exclusions.csv").open() as handle:
        trail = list(csv.DictReader(handle))
    assert len(trail) == 8  # every (round, client)
    assert [row["malicious"] == "True" for row in trail] == [c == "2" for c in "0123" * 2]
    partition = json.loads((project / "reports" / "partition.json").read_text())
    assert partition["total"] + partition["local_test_total"] == SUBSET["train"]


def test_the_comparison_grid_runs_on_volumes(project, prefect_server, adrenal_subset):
    params = load_params(
        project / "params.yaml",
        [
            *VOLUMES,
            "partition.num_clients=3",
            "train.rounds=1",
            "pretest.round=0",
            "compare={methods: {fedavg: {}, median: {aggregate: {name: median}}}, "
            "attacks: [{name: label_flip}], fractions: [0.34], seeds: [0]}",
        ],
    )

    rows = compare_flow(params, project)

    assert [(r["method"], r["attack"]) for r in rows] == [
        ("fedavg", "label_flip"),
        ("median", "label_flip"),
    ]
    assert all(0 <= r["acc_mean"] <= 1 for r in rows)
