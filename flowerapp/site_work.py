"""A site's work on one task, on plain values (:class:`flowerapp.jobs.Job` in,
:class:`~flowerapp.jobs.Answer` out): run by the site's warm trainer, or by the
ClientApp itself when no trainer answers. The same code either way, so the numbers do not
depend on where it ran.

The site's data is read once per task schema and its approved plan once per file, for as
long as the process lives: the warm trainer keeps both across rounds and runs.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from config.environment import image_cache_dir
from federated.client import ClientData, ControlVariates, client_gradient, train_client
from federated.data import to_tensors
from federated.execution import ScoreRequest, evaluate_site, held_out_losses, validation_split
from federated.layout import use_fast_layout_
from federated.metrics import loss_function, summary_values
from federated.own_data import Reading
from federated.privacy import ClientPrivacy, site_privacy
from federated.stats.noniid import client_losses
from federated.vectors import model_to_vector, vector_to_model_
from flowerapp.jobs import Answer, Job
from flowerapp.plan import PlanError, plan_differences, plan_digest, read_plan
from flowerapp.site_controls import ControlStore, ControlStoreError
from flowerapp.site_data import SiteData, SiteDataError, load_site_data
from flowerapp.task import SiteTask, TaskError
from models import build_model

__all__ = ["REQUIRE_LOCAL_DP", "STATE_DIR", "TaskRefused", "run_job", "warm_up"]

DEVICE = torch.device("cpu")
REQUIRE_LOCAL_DP = "require-local-dp"  # node config: refuse every task without local DP
STATE_DIR = "state-dir"  # node config: the site's own state folder (SCAFFOLD's c_i)


class TaskRefused(ValueError):
    """A task this site cannot run on its data: the reason, in one line."""


@cache
def _site_data(path: str, task: SiteTask, version: tuple[int, ...]) -> SiteData:
    return load_site_data(path, task.dataset_info(), Reading(cache=image_cache_dir()))


def _version(path: str) -> tuple[int, ...]:
    """When the site's data last changed: the file's, or a folder's and its labels.csv's,
    modification times (0 where missing, for the load to name)."""
    stamps = []
    for candidate in (Path(path), Path(path) / "labels.csv"):
        with contextlib.suppress(OSError):
            stamps.append(candidate.stat().st_mtime_ns)
    return tuple(stamps)


def _data_of(path: str, task: SiteTask) -> SiteData:
    """The site's data, read once per task schema (a folder's images are read in it) and
    again when the operator changes it: the per-message fields do not make it read again."""
    return _site_data(
        path, replace(task, round=0, client=0, shuffle_seed=0, run_key=""), _version(path)
    )


@cache
def _read_plan(path: str, version: tuple[int, ...]) -> dict[str, Any]:
    return read_plan(path)


def _approved_plan(path: str) -> dict[str, Any]:
    """The plan the site approved, read again when its operator changes the file."""
    return _read_plan(path, _version(path))


def warm_up(data: Path | None, plan: Path | None) -> None:
    """Read the approved plan and the site's data in its schema now, before the first task
    (a plan or data that cannot be read is left for the task to refuse)."""
    if data is None or plan is None:
        return
    with contextlib.suppress(PlanError, TaskError, SiteDataError):
        _data_of(str(data.resolve()), SiteTask.from_config(_approved_plan(str(plan.resolve()))))


def _check_approved(task: SiteTask, node: dict[str, Any]) -> None:
    """Refuse a task whose settings are not the plan this site approved (when it pinned one)."""
    if "approved-plan" not in node:
        return
    try:
        approved = _approved_plan(str(node["approved-plan"]))
    except PlanError as error:
        raise TaskRefused(str(error)) from None
    differences = plan_differences(approved, task)
    if differences:
        raise TaskRefused(
            f"training plan {plan_digest(task)[:12]} is not the approved "
            f"{plan_digest(approved)[:12]}: {', '.join(differences)}"
        )


def _local_privacy(task: SiteTask, node: dict[str, Any]) -> ClientPrivacy | None:
    """The task's local DP, which this site applies to its own update (None when the task
    runs without it, which a site insisting on local DP refuses)."""
    if task.privacy_mode != "local":
        if str(node.get(REQUIRE_LOCAL_DP, False)).lower() == "true":
            raise TaskRefused(
                f"privacy_mode={task.privacy_mode}: this site trains only with local DP "
                "(privacy_mode=local; fedsieve-site --local-dp)"
            )
        return None
    try:
        return site_privacy(
            clip=task.privacy_clip,
            noise_multiplier=task.privacy_noise_multiplier,
            delta=task.privacy_delta,
            target_epsilon=task.privacy_target_epsilon or None,
        )
    except ValueError as error:
        raise TaskRefused(f"privacy_mode=local: {error}") from None


def _check_budget(privacy: ClientPrivacy, sent: int) -> None:
    """Refuse the update that would take this site's ε past the plan's target."""
    if privacy.site_admits(sent + 1):
        return
    raise TaskRefused(
        f"privacy budget: one more update would take this site's ε to "
        f"{privacy.site_epsilon(sent + 1):.3f}, past privacy_target_epsilon = "
        f"{privacy.target_epsilon:g} (ε = {privacy.site_epsilon(sent):.3f} after {sent} "
        f"updates, δ = {privacy.delta:g})"
    )


def _task_model(task: SiteTask, data: SiteData, global_vector: Tensor) -> nn.Module:
    """The task's model, checked against the site's data and the vector's length."""
    try:
        data.check_fits(
            channels=task.channels, size=task.size, classes=task.classes,
            multi_label=task.multi_label, spatial_dims=task.spatial_dims,
        )  # fmt: skip
        model = build_model(
            task.model, in_channels=task.channels, num_classes=task.classes,
            image_size=task.size,
        )  # fmt: skip
    except (SiteDataError, KeyError, ValueError) as error:
        raise TaskRefused(str(error)) from None
    size = model_to_vector(model).numel()
    if global_vector.numel() != size or global_vector.ndim != 1:
        raise TaskRefused(
            f"the global vector has {tuple(global_vector.shape)} values; the task's model "
            f"{task.model} has {size}"
        )
    return use_fast_layout_(model, DEVICE)


def _train(
    job: Job, task: SiteTask, data: SiteData, global_vector: Tensor, model: nn.Module
) -> Answer:
    """The update; when the job carries a score request too, the received model's
    scores first (one exchange a round: the model is the last round's). Under SCAFFOLD
    the site trains with the hub's c and its own c_i, keeps c_i + Δc_i on its disk and
    sends Δc_i."""
    controls = _site_controls(job, task, global_vector) if task.scaffold else None
    scores = _evaluate(job, task, data, global_vector, model) if job.request else Answer()
    privacy, sent = _local_privacy(task, job.node), job.updates_sent
    if privacy is not None:
        try:
            _check_budget(privacy, sent)
        except TaskRefused as error:
            if not job.request:
                raise
            scores.train_refused = f"refused: {error}"  # scored all the same
            return scores
    (images, targets), _ = data.tensors(task.dataset_info(), DEVICE)
    client = ClientData(task.client, images, targets)
    loss_fn = loss_function(task.multi_label)
    update = train_client(
        model, global_vector, client, task.local_training(), loss_fn, seed=task.shuffle_seed,
        control=None if controls is None else controls[1],
    )  # fmt: skip
    metrics: dict[str, float | int] = {
        "num_samples": update.num_samples, "train_loss": update.train_loss,
    }  # fmt: skip
    delta = update.delta
    answer = Answer(metrics=scores.metrics)
    if privacy is not None:
        delta = privacy.privatised_by_site(delta)
        epsilon = privacy.site_epsilon(sent + 1)
        answer.updates_sent = sent + 1
        # the loss is not noised: outside ε, so it stays here
        metrics |= {"train_loss": math.nan, "privacy_epsilon": epsilon, "updates_sent": sent + 1}
        answer.log_lines.append(
            f"local DP: update clipped to L2 norm {privacy.clip:g} and noised (std "
            f"{privacy.noise_multiplier * privacy.clip:g}); this site's ε = {epsilon:.4f} "
            f"(δ = {privacy.delta:g}) after {sent + 1} updates"
        )
    answer.arrays["update"] = delta.detach().cpu().numpy()
    answer.metrics["metrics"] = metrics
    if controls is not None and update.control_delta is not None:
        store, variates = controls
        change = update.control_delta.detach().cpu()
        store.save(task.round, (variates.client + change).numpy())  # before it is sent
        answer.arrays["control"] = change.numpy()
    return answer


def _site_controls(
    job: Job, task: SiteTask, global_vector: Tensor
) -> tuple[ControlStore, ControlVariates]:
    """Where this site keeps its SCAFFOLD variate, and the hub's c with its own c_i for
    the task's round; a task that cannot have them is refused."""
    if task.privacy_mode == "local":
        raise TaskRefused(
            "scaffold with privacy_mode=local: the control delta would leave this site "
            "neither clipped nor noised"
        )
    if STATE_DIR not in job.node:
        raise TaskRefused(
            "scaffold: this site keeps its control variate in its own state folder; start "
            "it with fedsieve-site --state DIR (node config state-dir)"
        )
    size = global_vector.numel()
    if job.control is None or job.control.shape != (size,):
        shape = None if job.control is None else job.control.shape
        raise TaskRefused(f"scaffold: the task's control variate c is {shape}, not ({size},)")
    try:
        store = ControlStore(Path(str(job.node[STATE_DIR])), task.run_key)
        own = store.before(task.round, size)
    except ControlStoreError as error:
        raise TaskRefused(str(error)) from None
    server = torch.from_numpy(np.array(job.control, dtype=np.float32))
    return store, ControlVariates(server=server, client=torch.from_numpy(own))


def _evaluate(
    job: Job, task: SiteTask, data: SiteData, global_vector: Tensor, model: nn.Module
) -> Answer:
    info = task.dataset_info()
    splits = {
        "test": to_tensors(data.test, info, device=DEVICE),
        "val": to_tensors(data.val, info, device=DEVICE),
    }
    request = ScoreRequest() if job.request is None else ScoreRequest.from_config(job.request)
    vector_to_model_(model, global_vector)
    row, summaries = evaluate_site(
        model.eval(), splits, request, multi_label=task.multi_label,
        batch_size=task.eval_batch_size,
    )  # fmt: skip
    metrics = {"scores": row or {"n": 0.0}}
    metrics |= {name: summary_values(summary) for name, summary in summaries.items()}
    if request.data_loss:  # EMA's non-IID check: one number of the training data, as simulated
        (images, targets), _ = data.tensors(info, DEVICE)
        (loss,) = client_losses(model, [(images, targets)], loss=request.data_loss, device=DEVICE)  # type: ignore[arg-type]
        metrics["data"] = {"loss": float(loss)}
    return Answer(metrics=metrics)


def _pretest(
    job: Job, task: SiteTask, data: SiteData, global_vector: Tensor, model: nn.Module
) -> Answer:
    """What EMA's pre-test examines, as the simulated stage computes it: the gradient of
    the site's mean loss at the global model (``gradient``) or one local epoch's update
    (``delta``). Never under local DP: only noised updates leave such a site."""
    if task.privacy_mode == "local":
        raise TaskRefused(
            "privacy_mode=local: the pre-test needs this site's raw gradient or update, "
            "and with local DP only noised updates leave the site"
        )
    mode = str((job.request or {}).get("mode", ""))
    if mode not in PRETEST_MODES:
        raise TaskRefused(f"pre-test mode must be one of {PRETEST_MODES}, got {mode!r}")
    (images, targets), _ = data.tensors(task.dataset_info(), DEVICE)
    client = ClientData(task.client, images, targets)
    loss_fn = loss_function(task.multi_label)
    if mode == "gradient":
        vector = client_gradient(model, global_vector, client, loss_fn)
    else:
        local = replace(task.local_training(), epochs=1)
        vector = train_client(
            model, global_vector, client, local, loss_fn, seed=task.shuffle_seed
        ).delta
    metrics: dict[str, float | int] = {"num_samples": len(targets), "train_loss": math.nan}
    return Answer(arrays={"update": vector.detach().cpu().numpy()}, metrics={"metrics": metrics})


def _validate(
    job: Job, task: SiteTask, data: SiteData, global_vector: Tensor, model: nn.Module
) -> Answer:
    """Validation at the sites: each candidate model's mean loss on this site's held-out
    split (its validation split, or its test split when it holds none) and the split's
    size, as a simulated site computes them. Only where the plan says so
    (``validation``): the candidates differ by one peer's update each."""
    if not task.validation:
        raise TaskRefused(
            "validation=false in the task: this site scores leave-one-site-out candidates "
            "only under a plan with validation=true (filter site_validation)"
        )
    if job.candidates is None or job.candidates.ndim != 2:
        raise TaskRefused("a validation task carries the candidate models as a (k, d) array")
    candidates = torch.from_numpy(np.array(job.candidates))
    if candidates.shape[1] != global_vector.numel():
        raise TaskRefused(
            f"candidates of {candidates.shape[1]} values; the task's model has {global_vector.numel()}"
        )
    info = task.dataset_info()
    splits = {
        "test": to_tensors(data.test, info, device=DEVICE),
        "val": to_tensors(data.val, info, device=DEVICE),
    }
    n, losses = held_out_losses(
        model, candidates, validation_split(splits), multi_label=task.multi_label,
        batch_size=task.eval_batch_size,
    )  # fmt: skip
    return Answer(metrics={"validation": {"n": n, "losses": list(losses)}})


PRETEST_MODES = ("gradient", "delta")
WORK = {"train": _train, "evaluate": _evaluate, "pretest": _pretest, "validate": _validate}


def run_job(job: Job) -> Answer:
    """The job's answer; a refusal or a failure is an answer with its reason in one line,
    never an exception."""
    entered = time.time()
    try:
        task = SiteTask.from_config(job.task)
        _check_approved(task, job.node)
        _local_privacy(task, job.node)
        global_vector = torch.from_numpy(np.array(job.vector))
        data = _data_of(str(job.node["data-file"]), task)
        model = _task_model(task, data, global_vector)
        loaded = time.time()
        answer = WORK[job.kind](job, task, data, global_vector, model)
    except (TaskRefused, TaskError, SiteDataError) as error:
        return Answer(refused=True, reason=f"refused: {error}")
    except Exception as error:  # a broken site answers with its error, it does not crash
        return Answer(reason=f"{type(error).__name__}: {error}")
    answer.data_s, answer.work_s = loaded - entered, time.time() - loaded
    answer.data_sha256 = data.sha256
    answer.train_counts = data.class_counts("train", task.classes)
    answer.test_counts = data.class_counts("test", task.classes)
    return answer
