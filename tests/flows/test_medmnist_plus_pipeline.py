"""The pipeline at a MedMNIST+ size: partition, train and evaluate on a 64 px file (a
fabricated BreastMNIST of the right shape under a test-only md5: the ``breast_64``
fixture), the data file and model checked at that size."""

from __future__ import annotations

import json

import torch

from config.params import load_params
from flows.evaluate import evaluate_flow
from flows.partition import partition_flow
from flows.train import train_flow


def test_the_pipeline_trains_and_evaluates_at_64_px(
    project, prefect_server, breast_64, monkeypatch
):
    monkeypatch.setenv("MEDMNIST_ROOT", str(breast_64.path.parent))
    params = load_params(
        project / "params.yaml",
        [
            "data.size=64",
            "partition.num_clients=3",
            "train.rounds=1",
            "train.local_epochs=1",
            "tracking.register_model=false",
        ],  # random images: no model the gate would register
    )

    partition_flow(params, project)
    train_flow(params, project)
    evaluate_flow(params, project)

    metrics = json.loads((project / "reports" / "metrics.json").read_text())
    assert 0 <= metrics["test_acc"] <= 1 and metrics["rounds"] == 1
    state = torch.load(project / "artifacts" / "model" / "model.pt", weights_only=True)
    assert state["head.1.weight"].shape[1] == 64 * 7 * 7  # the 7x7 map the adaptive pool gives
    assert len(json.loads((project / "reports" / "sites.json").read_text())["sites"]) == 3
