"""The remote executor: a round's sampled sites trained through Flower's ``Grid``.

It sends each sampled site the global vector and the task (:class:`flowerapp.task.SiteTask`
with the round, the site's client id and its batch-order seed) in one ``train`` message,
waits up to ``round_timeout`` seconds (``Grid.send_and_receive`` returns what arrived by
then) and answers the round loop one :class:`~federated.execution.ClientResult` per site:
the update, or why there is none (``timeout``: no reply; ``unavailable``: Flower's reply
for a node that is not connected; ``error``: the site's refusal or failure, its reason in
one line). Checking what came back (shape, finiteness, the reported sample count against
the registered one) is the round loop's job, as for every executor.

It also asks the sites to score a global vector on their held-out splits (``score``, one
``evaluate`` message each with the task and a ``request`` record: which splits to
summarise, fully or not, and whether the site's own row). A site answers with
aggregates only (``federated.metrics.summary_values``); a summary that does not add up (histograms of
the wrong shape, counts that are not the split's size) leaves that site out of the
round's evaluation, with a logged line.

A site whose scoring finds the model's outputs NaN or infinite (``ModelDiverged``) stops
the run with the site and the reason named, as the hub's own scoring does.

One exchange a round: when the round loop says which clients the next round samples
(``then_train``), those sites get one ``train`` message that carries the ``request``
too: the site scores the model it received, then trains on it, and answers both. The
scores are the round's; the updates are kept and handed to the next round's ``train``
when it asks for that model and round (else it sends the round's messages as usual). The
first round trains alone and the last model is scored alone.

EMA's statistics at the sites: a score request may ask for the model's loss on each
site's training data (``data_loss``, the non-IID check's one number per site); when the
round's scoring brought the next round's losses with its training, the screen that asks
for them is answered from that exchange. ``pretest_updates`` asks every site for the
gradient or one-epoch update the pre-test examines (``query.pretest`` messages).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from torch import Tensor

from federated.client import ClientUpdate
from federated.execution import (
    ClientResult,
    HeldOutLosses,
    NextRound,
    OnResult,
    ResultOf,
    RoundExecutor,
    ScoreRequest,
    SiteEvaluation,
    collect_results,
)
from federated.metrics import ModelDiverged, SplitSummary, summary_from
from flowerapp.lineage import SiteLineage
from flowerapp.task import SiteTask

__all__ = [
    "RemoteExecutor",
    "exchange_record",
    "request_record",
    "split_summary",
    "vector_record",
]

log = logging.getLogger(__name__)
EXPIRED = (ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE)  # Flower's TTL
DIVERGED = f"{ModelDiverged.__name__}: "  # a site's reply: the model's outputs are not finite
PULL_INTERVAL_S = 0.2  # how often the hub looks for the sites' replies (Flower's own: 3 s)
RESEND_S = 2.0  # how often a site Flower says is not connected is asked again in a round
SeedOf = Callable[[int, int], int]
OnExchange = Callable[[dict[str, Any]], None]


def vector_record(vector: Tensor) -> ArrayRecord:
    """A float vector as the one array of a record (the global model, an update; or the
    candidate models of a validation, one row each)."""
    return ArrayRecord({"vector": Array(vector.detach().cpu().numpy())})


def request_record(request: ScoreRequest) -> ConfigRecord:
    """A score request as the ``request`` record of a message (a site reads it back with
    :meth:`~federated.execution.ScoreRequest.from_config`)."""
    return ConfigRecord(request.to_config())


def split_summary(
    record: MetricRecord, *, classes: int, multi_label: bool, full: bool
) -> SplitSummary:
    """The summary a site sent, checked (:func:`federated.metrics.summary_from`)."""
    return summary_from(record, classes=classes, multi_label=multi_label, full=full)


def exchange_record(
    kind: str, round_number: int, wall_s: float, replies: dict[int, Message]
) -> dict[str, Any]:
    """One exchange as the hub saw it: its wall time from send to the last reply, and each
    answering site's own phases (:mod:`flowerapp.timing`; seconds, nothing of its data)."""
    sites = {
        str(client): {key: float(value) for key, value in reply.content["timing"].items()}
        for client, reply in replies.items()
        if not reply.has_error() and "timing" in reply.content
    }
    return {"kind": kind, "round": round_number, "wall_s": wall_s, "sites": sites}


class RemoteExecutor(RoundExecutor):
    """Trains and scores the sampled clients at their sites (client id -> Flower node)."""

    def __init__(
        self,
        grid: Grid,
        nodes: dict[int, int],
        task: SiteTask,
        *,
        seed_of: SeedOf,
        round_timeout: float,
        on_exchange: OnExchange | None = None,
    ) -> None:
        self.grid = grid
        self.nodes = nodes
        self.task = task
        self.seed_of = seed_of
        self.round_timeout = round_timeout
        self.on_exchange = on_exchange
        self.bytes_sent = 0  # the global vectors sent, for the transport's measurements
        self._trained: _Trained | None = None  # next round's updates, from the last scoring
        self.lineage = SiteLineage()  # what each site said it answered from
        self._round = 0  # the last round trained: a scoring without training is of its model

    def _send(
        self, kind: str, vector: Tensor, round_number: int, client_ids: Sequence[int],
        request: ConfigRecord | None = None, training: Sequence[int] = (),
        candidates: Tensor | None = None, control: Tensor | None = None,
    ) -> dict[int, Message]:  # fmt: skip
        """One message per client (a ``train`` message to the ``training`` ones, each with
        the ``candidates`` when given, and SCAFFOLD's ``control`` c to those that train);
        the replies that arrived in time, by client id."""
        record = vector_record(vector)
        extra = {} if candidates is None else {"candidates": vector_record(candidates)}
        controls = {} if control is None else {"control": vector_record(control)}
        trains = kind == "train"
        messages = []
        for client_id in client_ids:
            task = replace(
                self.task, round=round_number, client=client_id,
                shuffle_seed=self.seed_of(round_number, client_id),
            )  # fmt: skip
            content = RecordDict({"global": record, "task": ConfigRecord(task.to_config())} | extra)
            if trains or client_id in training:
                for name, array in controls.items():
                    content[name] = array
            if request is not None:
                content["request"] = request
            messages.append(
                Message(
                    content,
                    dst_node_id=self.nodes[client_id],
                    message_type="train" if client_id in training else kind,
                    group_id=str(round_number),
                    ttl=self.round_timeout,  # a task left undelivered by the deadline expires
                )
            )
        sent_bytes = record.count_bytes() + sum(r.count_bytes() for r in extra.values())
        self.bytes_sent += sent_bytes * len(messages)
        trained = len(client_ids) if trains else len(training)
        self.bytes_sent += sum(r.count_bytes() for r in controls.values()) * trained
        started = time.perf_counter()
        replies = self._exchange(messages)
        wall_s = time.perf_counter() - started
        # by the message each replies to: Flower's own error replies (an unreachable node)
        # come from the SuperLink, not from the site
        sent = {m.metadata.message_id: i for m, i in zip(messages, client_ids, strict=True)}
        answered = {sent[message_id]: reply for message_id, reply in replies.items()}
        if self.on_exchange is not None:
            label = f"{kind}+train" if training and kind != "train" else kind
            self.on_exchange(exchange_record(label, round_number, wall_s, answered))
        self._note_lineage(kind, round_number, answered, training)
        return answered

    def _note_lineage(
        self, kind: str, round_number: int, answered: dict[int, Message], training: Sequence[int]
    ) -> None:
        """Each answer's data lineage (the round it trained, the round whose model it
        scored); a site whose data changed is said at the hub."""
        scored = None  # a train or pre-test message scores nothing
        if kind == "evaluate":  # with training, of the model the training starts from
            scored = round_number - 1 if training else self._round
        for client_id, reply in answered.items():
            if reply.has_error() or "lineage" not in reply.content:
                continue
            trains = kind == "train" or client_id in training
            trains = trains and "train_refused" not in reply.content  # scored, did not train
            try:
                lineage = reply.content["lineage"]
                counts = {
                    split: [int(count) for count in lineage[f"{split}_counts"]]  # type: ignore[union-attr]
                    for split in ("train", "test")
                }
                changed = self.lineage.record(
                    client_id, str(lineage["data_sha256"]), **counts, scored=scored,
                    trained=round_number if trains else None,
                )  # fmt: skip
            except (KeyError, TypeError, ValueError) as error:  # a site's record, not ours
                log.warning("site %d sent a lineage that does not read: %r", client_id, error)
                continue
            if changed is not None:
                log.warning("%s", changed)
        if kind == "train" or training:
            self._round = max(self._round, round_number)

    def _exchange(self, messages: list[Message]) -> dict[str, Message]:
        """Push ``messages`` and pull their replies until all came or ``round_timeout``
        passed; each message's last reply, by the id it was first pushed under.
        ``Grid.send_and_receive`` does the same but looks every 3 s, fixed in Flower 1.32.1;
        its public ``push_messages``/``pull_messages`` let the hub look every
        ``PULL_INTERVAL_S``, so a round does not wait for a poll that found nothing.

        A site Flower answers for as not connected (``NODE_UNAVAILABLE``) is asked again
        every ``RESEND_S`` while other sites are still at work: a site restarted after a
        crash rejoins once its old node lapses, and trains in the round under way."""
        first_ids = list(self.grid.push_messages(messages))
        sent = dict(zip(first_ids, messages, strict=True))  # pushed id -> its message
        first_of = {message_id: message_id for message_id in first_ids}
        waiting = {message_id for message_id in first_ids if message_id}  # None: not pushed
        resend_at: dict[str, float] = {}
        deadline = time.monotonic() + self.round_timeout
        replies: dict[str, Message] = {}
        while waiting:
            for reply in self.grid.pull_messages(waiting):
                message_id = reply.metadata.reply_to_message_id
                waiting.discard(message_id)
                replies[first_of[message_id]] = reply
                if reply.has_error() and reply.error.code == ErrorCode.NODE_UNAVAILABLE:
                    resend_at[message_id] = time.monotonic() + RESEND_S
            if not waiting or time.monotonic() >= deadline:
                break
            for message_id, due in list(resend_at.items()):
                if time.monotonic() >= due:
                    del resend_at[message_id]
                    again = _again(sent[message_id], deadline - time.monotonic())
                    [new_id] = self.grid.push_messages([again])
                    sent[new_id], first_of[new_id] = again, first_of[message_id]
                    waiting.add(new_id)
            time.sleep(PULL_INTERVAL_S)
        return replies

    def round_results(
        self, global_vector: Tensor, round_number: int, client_ids: Sequence[int]
    ) -> ResultOf:
        return self._round_results(global_vector, round_number, client_ids, None)

    def train_with_control(
        self, global_vector: Tensor, round_number: int, client_ids: Sequence[int],
        control: Tensor, on_result: OnResult | None = None,
    ) -> list[ClientResult]:  # fmt: skip
        """SCAFFOLD's round: the sites are sent the server's ``control`` c; each keeps its
        own c_i and answers with Δc_i beside its update."""
        result_of = self._round_results(global_vector, round_number, client_ids, control)
        return collect_results(client_ids, result_of, on_result)

    def _round_results(
        self, global_vector: Tensor, round_number: int, client_ids: Sequence[int],
        control: Tensor | None,
    ) -> ResultOf:  # fmt: skip
        ready = self._take_trained(global_vector, round_number, control)
        missing = [i for i in client_ids if i not in ready]
        replies = (
            self._send("train", global_vector, round_number, missing, control=control)
            if missing
            else {}
        )

        def result(client_id: int) -> ClientResult:
            if client_id in ready:
                return ready[client_id]
            return self._result(client_id, replies.get(client_id), global_vector, control)

        return result

    def _take_trained(
        self, global_vector: Tensor, round_number: int, control: Tensor | None
    ) -> dict[int, ClientResult]:
        """The updates trained with the last scoring, if they are for this model, round
        and control variate (used once)."""
        trained, self._trained = self._trained, None
        if trained is None or trained.round != round_number:
            return {}
        if not torch.equal(trained.vector, global_vector.detach().cpu()):
            return {}
        if not _same(trained.control, control):
            return {}
        return trained.results

    def _result(
        self, client_id: int, reply: Message | None, like: Tensor, control: Tensor | None = None
    ) -> ClientResult:
        """The site's answer as a result; under SCAFFOLD (``control`` sent) it must carry
        the site's Δc_i."""
        if reply is None:
            return ClientResult(
                client_id, "timeout", message=f"no reply within {self.round_timeout:g} s"
            )
        if reply.has_error():
            error = reply.error
            if error.code in EXPIRED:  # the task expired unanswered: as no reply at all
                return ClientResult(
                    client_id, "timeout", message=f"no reply within {self.round_timeout:g} s"
                )
            outcome = "unavailable" if error.code == ErrorCode.NODE_UNAVAILABLE else "error"
            return ClientResult(client_id, outcome, message=_one_line(error.reason))
        if "train_refused" in reply.content:  # it scored the model, but would not train
            reason = str(reply.content["train_refused"]["reason"])
            return ClientResult(client_id, "error", message=_one_line(reason))
        if control is not None and "control" not in reply.content:
            return ClientResult(
                client_id, "error", message="no control delta with the update (SCAFFOLD)"
            )
        try:
            delta = reply.content["update"]["vector"].numpy()
            metrics = reply.content["metrics"]
            change = reply.content["control"]["vector"].numpy() if control is not None else None
            update = ClientUpdate(
                client_id=client_id,
                delta=torch.from_numpy(np.array(delta)).to(like.device),
                num_samples=int(metrics["num_samples"]),
                train_loss=float(metrics["train_loss"]),
                control_delta=None
                if change is None
                else torch.from_numpy(np.array(change)).to(like.device),
            )
        except Exception as error:  # a reply without the records a site sends
            return ClientResult.failed(client_id, error)
        return ClientResult(client_id, "ok", update)

    def pretest_updates(
        self, global_vector: Tensor, round_number: int, client_ids: Sequence[int], mode: str
    ) -> dict[int, Tensor]:
        """What EMA's pre-test examines, from each site that answered (by client id): the
        gradient at ``global_vector`` (``mode`` ``gradient``) or one local epoch's update
        (``delta``, with ``round_number``'s batch order); a site that did not is logged."""
        replies = self._send(
            "query.pretest", global_vector, round_number, client_ids, ConfigRecord({"mode": mode})
        )
        updates = {}
        for client_id in client_ids:
            result = self._result(client_id, replies.get(client_id), global_vector)
            delta = None if result.update is None else result.update.delta
            if delta is None or delta.shape != global_vector.shape or not delta.isfinite().all():
                why = result.message or "not a finite vector of the model's size"
                log.warning("site %d sent no pre-test update: %s", client_id, why)
                continue
            updates[client_id] = delta
        return updates

    def validate(self, candidates: Tensor, client_ids: Sequence[int]) -> list[HeldOutLosses]:
        """Each site's losses of the candidate models ``(k, d)`` on its held-out split (one
        ``query.validate`` message each; the sites that answered with ``k`` losses and a
        count; a site that did not is logged and left out of the vote)."""
        replies = self._send(
            "query.validate", candidates[0], self._round, client_ids, candidates=candidates
        )
        answers = []
        for client_id in client_ids:
            reply = replies.get(client_id)
            if reply is None or reply.has_error():
                reason = "no reply" if reply is None else _one_line(reply.error.reason)
                log.warning("site %d did not validate the candidates: %s", client_id, reason)
                continue
            try:
                answers.append(_held_out_losses(client_id, reply, len(candidates)))
            except (KeyError, TypeError, ValueError) as error:
                log.warning(
                    "site %d sent validation losses that do not add up: %s", client_id, error
                )
        return answers

    def score(
        self, global_vector: Tensor, client_ids: Sequence[int], request: ScoreRequest,
        then_train: NextRound | None = None,
    ) -> list[SiteEvaluation]:  # fmt: skip
        """Each site's answer to ``request`` for ``global_vector`` on its own held-out
        splits (the sites that answered, with summaries that add up); the ``then_train``
        round's clients train on it in the same exchange."""
        known = self._known_losses(global_vector, client_ids, request, then_train)
        if known is not None:
            return known
        training = [i for i in (then_train.client_ids if then_train else ()) if i in client_ids]
        round_number = then_train.round if then_train and training else 0
        replies = self._send(
            "evaluate", global_vector, round_number, client_ids, request_record(request), training,
            control=then_train.control if then_train is not None and training else None,
        )  # fmt: skip
        evaluations = self._evaluations(client_ids, replies, request)
        if then_train is not None and training:
            control = then_train.control
            self._trained = _Trained(
                then_train.round, global_vector.detach().cpu().clone(),
                {i: self._result(i, replies.get(i), global_vector, control) for i in training},
                request.data_loss, frozenset(client_ids),
                {e.site: e.data_loss for e in evaluations if e.data_loss is not None},
                None if control is None else control.detach().cpu().clone(),
            )  # fmt: skip
        return evaluations

    def _known_losses(
        self, global_vector: Tensor, client_ids: Sequence[int], request: ScoreRequest,
        then_train: NextRound | None,
    ) -> list[SiteEvaluation] | None:  # fmt: skip
        """The sites' losses of their training data for this model, when the request asks
        nothing else and the exchange that trained ``then_train``'s round already brought
        them (the last round's scoring asked for them: the non-IID check's screen then
        costs no exchange of its own)."""
        trained = self._trained
        if (
            trained is None or then_train is None or trained.round != then_train.round
            or request != ScoreRequest(rows=False, data_loss=trained.loss_name)
            or not trained.asked.issuperset(client_ids)
            or not torch.equal(trained.vector, global_vector.detach().cpu())
        ):  # fmt: skip
            return None
        return [
            SiteEvaluation(i, data_loss=trained.losses[i])
            for i in client_ids
            if i in trained.losses
        ]

    def _evaluations(
        self, client_ids: Sequence[int], replies: dict[int, Message], request: ScoreRequest
    ) -> list[SiteEvaluation]:
        evaluations = []
        for client_id in client_ids:
            reply = replies.get(client_id)
            if reply is None or reply.has_error():
                reason = "no reply" if reply is None else _one_line(reply.error.reason)
                if reason.startswith(DIVERGED):  # as the hub's own scoring: the run stops
                    raise ModelDiverged(f"site {client_id}: {reason.removeprefix(DIVERGED)}")
                log.warning("site %d did not score the model: %s", client_id, reason)
                continue
            try:
                evaluations.append(self._evaluation(client_id, reply, request))
            except (KeyError, TypeError, ValueError) as error:
                log.warning("site %d sent scores that do not add up: %s", client_id, error)
        return evaluations

    def _evaluation(self, client_id: int, reply: Message, request: ScoreRequest) -> SiteEvaluation:
        row: dict[str, float] = {}
        if request.rows:
            scores: MetricRecord = reply.content["scores"]
            if int(scores["n"]):
                row = {"n": int(scores["n"])} | {k: float(v) for k, v in scores.items() if k != "n"}
        classes, multi_label = self.task.classes, self.task.multi_label
        summaries = {
            split: split_summary(
                reply.content[split], classes=classes, multi_label=multi_label, full=request.full
            )
            for split in request.splits
        }
        data_loss = None
        if request.data_loss:
            data_loss = float(reply.content["data"]["loss"])
            if not math.isfinite(data_loss) or data_loss < 0:
                raise ValueError(f"a loss of its training data of {data_loss}")
        return SiteEvaluation(client_id, row, summaries, data_loss)


@dataclass(frozen=True)
class _Trained:
    """Updates the sites trained in a scoring exchange, for the round that asks for them,
    and the losses of their training data that exchange brought (``loss_name``: asked of
    the ``asked`` sites; ``""``: none asked)."""

    round: int
    vector: Tensor
    results: dict[int, ClientResult]
    loss_name: str
    asked: frozenset[int]
    losses: dict[int, float]
    control: Tensor | None = None  # SCAFFOLD's c the sites trained with


def _same(sent: Tensor | None, asked: Tensor | None) -> bool:
    """Whether the control variate the sites trained with is the one the round asks for."""
    if sent is None or asked is None:
        return sent is None and asked is None
    return torch.equal(sent, asked.detach().cpu())


def _held_out_losses(client_id: int, reply: Message, k: int) -> HeldOutLosses:
    """A site's validation answer, checked: a count of at least 0 and one loss (not
    negative) per candidate."""
    record = reply.content["validation"]
    n = int(record["n"])
    losses = tuple(float(x) for x in record["losses"])  # type: ignore[union-attr]
    if n < 0 or len(losses) != k or any(x < 0 for x in losses):
        raise ValueError(f"n = {n} and {len(losses)} losses for {k} candidates")
    return HeldOutLosses(client_id, n, losses)


def _again(message: Message, ttl: float) -> Message:
    """``message`` anew, to be pushed again: its content and destination, the time left."""
    metadata = message.metadata
    return Message(
        message.content, dst_node_id=metadata.dst_node_id, message_type=metadata.message_type,
        group_id=metadata.group_id, ttl=max(ttl, 1.0),
    )  # fmt: skip


def _one_line(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "(no reason given)"
