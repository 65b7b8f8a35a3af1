"""The cross-device benchmark's own parts: its synthetic task learns over rounds (so two
simulators' accuracy curves compare something), its clients are views of one tensor, and
its profile splits a run into phases that account for the run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.speed import cross_device


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    path = tmp_path_factory.mktemp("cross-device") / "task.npz"
    np.savez(path, **cross_device.synthetic_digits(6_000, 1_000, seed=0))
    return str(path)


def workload(task: str, rounds: int = 1, as_bytes: bool = False) -> dict:
    """100 clients of the task, 10 a round, the logistic model."""
    return {"data": task, "clients": 100, "per_round": 10, "rounds": rounds,
            "model": "logreg", "as_bytes": as_bytes}  # fmt: skip


def test_the_task_has_a_learning_curve_not_a_first_round_answer(task, capsys):
    result = cross_device.engine_run(workload(task, rounds=15), 1)

    accuracy = result["acc"]
    assert len(accuracy) == 15 and result["batched"]
    assert accuracy[0] < 0.5  # ten overlapping classes: no answer after one round
    assert accuracy[-1] > accuracy[0] + 0.2  # ... and a rise over the rounds
    assert capsys.readouterr().out.strip().endswith("}")  # the JSON line the parent reads


def test_clients_share_one_tensor_in_partition_order(task):
    federation, _ = cross_device.build_federation(cross_device.Workload(**workload(task)))

    first, last = federation.clients[0], federation.clients[-1]
    assert first.images.untyped_storage().data_ptr() == last.images.untyped_storage().data_ptr()
    assert sum(len(c) for c in federation.clients) == 6_000


def test_the_profile_accounts_for_the_run_by_phase(task):
    profile = cross_device.profile_breakdown(workload(task, rounds=3), 1)

    seconds = profile["seconds"]
    assert set(seconds) == {
        "sampling", "data gathering", "local steps", "aggregation", "evaluation",
        "rest of the round", "before the rounds",
    }  # fmt: skip
    assert all(value >= 0 for value in seconds.values())
    assert sum(seconds.values()) == pytest.approx(profile["profiled_s"], abs=0.01)
    assert seconds["local steps"] > 0 and seconds["evaluation"] > 0


def test_clients_kept_as_bytes_train_as_the_float_images_do(task, capsys):
    floats = cross_device.engine_run(workload(task, rounds=5), 1)
    as_bytes = cross_device.engine_run(workload(task, rounds=5, as_bytes=True), 1)

    federation, _ = cross_device.build_federation(
        cross_device.Workload(**workload(task, as_bytes=True))
    )
    assert federation.clients[0].images.dtype == torch.uint8
    assert as_bytes["acc"] == pytest.approx(floats["acc"], abs=0.01)
