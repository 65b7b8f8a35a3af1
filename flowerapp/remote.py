"""The remote executor: a round's sampled sites trained through Flower's ``Grid``.

It sends each sampled site the global vector and the task (:class:`flowerapp.task.SiteTask`
with the round, the site's client id and its batch-order seed) in one ``train`` message,
waits up to ``round_timeout`` seconds (``Grid.send_and_receive`` returns what arrived by
then) and answers the round loop one :class:`~federated.execution.ClientResult` per site:
the update, or why there is none (``timeout``: no reply; ``unavailable``: Flower's reply
for a node that is not connected; ``error``: the site's refusal or failure, its reason in
one line). Checking what came back (shape, finiteness, the reported sample count against
the registered one) is the round loop's job, as for every executor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from torch import Tensor

from federated.client import ClientUpdate
from federated.execution import ClientResult, OnResult, collect_results
from flowerapp.task import SiteTask

__all__ = ["RemoteExecutor", "vector_record"]

log = logging.getLogger(__name__)
SeedOf = Callable[[int, int], int]


def vector_record(vector: Tensor) -> ArrayRecord:
    """A flat float vector as the one array of a record (the global model, an update)."""
    return ArrayRecord({"vector": Array(vector.detach().cpu().numpy())})


class RemoteExecutor:
    """Trains and scores the sampled clients at their sites (client id -> Flower node)."""

    def __init__(
        self,
        grid: Grid,
        nodes: dict[int, int],
        task: SiteTask,
        *,
        seed_of: SeedOf,
        round_timeout: float,
    ) -> None:
        self.grid = grid
        self.nodes = nodes
        self.task = task
        self.seed_of = seed_of
        self.round_timeout = round_timeout
        self.bytes_sent = 0  # the global vectors sent, for the transport's measurements

    def _send(
        self, kind: str, vector: Tensor, round_number: int, client_ids: Sequence[int]
    ) -> dict[int, Message]:
        """One message per client; the replies that arrived in time, by client id."""
        record = vector_record(vector)
        messages = []
        for client_id in client_ids:
            task = replace(
                self.task, round=round_number, client=client_id,
                shuffle_seed=self.seed_of(round_number, client_id),
            )  # fmt: skip
            content = RecordDict({"global": record, "task": ConfigRecord(task.to_config())})
            messages.append(
                Message(
                    content,
                    dst_node_id=self.nodes[client_id],
                    message_type=kind,
                    group_id=str(round_number),
                    ttl=self.round_timeout,  # a task left undelivered by the deadline expires
                )
            )
        self.bytes_sent += record.count_bytes() * len(messages)
        replies = list(self.grid.send_and_receive(messages, timeout=self.round_timeout))
        # by the message each replies to: Flower's own error replies (an unreachable node)
        # come from the SuperLink, not from the site
        sent = {m.metadata.message_id: i for m, i in zip(messages, client_ids, strict=True)}
        return {
            sent[r.metadata.reply_to_message_id]: r
            for r in replies
            if r.metadata.reply_to_message_id in sent
        }

    def train(
        self,
        global_vector: Tensor,
        round_number: int,
        client_ids: Sequence[int],
        on_result: OnResult | None = None,
    ) -> list[ClientResult]:
        replies = self._send("train", global_vector, round_number, client_ids)
        return collect_results(
            client_ids, lambda i: self._result(i, replies.get(i), global_vector), on_result
        )

    def _result(self, client_id: int, reply: Message | None, like: Tensor) -> ClientResult:
        if reply is None:
            return ClientResult(
                client_id, "timeout", message=f"no reply within {self.round_timeout:g} s"
            )
        if reply.has_error():
            error = reply.error
            outcome = "unavailable" if error.code == ErrorCode.NODE_UNAVAILABLE else "error"
            return ClientResult(client_id, outcome, message=_one_line(error.reason))
        try:
            delta = reply.content["update"]["vector"].numpy()
            metrics = reply.content["metrics"]
            update = ClientUpdate(
                client_id=client_id,
                delta=torch.from_numpy(np.array(delta)).to(like.device),
                num_samples=int(metrics["num_samples"]),
                train_loss=float(metrics["train_loss"]),
            )
        except Exception as error:  # a reply without the records a site sends
            return ClientResult.failed(client_id, error)
        return ClientResult(client_id, "ok", update)

    def score(self, global_vector: Tensor, client_ids: Sequence[int]) -> list[dict[str, float]]:
        """Each site's scores of ``global_vector`` on its own held-out split (the sites
        that answered and hold one)."""
        replies = self._send("evaluate", global_vector, 0, client_ids)
        rows = []
        for client_id in client_ids:
            reply = replies.get(client_id)
            if reply is None or reply.has_error():
                reason = "no reply" if reply is None else _one_line(reply.error.reason)
                log.warning("site %d did not score the model: %s", client_id, reason)
                continue
            scores: MetricRecord = reply.content["scores"]
            size = int(scores["n"])
            if size:
                rest = {k: float(v) for k, v in scores.items() if k != "n"}
                rows.append({"site": client_id, "n": size, **rest})
        return rows


def _one_line(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "(no reason given)"
