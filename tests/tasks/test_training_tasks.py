"""``build_federation`` turns validated params into the engine's Federation."""

from pathlib import Path

import numpy as np
import pytest
import torch

from config.params import Params, load_params
from federated.data import load_medmnist, to_tensors
from federated.metrics import scores_of
from federated.partition import build_partitioner
from federated.server import RoundReport
from tasks.evaluation import ReportedSites, final_scores
from tasks.partition import split_partition
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


def test_scored_at_the_sites_a_simulation_pools_the_clients_local_test_splits(medmnist_root):
    at_sites = ["eval.where=sites", "noniid.every=0", "noniid.final=false", "train.device=cpu"]
    params = load_params(REPO_PARAMS, overrides=[*PARAMS, "train.rounds=2", *at_sites])
    data = load_medmnist("breastmnist", medmnist_root)
    split = split_partition(data.train.targets, "iid", 3, 0, {}, 0, 0.2)

    federation = build_federation.fn(params, data, split.clients, None, split.local_tests)
    state = train_rounds.fn(federation, federation.initial_state(), 2)

    assert federation.evaluation.test is None and federation.evaluation.val is None
    images, targets = to_tensors(data.train, data.info)
    held = torch.as_tensor(np.concatenate(split.local_tests))
    logits = federation.global_model(state)(images[held]).detach()
    together = scores_of(logits, targets[held], multi_label=False)
    last = state.history[-1]
    assert last["test_acc"] == pytest.approx(together["acc"])
    assert last["test_auc"] == pytest.approx(together["auc"], abs=1e-3)
    assert not any(key.startswith("val_") for key in last)
    run_info = {"rounds": 2, "selected_round": 2}
    scored = ReportedSites([row for row in state.sites if row["round"] == 2])
    model = federation.selected_model(state)
    results, _ = final_scores(model, params, None, scored, state.history, run_info)
    assert {k: v for k, v in results.items() if k.startswith("test_")} == {
        k: v for k, v in last.items() if k.startswith("test_")
    }
