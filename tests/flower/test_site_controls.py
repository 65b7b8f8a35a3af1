"""A site's SCAFFOLD variate on its own disk: the start of each round, a round asked
again, a run started afresh, and what it no longer keeps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flowerapp.site_controls import KEPT, ControlStore, ControlStoreError

RUN = "ab12cd34ef56"


def test_a_round_starts_from_the_variate_of_the_sites_last_round_before_it(tmp_path: Path) -> None:
    store = ControlStore(tmp_path, RUN)
    assert np.array_equal(store.before(1, 3), np.zeros(3, np.float32))  # never trained

    store.save(1, np.array([1.0, 2.0, 3.0]))
    store.save(3, np.array([4.0, 5.0, 6.0]))  # not sampled in round 2

    again = ControlStore(tmp_path, RUN)  # a site restarted: what its disk holds
    assert again.before(2, 3).tolist() == [1.0, 2.0, 3.0]
    assert again.before(3, 3).tolist() == [1.0, 2.0, 3.0]  # round 3 asked again
    assert again.before(4, 3).tolist() == [4.0, 5.0, 6.0]
    assert again.before(1, 3).tolist() == [0.0, 0.0, 0.0]  # a run started afresh


def test_a_round_asked_again_drops_what_came_after_it(tmp_path: Path) -> None:
    store = ControlStore(tmp_path, RUN)
    for round_number in (1, 2, 3):
        store.save(round_number, np.full(2, float(round_number)))

    store.save(2, np.full(2, 20.0))  # the hub resumed from round 1's checkpoint

    assert store.before(3, 2).tolist() == [20.0, 20.0]
    assert store.before(4, 2).tolist() == [20.0, 20.0]  # round 3's variate is gone


def test_a_start_it_no_longer_keeps_is_refused_in_one_line(tmp_path: Path) -> None:
    store = ControlStore(tmp_path, RUN)
    for round_number in range(1, KEPT + 2):
        store.save(round_number, np.full(2, float(round_number)))

    assert store.before(3, 2).tolist() == [2.0, 2.0]
    with pytest.raises(ControlStoreError, match=r"^round 2 starts from .* before 2, which"):
        store.before(2, 2)
    with pytest.raises(ControlStoreError, match="has 2 values; the model has 5"):
        store.before(5, 5)


def test_runs_keep_their_own_variates_and_a_bad_run_key_is_refused(tmp_path: Path) -> None:
    ControlStore(tmp_path, RUN).save(1, np.ones(2))

    assert ControlStore(tmp_path, "0" * 12).before(2, 2).tolist() == [0.0, 0.0]
    with pytest.raises(ControlStoreError, match=r"run key '\.\./x' is not the hub's params hash"):
        ControlStore(tmp_path, "../x")


def test_a_scaffold_task_trains_with_the_sites_own_variate_and_keeps_the_next_on_its_disk(
    tmp_path: Path,
) -> None:
    """A site's work on SCAFFOLD tasks (as its warm trainer or ClientApp runs it): round 1
    from c_i = 0, its Δc_i sent and c_i + Δc_i kept; round 2 from that c_i, as a simulated
    client (:func:`federated.client.train_client`) trains with the same variates; without
    a state folder, or with local DP, the task is refused in one line."""
    import torch

    from config.params import Params
    from federated.client import ClientData, ControlVariates, train_client
    from federated.data import dataset_info, load_digits
    from federated.metrics import loss_function
    from federated.vectors import model_to_vector
    from flowerapp.hub import site_task
    from flowerapp.jobs import Job
    from flowerapp.site_data import load_site_data, write_site_files
    from flowerapp.site_work import run_job
    from models import build_model
    from tasks.partition import split_partition
    from tests.flower.conftest import BASE_PARAMS

    data = load_digits()
    split = split_partition(data.train.targets, "iid", 2, 0, {}, 0, 0.2)
    write_site_files(data, split.clients[:1], split.local_tests[:1], ["clinic"], tmp_path)
    raw = BASE_PARAMS | {"train": BASE_PARAMS["train"] | {"scaffold": True, "momentum": 0.0}}
    spec = site_task(Params.model_validate(raw), dataset_info("digits"))
    task = spec.to_config() | {"client": 0, "run_key": RUN}

    def model() -> torch.nn.Module:
        return build_model(spec.model, in_channels=spec.channels, num_classes=spec.classes,
                           image_size=spec.size)  # fmt: skip

    vector = model_to_vector(model()).detach()
    server = torch.full_like(vector, 0.01)
    state = tmp_path / "state"
    node = {"data-file": str(tmp_path / "clinic.npz"), "state-dir": str(state)}

    def job(round_number: int, **changes: object) -> Job:
        return Job(kind="train", task=task | {"round": round_number, "shuffle_seed": round_number} | changes,
                   vector=vector.numpy(), node=node, control=server.numpy())  # fmt: skip

    first, second = run_job(job(1)), run_job(job(2))

    assert not first.failed and not second.failed, (first.reason, second.reason)
    store = ControlStore(state, RUN)
    kept_1 = first.arrays["control"]  # c_i was 0: c_i after round 1 is Δc_i
    assert np.array_equal(store.before(2, vector.numel()), kept_1)
    (images, targets), _ = load_site_data(tmp_path / "clinic.npz").tensors(
        spec.dataset_info(), torch.device("cpu")
    )
    simulated = train_client(
        model(), vector, ClientData(0, images, targets), spec.local_training(),
        loss_function(False), seed=2, control=ControlVariates(server, torch.from_numpy(kept_1)),
    )  # fmt: skip
    torch.testing.assert_close(torch.from_numpy(second.arrays["update"]), simulated.delta)
    torch.testing.assert_close(torch.from_numpy(second.arrays["control"]), simulated.control_delta)
    assert np.allclose(store.before(3, vector.numel()), kept_1 + second.arrays["control"])

    no_state = run_job(Job(kind="train", task=task | {"round": 3}, vector=vector.numpy(),
                           node={"data-file": node["data-file"]}, control=server.numpy()))  # fmt: skip
    assert no_state.refused and "start it with fedsieve-site --state DIR" in no_state.reason
    local_dp = run_job(job(3, privacy_mode="local", privacy_clip=1.0,
                           privacy_noise_multiplier=1.0, privacy_delta=1e-5))  # fmt: skip
    assert local_dp.refused and "neither clipped nor noised" in local_dp.reason
