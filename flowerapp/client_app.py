"""The site's Flower ClientApp: trains the global model on the site's own data file and
scores it on the site's held-out split.

A site answers a ``train`` task with its update and two numbers (its training-sample
count and mean training loss) and an ``evaluate`` task with aggregates
(:func:`federated.execution.evaluate_site`): its own scores of its test split (n, loss,
ACC, AUC, calibration) and, for the splits the message's ``request`` names (test, val),
summaries the hub pools (counts, means, calibration bins, per-class score histograms):
never images, labels or per-example values. It trains exactly as
a simulated client (:func:`federated.client.train_client`, the hub's batch-order seed),
so a federation of sites ends where its simulation does. A task that does not fit the
site's data (image shape, classes, model size), or whose settings are not the training
plan the site's operator approved (:mod:`flowerapp.plan`), is refused in one logged line
and answered with an error; the SuperNode keeps running.

Local DP (``privacy_mode: local`` in the task, so in the plan the site pins): the site
clips its update to ``privacy_clip`` and adds Gaussian noise of std noise multiplier x clip
drawn from its own randomness before the update leaves
(:meth:`~federated.privacy.ClientPrivacy.privatised_by_site`), reports its own ε (Opacus,
the updates it sent in this run, kept in the run's node state) and no training loss, and
refuses to train once one more update would pass ``privacy_target_epsilon``. A site whose
operator insists on local DP (node config ``require-local-dp=true``, ``fedsieve-site
--local-dp``) refuses any task without it, plan or no plan.

The task is a typed record (:class:`flowerapp.task.SiteTask`), its schema checked as it
arrives. The site's data (a folder of its own images, read in the task's data schema, or
an .npz) and the approved plan are the SuperNode's ``--node-config 'data-file="..."
approved-plan="..."'`` (:mod:`flowerapp.site`, the site operator's command, checks both
before starting).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from functools import cache, partial
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from torch import Tensor, nn

from federated.client import ClientData, train_client
from federated.data import to_tensors
from federated.execution import ScoreRequest, evaluate_site
from federated.layout import use_fast_layout_
from federated.metrics import loss_function
from federated.privacy import ClientPrivacy, site_privacy
from federated.vectors import model_to_vector, vector_to_model_
from flowerapp.plan import PlanError, plan_differences, plan_digest, read_plan
from flowerapp.remote import score_request, summary_record, vector_record
from flowerapp.site_data import SiteData, SiteDataError, load_site_data
from flowerapp.task import SiteTask, TaskError
from flowerapp.timing import IMPORTS_STARTED, PROCESS_STARTED, since
from models import build_model

__all__ = ["app"]

log = logging.getLogger("flwr")
app = ClientApp()
IMPORTED = time.time()  # this module's imports (torch, the engine) done
DEVICE = torch.device("cpu")
REQUIRE_LOCAL_DP = "require-local-dp"  # node config: refuse every task without local DP
UPDATES_SENT = "local-dp"  # the run's node state: the noised updates this site sent


class TaskRefused(ValueError):
    """A task this site cannot run on its data: the reason, in one line."""


@cache
def _site_data(path: str, task: SiteTask) -> SiteData:
    return load_site_data(path, task.dataset_info())


def _data_of(path: str, task: SiteTask) -> SiteData:
    """The site's data, read once per task schema (a folder's images are read in it):
    the per-message fields do not make it read again."""
    return _site_data(path, replace(task, round=0, client=0, shuffle_seed=0))


@cache
def _approved_plan(path: str) -> dict[str, Any]:
    return read_plan(path)


def _check_approved(task: SiteTask, context: Context) -> None:
    """Refuse a task whose settings are not the plan this site approved (when it pinned one)."""
    if "approved-plan" not in context.node_config:
        return
    try:
        approved = _approved_plan(str(context.node_config["approved-plan"]))
    except PlanError as error:
        raise TaskRefused(str(error)) from None
    differences = plan_differences(approved, task)
    if differences:
        raise TaskRefused(
            f"training plan {plan_digest(task)[:12]} is not the approved "
            f"{plan_digest(approved)[:12]}: {', '.join(differences)}"
        )


def _local_privacy(task: SiteTask, context: Context) -> ClientPrivacy | None:
    """The task's local DP, which this site applies to its own update (None when the task
    runs without it, which a site insisting on local DP refuses)."""
    if task.privacy_mode != "local":
        if str(context.node_config.get(REQUIRE_LOCAL_DP, False)).lower() == "true":
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


def _updates_sent(context: Context) -> int:
    """The noised updates this site sent in the run (Flower keeps the node's state
    between a run's messages)."""
    if UPDATES_SENT not in context.state:
        return 0
    return int(context.state[UPDATES_SENT]["updates_sent"])


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
            multi_label=task.multi_label,
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


Work = Callable[[SiteTask, SiteData, Tensor, nn.Module], RecordDict]


def _answer(msg: Message, context: Context, work: Work) -> Message:
    """Run ``work(task, data, global_vector, model)``; a refusal or failure is one logged
    line and an error reply, never a crashed SuperNode. The answer carries where the
    process's time went (``timing``, :mod:`flowerapp.timing`)."""
    entered = time.time()
    try:
        task = SiteTask.from_config(msg.content["task"])
        _check_approved(task, context)
        _local_privacy(task, context)
        global_vector = torch.from_numpy(np.array(msg.content["global"]["vector"].numpy()))
        data = _data_of(str(context.node_config["data-file"]), task)
        model = _task_model(task, data, global_vector)
        loaded = time.time()
        records = work(task, data, global_vector, model)
        records["timing"] = MetricRecord(
            {
                "start_s": since(PROCESS_STARTED, IMPORTS_STARTED),  # Python, Flower, the FAB
                "imports_s": IMPORTED - IMPORTS_STARTED,  # torch and the engine
                "flower_s": entered - IMPORTED,  # Flower: the app loaded, the message pulled
                "data_s": loaded - entered,  # the task checked, the site's data read
                "work_s": time.time() - loaded,  # training or scoring
            }
        )
        return Message(records, reply_to=msg)
    except (TaskRefused, TaskError, SiteDataError) as error:
        log.error("task refused: %s", error)
        reason = f"refused: {error}"
    except Exception as error:  # a broken site answers with its error, it does not crash
        log.error("task failed: %s: %s", type(error).__name__, error)
        reason = f"{type(error).__name__}: {error}"
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)


def _train(
    task: SiteTask, data: SiteData, global_vector: Tensor, model: nn.Module, *, context: Context
) -> RecordDict:
    privacy, sent = _local_privacy(task, context), _updates_sent(context)
    if privacy is not None:
        _check_budget(privacy, sent)
    (images, targets), _ = data.tensors(task.dataset_info(), DEVICE)
    client = ClientData(task.client, images, targets)
    loss_fn = loss_function(task.multi_label)
    update = train_client(
        model, global_vector, client, task.local_training(), loss_fn, seed=task.shuffle_seed
    )
    metrics = {"num_samples": update.num_samples, "train_loss": update.train_loss}
    delta = update.delta
    if privacy is not None:
        delta = privacy.privatised_by_site(delta)
        context.state[UPDATES_SENT] = MetricRecord({"updates_sent": sent + 1})
        epsilon = privacy.site_epsilon(sent + 1)
        # the loss is not noised: outside ε, so it stays here
        metrics |= {"train_loss": math.nan, "privacy_epsilon": epsilon, "updates_sent": sent + 1}
        log.info(
            "local DP: update clipped to L2 norm %g and noised (std %g); this site's ε = %.4f "
            "(δ = %g) after %d updates",
            privacy.clip, privacy.noise_multiplier * privacy.clip, epsilon, privacy.delta, sent + 1,
        )  # fmt: skip
    return RecordDict({"update": vector_record(delta), "metrics": MetricRecord(metrics)})


def _evaluate(
    task: SiteTask, data: SiteData, global_vector: Tensor, model: nn.Module,
    request: ScoreRequest,
) -> RecordDict:  # fmt: skip
    info = task.dataset_info()
    splits = {
        "test": to_tensors(data.test, info, device=DEVICE),
        "val": to_tensors(data.val, info, device=DEVICE),
    }
    vector_to_model_(model, global_vector)
    row, summaries = evaluate_site(
        model.eval(), splits, request, multi_label=task.multi_label,
        batch_size=task.eval_batch_size,
    )  # fmt: skip
    records = {"scores": MetricRecord(row or {"n": 0.0})}
    return RecordDict(records | {name: summary_record(s) for name, s in summaries.items()})


@app.train()
def train(msg: Message, context: Context) -> Message:
    return _answer(msg, context, partial(_train, context=context))


@app.evaluate()
def score(msg: Message, context: Context) -> Message:
    """Score the global model as the message's ``request`` asks (without one, the site's
    own row only)."""
    record = msg.content.get("request")
    request = score_request(record) if record is not None else ScoreRequest()

    def work(task: SiteTask, data: SiteData, vector: Tensor, model: nn.Module) -> RecordDict:
        return _evaluate(task, data, vector, model, request)

    return _answer(msg, context, work)
