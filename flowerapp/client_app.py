"""The site's Flower ClientApp: trains the global model on the site's own data file and
scores it on the site's held-out split.

A site answers a ``train`` task with its update and two numbers (its training-sample
count and mean training loss) and an ``evaluate`` task with aggregates
(:func:`federated.execution.evaluate_site`): its own scores of its test split (n, loss,
ACC, AUC, calibration) and, for the splits the message's ``request`` names (test, val),
summaries the hub pools (counts, means, calibration bins, per-class score histograms):
never images, labels or per-example values; asked, also the model's loss on its
training data (EMA's non-IID check, one number). A ``query.pretest`` task answers with
the gradient or one-epoch update EMA's pre-test examines (refused under local DP). A
``query.validate`` task (validation at the sites, only where the approved plan has
``validation: true``) answers with one mean loss per candidate model on the site's
held-out split and the split's size. It
trains exactly as
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
arrives. This process only carries it: Flower starts one for every message, so it imports
no torch and hands the task to the site's warm trainer (:mod:`flowerapp.trainer`, over a
private Unix socket; node config ``trainer-dir``), which keeps the engine and the site's
data loaded. Without a trainer to answer (none configured, not running, or it died
mid-task) it runs the task itself (:mod:`flowerapp.site_work`, the same code). The site's data (a folder of its own images, read in the task's data schema, or
an .npz) and the approved plan are the SuperNode's ``--node-config 'data-file="..."
approved-plan="..."'`` (:mod:`flowerapp.site`, the site operator's command, checks both
before starting).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from flowerapp.jobs import Answer, Job
from flowerapp.timing import IMPORTS_STARTED, PROCESS_STARTED, since
from flowerapp.trainer import TrainerUnavailable, ask

__all__ = ["app"]

log = logging.getLogger("flwr")
app = ClientApp()
IMPORTED = time.time()  # this module's imports (Flower, numpy) done
TRAINER_DIR = "trainer-dir"  # node config: the warm trainer's private directory
UPDATES_SENT = "local-dp"  # the run's node state: the noised updates this site sent


def _updates_sent(context: Context) -> int:
    """The noised updates this site sent in the run (Flower keeps the node's state
    between a run's messages)."""
    if UPDATES_SENT not in context.state:
        return 0
    return int(context.state[UPDATES_SENT]["updates_sent"])


def _job(kind: str, msg: Message, context: Context) -> Job:
    request = msg.content.get("request")  # a train task with one: score, then train
    return Job(
        kind=kind,
        task=dict(msg.content["task"]),
        vector=np.array(msg.content["global"]["vector"].numpy()),
        node=dict(context.node_config),
        updates_sent=_updates_sent(context),
        request=None if request is None else dict(request),
        candidates=_array(msg, "candidates"),
        control=_array(msg, "control"),
    )


def _array(msg: Message, name: str) -> np.ndarray | None:
    """The message's array record ``name`` (its one array), if it carries one."""
    return np.array(msg.content[name]["vector"].numpy()) if name in msg.content else None


def _run(job: Job, context: Context) -> tuple[Answer, bool]:
    """The job's answer, from the warm trainer when one answers (and whether it did)."""
    if TRAINER_DIR in context.node_config:
        try:
            return ask(Path(str(context.node_config[TRAINER_DIR])), job), True
        except TrainerUnavailable as error:
            log.warning("no warm trainer answered (%s); running the task here", error)
    from flowerapp.site_work import run_job  # torch and the engine: the cold path only

    return run_job(job), False


def _error(msg: Message, answer: Answer) -> Message:
    """The refusal or failure, logged in one line and sent as Flower's error reply."""
    log.error("task %s", answer.reason if answer.refused else f"failed: {answer.reason}")
    return Message(
        Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=answer.reason), reply_to=msg
    )


def _answer(kind: str, msg: Message, context: Context) -> Message:
    """The site's reply; a refusal or failure is one logged line and an error reply, never
    a crashed SuperNode. The answer carries where the process's time went (``timing``,
    :mod:`flowerapp.timing`)."""
    entered = time.time()
    try:
        job = _job(kind, msg, context)
    except Exception as error:  # a message without the records a task needs
        return _error(msg, Answer(reason=f"{type(error).__name__}: {error}"))
    handed = time.time()
    answer, warm = _run(job, context)
    if answer.failed:
        return _error(msg, answer)
    for line in answer.log_lines:
        log.info("%s", line)
    if answer.updates_sent is not None:
        context.state[UPDATES_SENT] = MetricRecord({"updates_sent": answer.updates_sent})
    records = RecordDict(
        {name: ArrayRecord({"vector": Array(array)}) for name, array in answer.arrays.items()}
        | {name: MetricRecord(values) for name, values in answer.metrics.items()}
    )
    if answer.data_sha256:  # the data's lineage: what the hub records the model trained on
        lineage = {"data_sha256": answer.data_sha256, "train_counts": answer.train_counts,
                   "test_counts": answer.test_counts}  # fmt: skip
        records["lineage"] = ConfigRecord(lineage)
    if answer.train_refused:
        log.error("task %s", answer.train_refused)
        records["train_refused"] = ConfigRecord({"reason": answer.train_refused})
    records["timing"] = MetricRecord(
        {
            "start_s": since(PROCESS_STARTED, IMPORTS_STARTED),  # Python, Flower, the FAB
            "imports_s": IMPORTED - IMPORTS_STARTED,  # this app's imports
            "flower_s": entered - IMPORTED,  # Flower: the app loaded, the message pulled
            "handoff_s": time.time() - handed - answer.data_s - answer.work_s,  # socket, pickling
            "data_s": answer.data_s,  # the task checked, the site's data read
            "work_s": answer.work_s,  # training or scoring
            "warm": float(warm),  # 1: the warm trainer ran it; 0: this process did
        }
    )
    return Message(records, reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return _answer("train", msg, context)


@app.evaluate()
def score(msg: Message, context: Context) -> Message:
    """Score the global model as the message's ``request`` asks (without one, the site's
    own row only)."""
    return _answer("evaluate", msg, context)


@app.query("pretest")
def pretest(msg: Message, context: Context) -> Message:
    """The gradient or one-epoch update EMA's pre-test examines (the ``request``'s
    ``mode``), at the global model, as a simulated client computes it."""
    return _answer("pretest", msg, context)


@app.query("validate")
def validate(msg: Message, context: Context) -> Message:
    """Each candidate model's mean loss on the site's held-out split, and the split's size
    (validation at the sites: the filter ``site_validation``, when the plan says so)."""
    return _answer("validate", msg, context)
