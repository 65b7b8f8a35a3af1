"""The site's Flower ClientApp: trains the global model on the site's own data file and
scores it on the site's held-out split.

A site answers a ``train`` task with its update and two numbers (its training-sample
count and mean training loss) and an ``evaluate`` task with its aggregate scores (n, loss,
ACC, AUC, calibration): never images, labels or per-example values. It trains exactly as
a simulated client (:func:`federated.client.train_client`, the hub's batch-order seed),
so a federation of sites ends where its simulation does. A task that does not fit the
site's data (image shape, classes, model size), or whose settings are not the training
plan the site's operator approved (:mod:`flowerapp.plan`), or that does not follow the
task's schema (:class:`flowerapp.task.SiteTask`: a missing, unknown or mistyped setting), is
refused in one logged line and answered with an error; the SuperNode keeps running.

The data file and the approved plan are the SuperNode's ``--node-config 'data-file="..."
approved-plan="..."'`` (:mod:`flowerapp.site`, the site operator's command, checks both
before starting).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from torch import Tensor, nn

from federated.client import ClientData, train_client
from federated.layout import use_fast_layout_
from federated.metrics import evaluate, loss_function
from federated.vectors import model_to_vector, vector_to_model_
from flowerapp.plan import PlanError, plan_differences, plan_digest, read_plan
from flowerapp.remote import vector_record
from flowerapp.site_data import SiteData, SiteDataError, load_site_data
from flowerapp.task import SiteTask, TaskError
from models import build_model

__all__ = ["app"]

log = logging.getLogger("flwr")
app = ClientApp()
DEVICE = torch.device("cpu")


class TaskRefused(ValueError):
    """A task this site cannot run on its data: the reason, in one line."""


@cache
def _site_data(path: str) -> SiteData:
    return load_site_data(path)


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
    line and an error reply, never a crashed SuperNode."""
    try:
        task = SiteTask.from_config(msg.content["task"])
        _check_approved(task, context)
        global_vector = torch.from_numpy(np.array(msg.content["global"]["vector"].numpy()))
        data = _site_data(str(context.node_config["data-file"]))
        model = _task_model(task, data, global_vector)
        return Message(work(task, data, global_vector, model), reply_to=msg)
    except (TaskRefused, TaskError) as error:
        log.error("task refused: %s", error)
        reason = f"refused: {error}"
    except Exception as error:  # a broken site answers with its error, it does not crash
        log.error("task failed: %s: %s", type(error).__name__, error)
        reason = f"{type(error).__name__}: {error}"
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)


def _train(task: SiteTask, data: SiteData, global_vector: Tensor, model: nn.Module) -> RecordDict:
    (images, targets), _ = data.tensors(task.dataset_info(), DEVICE)
    client = ClientData(task.client, images, targets)
    loss_fn = loss_function(task.multi_label)
    update = train_client(
        model, global_vector, client, task.local_training(), loss_fn, seed=task.shuffle_seed
    )
    metrics = MetricRecord({"num_samples": update.num_samples, "train_loss": update.train_loss})
    return RecordDict({"update": vector_record(update.delta), "metrics": metrics})


def _evaluate(
    task: SiteTask, data: SiteData, global_vector: Tensor, model: nn.Module
) -> RecordDict:
    _, (images, targets) = data.tensors(task.dataset_info(), DEVICE)
    scores: dict[str, float] = {"n": float(len(targets))}
    if len(targets):
        vector_to_model_(model, global_vector)
        scores |= evaluate(
            model.eval(), images, targets, multi_label=task.multi_label,
            batch_size=task.eval_batch_size,
        )  # fmt: skip
    return RecordDict({"scores": MetricRecord(scores)})


@app.train()
def train(msg: Message, context: Context) -> Message:
    return _answer(msg, context, _train)


@app.evaluate()
def score(msg: Message, context: Context) -> Message:
    return _answer(msg, context, _evaluate)
