"""Client execution: the seam between the round loop and wherever clients train.

The round loop hands an executor the round's global vector and the ids of the clients it
sampled (after its own screens); the executor answers one :class:`ClientResult` per id,
in that order: an update, or the reason there is none (``error``, ``timeout``,
``unavailable``). It decides nothing about exclusions: the loop checks every update
(shape, finiteness, registered sample counts) and records every outcome in the trail.
Clients may live elsewhere: a remote executor answers the same call with what arrived.

Two executors train in this process: :class:`SequentialExecutor` (one
:func:`~federated.client.train_client` call per client) and :class:`BatchedExecutor` (all
in one :func:`~federated.batched.train_clients_batched` call, the same updates up to
rounding, falling back to one client at a time if the batched call raises, so a broken
client fails alone). Both, like FedStNN's and the remote one, are :class:`RoundExecutor`
subclasses: the round prepared once, then each client's result in turn.

Sites score the global model where their held-out splits live: a :class:`SiteScorer`
answers a :class:`ScoreRequest` with one :class:`SiteEvaluation` per site that answered
(its own row of scores, and the requested splits as
:class:`~federated.metrics.SplitSummary` aggregates for the hub to pool).
:func:`evaluate_site` is what every site runs, a real one (the Flower ClientApp) and a
simulated one (:class:`LocalSiteScorer`) alike, so both give the same numbers.
"""

from __future__ import annotations

import abc
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from federated.batched import (
    auto_max_parallel,
    batched_pays,
    batched_unsupported_reason,
    train_clients_batched,
)
from federated.client import (
    ClientData,
    ClientUpdate,
    ControlVariates,
    LocalTraining,
    train_client,
)
from federated.metrics import ModelDiverged, SplitSummary, logits_of, scores_of, summarise
from federated.vectors import vector_to_model_
from registry.constraints import Options, allowed, check_fields

__all__ = [
    "BatchedExecutor",
    "ClientExecutor",
    "ClientResult",
    "ControlledExecutor",
    "HeldOutLosses",
    "LocalSiteScorer",
    "NextRound",
    "OnResult",
    "Outcome",
    "ResultOf",
    "RoundExecutor",
    "ScoreRequest",
    "SequentialExecutor",
    "SiteEvaluation",
    "SiteScorer",
    "SiteValidator",
    "collect_results",
    "evaluate_site",
    "held_out_losses",
    "local_executor",
    "validation_split",
]

Outcome = Literal["ok", "error", "timeout", "unavailable"]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientResult:
    """What came back from one client: its update (``outcome == "ok"``) or why none did."""

    client_id: int
    outcome: Outcome
    update: ClientUpdate | None = None
    message: str = ""  # the error, in one line, when there is no update

    @classmethod
    def failed(cls, client_id: int, error: Exception) -> ClientResult:
        return cls(client_id, "error", message=f"{type(error).__name__}: {error}")


OnResult = Callable[[ClientResult], None]  # told of each result as it comes (progress)
ResultOf = Callable[[int], ClientResult]  # a client id -> its result


def collect_results(
    client_ids: Sequence[int],
    result_of: ResultOf,
    on_result: OnResult | None = None,
) -> list[ClientResult]:
    """``result_of`` each id, in order, each told to ``on_result`` as it is made (a
    progress bar moves while clients train one after another)."""
    results = []
    for client_id in client_ids:
        results.append(result := result_of(client_id))
        if on_result is not None:
            on_result(result)
    return results


class ClientExecutor(Protocol):
    """Trains the sampled clients of a round from the global vector."""

    def train(
        self,
        global_vector: Tensor,
        round_number: int,
        client_ids: Sequence[int],
        on_result: OnResult | None = None,
    ) -> list[ClientResult]:
        """One result per id, in the order given."""
        ...


@runtime_checkable
class ControlledExecutor(Protocol):
    """Trains SCAFFOLD's round where the clients keep their own variates c_i (real sites):
    it is given the server's c only, and each update carries the client's Δc_i."""

    def train_with_control(
        self,
        global_vector: Tensor,
        round_number: int,
        client_ids: Sequence[int],
        control: Tensor,
        on_result: OnResult | None = None,
    ) -> list[ClientResult]:
        """One result per id, in the order given."""
        ...


class RoundExecutor(abc.ABC):
    """Base for this project's executors: the round is prepared once (a batched call, the
    messages to the sites, the round's learning rate), then each id's result is made in
    the order asked and told to ``on_result`` (:func:`collect_results`)."""

    def train(
        self,
        global_vector: Tensor,
        round_number: int,
        client_ids: Sequence[int],
        on_result: OnResult | None = None,
    ) -> list[ClientResult]:
        result_of = self.round_results(global_vector, round_number, client_ids)
        return collect_results(client_ids, result_of, on_result)

    @abc.abstractmethod
    def round_results(
        self, global_vector: Tensor, round_number: int, client_ids: Sequence[int]
    ) -> ResultOf:
        """What the round needs before any result, done now; then each id's result."""


SPLITS = ("test", "val")  # the held-out splits a site may be asked to summarise
DATA_LOSSES = ("", "mse", "cross_entropy")  # the non-IID check's losses (none, or one)


@dataclass(frozen=True, kw_only=True)
class ScoreRequest:
    """What the hub asks the sites to score: the splits to summarise for pooling
    (``test``, ``val``), whether fully (loss, ACC, AUC, ECE, Brier) or loss and ACC only,
    whether each site's own row of scores on its test split (per-site evaluation), and
    ``data_loss``: the model's loss on the site's training data (``mse`` or
    ``cross_entropy``, EMA's non-IID check; one number, the data stays; ``""``: not asked)."""

    splits: tuple[str, ...] = ()
    full: bool = True
    rows: bool = True
    data_loss: str = field(default="", metadata=allowed(Options(DATA_LOSSES)))

    def __post_init__(self) -> None:
        check_fields(self)
        unknown = [s for s in self.splits if s not in SPLITS]
        if unknown:
            raise ValueError(f"splits must be among {SPLITS}, got {unknown}")

    def to_config(self) -> dict[str, str | bool]:
        """The request as flat values, as it travels to a site."""
        return {
            "splits": ",".join(self.splits), "full": self.full, "rows": self.rows,
            "data_loss": self.data_loss,
        }  # fmt: skip

    @classmethod
    def from_config(cls, values: Mapping[str, Any]) -> ScoreRequest:
        """The request a site was sent (:meth:`to_config`)."""
        splits = tuple(s for s in str(values["splits"]).split(",") if s)
        return cls(
            splits=splits, full=bool(values["full"]), rows=bool(values["rows"]),
            data_loss=str(values.get("data_loss", "")),
        )  # fmt: skip


@dataclass(frozen=True)
class SiteEvaluation:
    """One site's answer: its row (``n``, ``loss``, ``acc``, ``auc``, ... of its test
    split, fully scored; empty when not asked or it holds no test split), a summary of
    each requested split (``n == 0`` for a split it does not hold) and, when asked, the
    model's loss on its training data (``data_loss``)."""

    site: int
    row: dict[str, float] = field(default_factory=dict)
    splits: dict[str, SplitSummary] = field(default_factory=dict)
    data_loss: float | None = None


@dataclass(frozen=True)
class NextRound:
    """The round that follows a scoring, and the clients it samples: they will train on
    the model just scored (a scorer at remote sites has them do both in one exchange)."""

    round: int
    client_ids: tuple[int, ...]
    # SCAFFOLD: the server's control variate c the round's clients train with (d,)
    control: Tensor | None = None


class SiteScorer(Protocol):
    """Scores the global model on sites' own held-out splits, where those splits live."""

    def score(
        self, global_vector: Tensor, client_ids: Sequence[int], request: ScoreRequest,
        then_train: NextRound | None = None,
    ) -> list[SiteEvaluation]:  # fmt: skip
        """One evaluation per site that answered, in the order of ``client_ids``.
        ``then_train``: the next round's clients, who will train on ``global_vector``
        (a hint; the next round asks its executor for their updates all the same)."""
        ...


def evaluate_site(
    model: nn.Module,
    splits: Mapping[str, tuple[Tensor, Tensor]],
    request: ScoreRequest,
    *,
    multi_label: bool,
    batch_size: int,
) -> tuple[dict[str, float], dict[str, SplitSummary]]:
    """What a site answers ``request`` with, scoring ``model`` (the global weights loaded)
    on its held-out ``splits`` (name -> images, targets; a missing one is empty): its row
    and the requested summaries (see :class:`SiteEvaluation`)."""
    row: dict[str, float] = {}
    summaries: dict[str, SplitSummary] = {}
    wanted = dict.fromkeys([*request.splits, *(["test"] if request.rows else [])])
    for name in wanted:
        images, targets = splits.get(name, (None, None))
        if targets is None or not len(targets):
            if name in request.splits:
                summaries[name] = SplitSummary(0, math.nan, math.nan)
            continue
        logits = logits_of(model, images, batch_size)
        scores: dict[str, float] | None = None
        if name in request.splits:
            summaries[name], scores = summarise(
                logits, targets, multi_label=multi_label, full=request.full
            )
        if name == "test" and request.rows:
            if scores is None or not request.full:  # a site's row is always scored fully
                scores = scores_of(logits, targets, multi_label=multi_label)
            row = {"n": float(len(targets)), **scores}
    return row, summaries


@dataclass(frozen=True)
class HeldOutLosses:
    """One site's answer to a validation request: its held-out count and its mean loss of
    each candidate model, in the order asked (``inf`` where the model's outputs are not
    finite there). Nothing else about its data."""

    site: int
    n: int
    losses: tuple[float, ...]


class SiteValidator(Protocol):
    """Scores candidate models on sites' own held-out splits, where those splits live."""

    def validate(self, candidates: Tensor, client_ids: Sequence[int]) -> list[HeldOutLosses]:
        """Each answering site's losses of the models ``candidates`` ``(k, d)`` (full model
        vectors), in the order of ``client_ids``."""
        ...


def validation_split(
    splits: Mapping[str, tuple[Tensor, Tensor]],
) -> tuple[Tensor, Tensor] | None:
    """The split a site validates candidates on: its validation split, or, holding none,
    its held-out test split (None when it holds neither)."""
    for name in ("val", "test"):
        images, targets = splits.get(name, (None, None))
        if images is not None and targets is not None and len(targets):
            return images, targets
    return None


def held_out_losses(
    model: nn.Module,
    candidates: Tensor,
    split: tuple[Tensor, Tensor] | None,
    *,
    multi_label: bool,
    batch_size: int,
) -> tuple[int, tuple[float, ...]]:
    """What every site (real or simulated) answers a validation request with: the size of
    its held-out ``split`` and the mean loss of each candidate model ``(k, d)`` on it
    (``nan`` for each when it holds no split)."""
    if split is None:
        return 0, tuple(math.nan for _ in range(len(candidates)))
    images, targets = split
    losses = []
    for vector in candidates:
        vector_to_model_(model, vector)
        try:
            with torch.no_grad():
                logits = logits_of(model.eval(), images, batch_size)
            losses.append(scores_of(logits, targets, multi_label=multi_label, full=False)["loss"])
        except ModelDiverged:
            losses.append(math.inf)
    return len(targets), tuple(float(x) for x in losses)


@dataclass(frozen=True, kw_only=True)
class LocalSiteScorer:
    """Sites simulated in this process: each client's held-out splits (client id -> split
    name -> images, targets), scored on the workspace ``model`` as a site scores them."""

    model: nn.Module
    splits: dict[int, dict[str, tuple[Tensor, Tensor]]]
    multi_label: bool
    batch_size: int

    def score(
        self, global_vector: Tensor, client_ids: Sequence[int], request: ScoreRequest,
        then_train: NextRound | None = None,
    ) -> list[SiteEvaluation]:  # fmt: skip
        vector_to_model_(self.model, global_vector)
        self.model.eval()
        evaluations = []
        for client_id in client_ids:
            row, summaries = evaluate_site(
                self.model, self.splits.get(client_id, {}), request,
                multi_label=self.multi_label, batch_size=self.batch_size,
            )  # fmt: skip
            evaluations.append(SiteEvaluation(client_id, row, summaries))
        return evaluations

    def validate(self, candidates: Tensor, client_ids: Sequence[int]) -> list[HeldOutLosses]:
        """Each site's losses of the ``candidates`` on its held-out split, as a site
        computes them (:func:`held_out_losses`)."""
        answers = []
        for client_id in client_ids:
            split = validation_split(self.splits.get(client_id, {}))
            n, losses = held_out_losses(
                self.model, candidates, split, multi_label=self.multi_label,
                batch_size=self.batch_size,
            )  # fmt: skip
            answers.append(HeldOutLosses(client_id, n, losses))
        return answers


SeedOf = Callable[[int, int], int]  # (round, client id) -> the client's shuffle seed
EpochsOf = Callable[[int, int], int]  # (round, client id) -> the client's local epochs


@dataclass(frozen=True, kw_only=True)
class SequentialExecutor(RoundExecutor):
    """Each client trained alone on the shared workspace ``model``, one after another."""

    model: nn.Module  # the workspace: loaded with the global vector for each client
    clients: dict[int, ClientData]  # by client id
    local: LocalTraining
    loss_fn: nn.Module
    seed_of: SeedOf
    epochs_of: EpochsOf | None = None  # heterogeneous local work; None: local.epochs

    def round_results(
        self, global_vector: Tensor, round_number: int, client_ids: Sequence[int]
    ) -> ResultOf:
        return lambda client_id: self.train_one(global_vector, round_number, client_id)

    def local_of(self, round_number: int, client_id: int) -> LocalTraining:
        """The client's local training in the round: its drawn epochs, if any."""
        if self.epochs_of is None:
            return self.local
        return replace(self.local, epochs=self.epochs_of(round_number, client_id))

    def train_with_controls(
        self,
        global_vector: Tensor,
        round_number: int,
        controls: Mapping[int, ControlVariates],
        on_result: OnResult | None = None,
    ) -> list[ClientResult]:
        """SCAFFOLD's round: each client in ``controls`` trained with its control
        variates (its update carries Δc_i), in that order."""
        ids = list(controls)
        return collect_results(
            ids, lambda i: self.train_one(global_vector, round_number, i, controls[i]), on_result
        )

    def train_one(
        self,
        global_vector: Tensor,
        round_number: int,
        client_id: int,
        control: ControlVariates | None = None,
    ) -> ClientResult:
        try:
            update = train_client(
                self.model, global_vector, self.clients[client_id],
                self.local_of(round_number, client_id), self.loss_fn,
                seed=self.seed_of(round_number, client_id), control=control,
            )  # fmt: skip
        except Exception as error:  # a broken client must not stop the federation
            return ClientResult.failed(client_id, error)
        return ClientResult(client_id, "ok", update)


@dataclass(frozen=True, kw_only=True)
class BatchedExecutor(RoundExecutor):
    """All clients in one batched call; client by client (``sequential``) if it raises."""

    sequential: SequentialExecutor
    max_parallel: int | None = None  # clients trained at once (None: sized to memory)

    def round_results(
        self, global_vector: Tensor, round_number: int, client_ids: Sequence[int]
    ) -> ResultOf:
        return self._batched(global_vector, round_number, client_ids, None)

    def train_with_controls(
        self,
        global_vector: Tensor,
        round_number: int,
        controls: Mapping[int, ControlVariates],
        on_result: OnResult | None = None,
    ) -> list[ClientResult]:
        """SCAFFOLD's round: the clients in ``controls`` trained at once, each with its
        control variates (its update carries Δc_i)."""
        ids = list(controls)
        result_of = self._batched(global_vector, round_number, ids, controls)
        return collect_results(ids, result_of, on_result)

    def _batched(
        self, global_vector: Tensor, round_number: int, client_ids: Sequence[int],
        controls: Mapping[int, ControlVariates] | None,
    ) -> ResultOf:  # fmt: skip
        one = self.sequential
        groups: dict[LocalTraining, list[int]] = {}  # clients by their round's local epochs
        for client_id in client_ids:
            groups.setdefault(one.local_of(round_number, client_id), []).append(client_id)
        try:
            updates = [
                update
                for local, ids in groups.items()
                for update in train_clients_batched(
                    one.model, global_vector, [one.clients[i] for i in ids], local, one.loss_fn,
                    seeds=[one.seed_of(round_number, i) for i in ids],
                    max_parallel=self.max_parallel,
                    controls=None if controls is None else [controls[i] for i in ids],
                )
            ]  # fmt: skip
        except Exception as error:  # retried client by client: a broken one fails alone
            log.warning(
                "round %d: batched training failed (%s: %s); training clients one by one",
                round_number, type(error).__name__, error,
            )  # fmt: skip
            return lambda client_id: one.train_one(
                global_vector, round_number, client_id,
                None if controls is None else controls[client_id],
            )  # fmt: skip
        by_id = {u.client_id: u for u in updates}
        return lambda client_id: ClientResult(client_id, "ok", by_id[client_id])


def local_executor(
    model: nn.Module,
    clients: Sequence[Any],
    local: LocalTraining,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    seed_of: Callable[[int, int], int],
    *,
    backend: str,
    max_parallel: int | None,
    epochs_of: EpochsOf | None = None,
) -> SequentialExecutor | BatchedExecutor:
    """This process's executor for the ``clients`` held here (``ClientData``; the others
    are skipped): the sequential one, or the batched one where ``backend`` asks for it
    (``auto``: where it supports the model and pays on its device). ``seed_of(round,
    client)`` seeds a client's shuffling; ``epochs_of(round, client)``, if given, sets its
    local epochs (the batched one trains each group of equal epochs in one call)."""
    sequential = SequentialExecutor(
        model=model,
        clients={c.client_id: c for c in clients if isinstance(c, ClientData)},
        local=local,
        loss_fn=loss_fn,
        seed_of=seed_of,
        epochs_of=epochs_of,
    )
    unsupported = None if backend == "sequential" else batched_unsupported_reason(model)
    if backend == "batched" and unsupported is not None:
        raise ValueError(f"backend 'batched' cannot train this model: {unsupported}")
    device = next(model.parameters()).device
    batched = backend == "batched" or (
        backend == "auto" and unsupported is None and batched_pays(model, device)
    )
    if not batched:
        return sequential
    if max_parallel is None:  # sized to free memory once, not every round
        sample = next(c for c in clients if isinstance(c, ClientData)).images
        max_parallel = auto_max_parallel(model, sample, local.batch_size)
    return BatchedExecutor(sequential=sequential, max_parallel=max_parallel)
