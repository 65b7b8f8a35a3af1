"""``build_federation`` turns validated params into the engine's Federation."""

from pathlib import Path

import numpy as np
import pytest

from config.params import Params, load_params
from federated.data import load_medmnist
from federated.partition import build_partitioner
from federated.server import RoundReport
from tasks.training import build_federation, few_local_steps, report_metrics, train_rounds

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


def test_a_setting_whose_clients_take_too_few_steps_is_warned_about():
    # 20 BreastMNIST clients of 22 images at batch 32: two SGD steps a round
    params = Params.model_validate({"train": {"batch_size": 32, "local_epochs": 2}})
    small = [np.arange(22)] * 19 + [np.arange(30)]

    warning = few_local_steps(params, small)

    assert warning is not None and "22 images" in warning and "2 SGD step(s)" in warning
    assert "lower train.batch_size or raise train.local_epochs" in warning
    roomy = Params.model_validate({"train": {"batch_size": 16, "local_epochs": 2}})
    assert few_local_steps(roomy, small) is None  # four steps


def test_each_clients_own_epsilon_under_local_dp_is_logged_under_its_own_name():
    rows = [{"client": 0, "train_loss": 0.5, "privacy_epsilon": 1.25},
            {"client": 3, "reason": "client_error"}]  # fmt: skip
    metrics = report_metrics(RoundReport(2, {"privacy_epsilon": 0.9}, rows))
    assert metrics == {"privacy_epsilon": 0.9, "client_loss/0": 0.5, "privacy_epsilon/0": 1.25}
