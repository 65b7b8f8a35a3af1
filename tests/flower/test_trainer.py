"""The site's warm trainer (flowerapp.trainer) as a real process on a Unix socket: it
answers a task exactly as the ClientApp's own run of it would (update, scores, refusals),
only its own key opens it, it is started again when it dies, a trainer that dies with the
task is reported as unavailable (the ClientApp then runs the task itself), and a site's
data changed on disk is read again."""

from __future__ import annotations

import hashlib
import io
import threading
import time
from multiprocessing.connection import Listener
from pathlib import Path

import numpy as np
import pytest

from config.params import Params
from federated.data import dataset_info, load_digits
from federated.vectors import model_to_vector
from flowerapp.hub import site_task
from flowerapp.jobs import Job
from flowerapp.plan import read_plan, write_plan
from flowerapp.site_data import write_site_files
from flowerapp.site_work import run_job
from flowerapp.task import SiteTask
from flowerapp.trainer import (
    KEY,
    SOCKET,
    KeptTrainer,
    TrainerUnavailable,
    ask,
    prepare_dir,
    trainer_command,
)
from models import build_model
from tasks.partition import split_partition
from tests.flower.conftest import BASE_PARAMS, FLOWER_BIN

READY_S = 120.0  # the trainer's start: Python, torch, the engine, the site's data


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One digits site's data file and the plan it approved."""
    out = tmp_path_factory.mktemp("site")
    data = load_digits()
    split = split_partition(data.train.targets, "iid", 2, 0, {}, 0, 0.2)
    write_site_files(data, split.clients[:1], split.local_tests[:1], ["clinic"], out)
    plan = out / "plan.json"
    write_plan(plan, site_task(Params.model_validate(BASE_PARAMS), dataset_info("digits")))
    return out / "clinic.npz", plan


def jobs(data: Path, plan: Path) -> dict[str, Job]:
    """A train and an evaluate task as the hub sends them, and a train task off the plan."""
    task = read_plan(plan) | {"round": 1, "client": 0, "shuffle_seed": 7}
    spec = SiteTask.from_config(task)
    model = build_model(
        spec.model, in_channels=spec.channels, num_classes=spec.classes, image_size=spec.size
    )
    vector = model_to_vector(model).detach().numpy()
    node = {"data-file": str(data), "approved-plan": str(plan)}
    request = {"splits": "test,val", "full": True, "rows": True, "data_loss": "mse"}
    local_dp = task | {
        "privacy_mode": "local", "privacy_clip": 1.0, "privacy_noise_multiplier": 1.0,
        "privacy_delta": 1e-5,
    }  # fmt: skip
    unpinned = {"data-file": str(data)}  # no approved plan: the local-DP task is not off-plan
    return {
        "train": Job(kind="train", task=task, vector=vector, node=node),
        "evaluate": Job(kind="evaluate", task=task, vector=vector, node=node, request=request),
        "off-plan": Job(kind="train", task=task | {"lr": 9.0}, vector=vector, node=node),
        "pretest": Job(
            kind="pretest", task=task, vector=vector, node=node, request={"mode": "gradient"}
        ),
        "pretest-local-dp": Job(
            kind="pretest", task=local_dp, vector=vector, node=unpinned, request={"mode": "delta"}
        ),
        # validation at the sites: two candidate models (a plan with validation=true), and
        # the same asked under the plan this site approved, which says false
        "validate": Job(
            kind="validate",
            task=task | {"validation": True},
            vector=vector,
            node=unpinned,
            candidates=np.stack([vector, vector * 0.5]),
        ),
        "validate-off-plan": Job(
            kind="validate",
            task=task,
            vector=vector,
            node=node,
            candidates=np.stack([vector, vector * 0.5]),
        ),
    }


def answered(directory: Path, job: Job, timeout: float = READY_S):
    """The trainer's answer once it is up (asked again while it starts)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ask(directory, job)
        except TrainerUnavailable:
            assert time.monotonic() < deadline, "the warm trainer never answered"
            time.sleep(0.2)


@pytest.fixture
def trainer(tmp_path: Path, site: tuple[Path, Path]):
    directory = tmp_path / "private"
    prepare_dir(directory)
    data, plan = site
    out = io.StringIO()
    kept = KeptTrainer(
        trainer_command(directory, data, plan, FLOWER_BIN / "python"), None, out
    ).start()
    yield directory, kept, out
    kept.stop()


def test_the_warm_trainer_answers_as_the_task_run_here_would(trainer, site) -> None:
    directory, _, _ = trainer
    answers = {}
    for name, job in jobs(*site).items():
        warm, here = answered(directory, job), run_job(job)
        assert warm.reason == here.reason and warm.refused == here.refused, name
        np.testing.assert_equal(warm.metrics, here.metrics, err_msg=name)  # NaN equals NaN
        assert warm.arrays.keys() == here.arrays.keys(), name
        for key, array in warm.arrays.items():
            assert np.array_equal(array, here.arrays[key]), (name, key)
        answers[name] = warm
    assert answers["train"].arrays["update"].shape == jobs(*site)["train"].vector.shape
    assert {"scores", "test", "val"} <= answers["evaluate"].metrics.keys()
    assert answers["evaluate"].metrics["data"]["loss"] > 0  # the non-IID check's one number
    assert answers["off-plan"].refused and "lr=9.0 (approved 0.05)" in answers["off-plan"].reason
    assert answers["pretest"].arrays["update"].shape == jobs(*site)["train"].vector.shape
    refused = answers["pretest-local-dp"]
    assert refused.refused and "only noised updates leave the site" in refused.reason
    validation = answers["validate"].metrics["validation"]  # a count and a loss a candidate
    assert validation["n"] > 0 and len(validation["losses"]) == 2 and not answers["validate"].arrays
    assert validation["losses"][0] != validation["losses"][1]
    off_plan = answers["validate-off-plan"]
    assert off_plan.refused and "validation=false in the task" in off_plan.reason
    assert (directory.stat().st_mode & 0o777) == 0o700
    assert ((directory / KEY).stat().st_mode & 0o777) == 0o600


def test_only_the_sites_key_opens_the_trainer(trainer, site) -> None:
    directory, _, _ = trainer
    job = jobs(*site)["train"]
    answered(directory, job)
    (directory / KEY).write_text("not the trainer's key")
    with pytest.raises(TrainerUnavailable):
        ask(directory, job)


def test_a_trainer_that_dies_is_started_again(trainer, site) -> None:
    directory, kept, out = trainer
    job = jobs(*site)["train"]
    first = answered(directory, job)
    victim = kept.child
    victim.kill()
    victim.wait()
    again = answered(directory, job)  # meanwhile unavailable: the ClientApp runs it itself
    assert np.array_equal(again.arrays["update"], first.arrays["update"])
    assert kept.starts == 2 and kept.child.pid != victim.pid
    assert f"warm trainer (pid {victim.pid}) exited with -9; starting it again" in out.getvalue()


def test_a_trainer_that_dies_with_the_task_is_unavailable(tmp_path: Path, site) -> None:
    directory = tmp_path / "private"
    prepare_dir(directory)
    listener = Listener(
        str(directory / SOCKET), family="AF_UNIX", authkey=(directory / KEY).read_bytes().strip()
    )

    def die_mid_task() -> None:  # takes the task, then is gone without an answer
        with listener.accept() as link:
            link.recv()

    dying = threading.Thread(target=die_mid_task)
    dying.start()
    with pytest.raises(TrainerUnavailable, match="EOFError"):
        ask(directory, jobs(*site)["train"])
    dying.join()
    listener.close()


def test_a_sites_data_changed_on_disk_is_read_again(tmp_path: Path, site) -> None:
    data, plan = site
    copy = tmp_path / "clinic.npz"
    copy.write_bytes(data.read_bytes())
    job = jobs(copy, plan)["train"]
    first = run_job(job)
    before = first.metrics["metrics"]["num_samples"]
    # its lineage: the file's SHA-256 (what sites.json lists) and its images per class
    assert first.data_sha256 == hashlib.sha256(copy.read_bytes()).hexdigest()
    assert sum(first.train_counts) == before and len(first.train_counts) == 10
    with np.load(copy) as archive:
        arrays = dict(archive)
    arrays["train_images"], arrays["train_labels"] = (
        arrays["train_images"][:100], arrays["train_labels"][:100],
    )  # fmt: skip
    time.sleep(0.01)
    np.savez_compressed(copy, **arrays)
    after = run_job(job)
    assert before > 100 and after.metrics["metrics"]["num_samples"] == 100
    assert after.data_sha256 == hashlib.sha256(copy.read_bytes()).hexdigest() != first.data_sha256
    expected = np.bincount(arrays["train_labels"][:, 0], minlength=10).tolist()
    assert after.train_counts == expected
    assert after.test_counts == np.bincount(arrays["test_labels"][:, 0], minlength=10).tolist()
