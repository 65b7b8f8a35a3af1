"""``build_federation`` turns validated params into the engine's Federation."""

from pathlib import Path

import pytest

from config.params import load_params
from federated.data import load_medmnist
from federated.partition import build_partitioner
from tasks.training import build_federation, train_rounds

REPO_PARAMS = Path(__file__).resolve().parents[2] / "params.yaml"
PARAMS = ["partition.num_clients=3", "model.name=small_cnn"]


@pytest.mark.parametrize(
    ("backend", "batched"), [("sequential", False), ("batched", True), ("auto", False)]
)
def test_train_backend_picks_how_clients_are_trained_auto_is_sequential_on_cpu(
    medmnist_root, tmp_path, backend, batched
):
    parallel = [] if backend == "sequential" else ["train.max_parallel=2"]  # else ignored
    params = load_params(
        REPO_PARAMS, overrides=[*PARAMS, f"train.backend={backend}", *parallel, "train.device=cpu"]
    )
    data = load_medmnist("breastmnist", medmnist_root)
    parts = build_partitioner("iid")(data.train.targets, 3, seed=0)

    federation = build_federation.fn(params, data, parts)

    assert federation.batched is batched
    if batched:
        assert federation.executor.max_parallel == 2
    state = train_rounds.fn(federation, federation.initial_state(), 1)
    assert state.history[-1]["clients_kept"] == 3
