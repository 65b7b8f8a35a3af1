"""The server's round: sample clients, have them trained, screen their updates, aggregate,
evaluate. (The loop over rounds is :func:`federated.loop.train`.)

A :class:`Federation` is assembled from frozen parts: the clients and their
:class:`~federated.client.LocalTraining`, the :class:`FederationConfig`, the
:class:`Defence`, the :class:`ThreatModel`, the :class:`EvaluationSets` and the
:class:`Execution`.

All memory lives in :class:`ServerState` (the global model vector, the aggregator's and
filters' states, the per-round metrics and the exclusion trail), which
:meth:`ServerState.to_dict` turns into tensors and plain values for a checkpoint that
``torch.load(weights_only=True)`` reads back. Random draws come from seeds derived from
(run seed, round, client), so a resumed run is identical to an uninterrupted one.

Screening order in a round, each dropped client recorded in the trail with its reason:
0. ``noniid_loss`` (optional): the global model's loss on the client's data is an
   outlier (z-score > z); the client is left out before training.
1. ``client_error`` / ``client_timeout`` / ``client_unavailable``: no update came back
   from the executor (:mod:`federated.execution`); ``bad_update``: one came, of the wrong
   shape or dtype. The round goes on with the rest.
2. ``non_finite``: the update holds NaN or Inf; it can never reach the global model.
3. filters (e.g. ``pid_made``), in the configured order.
4. the aggregation rule (selection rules report their implicit choice as ``not_selected``).
A round with fewer than ``min_clients`` survivors is skipped: the global model is kept.

Per-site evaluation: given each client's local test split (``sites``), the new global
model is scored on every site every ``site_every`` rounds and in the last round; the rows
go to :attr:`ServerState.sites`, their spread (worst site, ...) to the round's metrics.

Where the round's test and validation scores come from (:class:`EvaluationSets`'
``where``): the server's own splits (``hub``), or the sites' held-out splits
(``sites``: every site summarises its test and validation splits every round,
:mod:`federated.execution`, and the server pools the summaries,
:func:`federated.metrics.pooled_scores`; the server then holds no evaluation data).

Client-level differential privacy (``privacy``, :mod:`federated.privacy`): the updates
that reach the rule are clipped and weighted equally, and the released aggregate is
DP-FedAvg's noisy fixed-denominator mean; every round logs ε, and
:meth:`Federation.budget_spent` says when the next round would pass the target. In
``local`` mode the server noises the updates of the clients simulated here on their
behalf (a real site, a client holding no data here, sends its update noised), and each
client's own ε against the server goes into its trail row (``privacy_epsilon``).

Clients are trained by an executor (:mod:`federated.execution`), which decides nothing
about exclusions. :class:`Execution`'s ``backend`` picks this process's: ``sequential``,
``batched`` (the same updates up to rounding) or ``auto`` (batched where
:func:`~federated.batched.batched_pays` and :func:`~federated.batched.supports_batched`
say so: on a CUDA device, and on a CPU for models without convolutions); its
``executor`` replaces them with one of the caller's, e.g. clients that live elsewhere.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor, nn

from aggregation.base import AggregationRule, Filter, PreAggregator, drop_non_finite
from aggregation.defence import Rows, RuleOutcome, run_filters, run_rule
from aggregation.mean import FedAvg
from federated.attacks.base import ModelAttack
from federated.backdoor_eval import attack_success_rate
from federated.batched import auto_max_parallel, batched_pays, batched_unsupported_reason
from federated.client import (
    ClientData,
    ClientUpdate,
    LocalTraining,
    RegisteredClient,
    train_client,
)
from federated.execution import (
    BatchedExecutor,
    ClientExecutor,
    ClientResult,
    LocalSiteScorer,
    NextRound,
    ScoreRequest,
    SequentialExecutor,
    SiteEvaluation,
    SiteScorer,
)
from federated.layout import use_fast_layout_
from federated.metrics import (
    evaluate,
    loss_function,
    pooled_scores,
    site_scores,
    site_summary,
)
from federated.privacy import ClientPrivacy
from federated.seeding import (
    ATTACK,
    PREAGGREGATION,
    PRIVACY,
    SHUFFLE,
    clients_per_round,
    derive_seed,
    sample_clients,
    torch_generator,
)
from federated.stats.noniid import (
    NonIIDResult,
    client_losses,
    noniid_exclusions,
    noniid_verdict,
)
from federated.vectors import model_to_vector, vector_to_model_

__all__ = [
    "Backend",
    "Defence",
    "EvaluationSets",
    "Execution",
    "Federation",
    "FederationConfig",
    "NonIIDCheck",
    "RoundReport",
    "ServerState",
    "ThreatModel",
    "detection_counts",
    "left_out",
]

Backend = Literal["sequential", "batched", "auto"]


@dataclass(frozen=True, kw_only=True)
class FederationConfig:
    rounds: int
    client_fraction: float = 1.0  # share of clients sampled per round
    server_lr: float = 1.0  # global += server_lr * aggregated update
    min_clients: int = 1  # fewer survivors than this: the round is skipped
    seed: int = 0
    eval_batch_size: int = 512
    # the model a run ends with: the last round's, or the round with the best validation
    # AUC (MedMNIST's protocol; earliest on ties; needs the Federation's ``val`` split)
    select: Literal["last", "best_val"] = "last"
    # fail closed: the most clients a round may leave out (filters, screens, non-finite
    # updates, a selecting rule's choice): an int is a count, a float in [0, 1) a share of
    # the round's sampled clients; a round above it is not aggregated and halts the run
    max_excluded: int | float | None = None
    site_every: int = 1  # score the sites' local test splits every N rounds (and the last)
    target_acc: float = 0.8  # per-site evaluation: the share of sites reaching it
    # what every round scores on the test (and validation) split: loss, ACC, AUC, ECE and
    # Brier ("full"), or loss and ACC ("accuracy"; the last round is always scored fully)
    round_scores: Literal["full", "accuracy"] = "full"

    def __post_init__(self) -> None:
        if isinstance(self.max_excluded, bool) or (
            self.max_excluded is not None
            and not (
                (isinstance(self.max_excluded, int) and self.max_excluded >= 0)
                or (isinstance(self.max_excluded, float) and 0 <= self.max_excluded < 1)
            )
        ):
            raise ValueError(
                f"max_excluded must be a count >= 0 or a share in [0, 1), got {self.max_excluded!r}"
            )
        if self.select not in ("last", "best_val"):
            raise ValueError(f"select must be 'last' or 'best_val', got {self.select!r}")
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if not 0 < self.client_fraction <= 1:
            raise ValueError(f"client_fraction must be in (0, 1], got {self.client_fraction}")
        if self.server_lr <= 0 or self.min_clients < 1:
            raise ValueError("server_lr must be > 0 and min_clients >= 1")
        if self.site_every < 1:
            raise ValueError(f"site_every must be >= 1, got {self.site_every}")
        if self.round_scores not in ("full", "accuracy"):
            raise ValueError(
                f"round_scores must be 'full' or 'accuracy', got {self.round_scores!r}"
            )
        if self.round_scores == "accuracy" and self.select == "best_val":
            raise ValueError(
                "select='best_val' picks by validation AUC: it needs round_scores='full'"
            )


@dataclass(frozen=True, kw_only=True)
class NonIIDCheck:
    """EMA's non-IID check: client losses of the global model, CV = σ/μ vs ``threshold``."""

    every: int = 1  # rounds between checks (0 = only when excluding)
    loss: str = "mse"  # "mse" (softmax vs one-hot, the paper's) or "cross_entropy"
    threshold: float = 0.25
    exclude: bool = False  # leave out clients whose loss z-score exceeds z
    z: float = 2.0


@dataclass
class ServerState:
    """Everything a round needs from the past; ``round`` counts completed rounds."""

    round: int
    global_vector: Tensor
    aggregator_state: dict[str, Any]
    filter_states: list[dict[str, Any]]
    history: list[dict[str, float]] = field(default_factory=list)
    trail: list[dict[str, Any]] = field(default_factory=list)
    # select="best_val": the best round so far by validation AUC, and its global weights
    best_round: int = 0
    best_val_auc: float = -math.inf
    best_vector: Tensor | None = None
    attack_state: dict[str, Any] = field(default_factory=dict)  # a model attack's memory
    preaggregator_states: list[dict[str, Any]] = field(default_factory=list)
    halted: str | None = None  # why the run stopped (max_excluded), in one line
    sites: list[dict[str, float]] = field(default_factory=list)  # per-site scores by round

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "global_vector": self.global_vector.detach().cpu(),
            "aggregator_state": self.aggregator_state,
            "filter_states": self.filter_states,
            "history": self.history,
            "trail": self.trail,
            "best_round": self.best_round,
            "best_val_auc": self.best_val_auc,
            "best_vector": None if self.best_vector is None else self.best_vector.detach().cpu(),
            "attack_state": self.attack_state,
            "preaggregator_states": self.preaggregator_states,
            "halted": self.halted,
            "sites": self.sites,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], device: torch.device | str = "cpu") -> ServerState:
        best_vector = data.get("best_vector")
        return cls(
            round=int(data["round"]),
            global_vector=data["global_vector"].to(device),
            aggregator_state=data["aggregator_state"],
            filter_states=list(data["filter_states"]),
            history=list(data["history"]),
            trail=list(data["trail"]),
            best_round=int(data.get("best_round", 0)),
            best_val_auc=float(data.get("best_val_auc", -math.inf)),
            best_vector=None if best_vector is None else best_vector.to(device),
            attack_state=dict(data.get("attack_state", {})),
            preaggregator_states=list(data.get("preaggregator_states", [])),
            halted=data.get("halted"),
            sites=list(data.get("sites", [])),
        )

    @property
    def selected_round(self) -> int:
        """The round whose weights :meth:`Federation.selected_model` returns."""
        return self.best_round if self.best_vector is not None else self.round


@dataclass(frozen=True)
class RoundReport:
    round: int  # 1-based
    metrics: dict[str, float]
    clients: list[dict[str, Any]]  # this round's exclusion-trail rows
    sites: list[dict[str, float]] = field(default_factory=list)  # this round's per-site scores


@dataclass(frozen=True)
class Screen:
    """The non-IID screen of one round: client losses and the ids it left out."""

    losses: dict[int, float] = field(default_factory=dict)
    excluded: set[int] = field(default_factory=set)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Aggregation:
    """What aggregating a round produced: the next global vector, the rule's and the
    filters' states, and the ids of the clients that reached the rule."""

    global_vector: Tensor
    aggregator_state: dict[str, Any]
    filter_states: list[dict[str, Any]]
    kept_ids: list[int]
    preaggregator_states: list[dict[str, Any]] = field(default_factory=list)
    attack_state: dict[str, Any] = field(default_factory=dict)
    attack_metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Defence:
    """What the server does with the updates it receives, in order: the non-IID screen,
    the filters, the pre-aggregators, the rule, DP-FedAvg's clipping and noise. ``root``
    (FLTrust's reference update) and ``server_batch`` (Zeno's oracle) are the server's own
    data, for the rules that need them."""

    rule: AggregationRule
    filters: tuple[Filter, ...] = ()
    preaggregators: tuple[PreAggregator, ...] = ()  # in front of the rule, in this order
    noniid: NonIIDCheck | None = None
    privacy: ClientPrivacy | None = None
    root: ClientData | None = None
    server_batch: tuple[Tensor, Tensor] | None = None

    def __post_init__(self) -> None:
        if self.rule.requires_reference and self.root is None:
            raise ValueError(
                f"aggregator {type(self.rule).__name__} needs the server's root data (root=): "
                "its reference update is trained on it every round"
            )


@dataclass(frozen=True, kw_only=True)
class ThreatModel:
    """Who attacks and how: the malicious client ids (their data attack is already in
    their data), the model attack that rewrites their updates every round, and a
    backdoor's triggered test images and target label (its success rate every round)."""

    malicious: frozenset[int] = frozenset()
    model_attack: ModelAttack | None = None
    backdoor_test: tuple[Tensor, int] | None = None


@dataclass(frozen=True, kw_only=True)
class EvaluationSets:
    """Where the global model is scored: the test split every round, the validation
    split (when given; ``select="best_val"`` picks the final model by it) and each site's
    local test split (one per client, in client order), or ``site_scorer``: sites that
    score the model on splits of their own, elsewhere.

    ``where="sites"``: no split here (``test`` and ``val`` are None); the round's test and
    validation scores are pooled from the sites' summaries of their own splits, every
    round (``site_scorer``, or the local ``sites`` and ``site_vals`` scored as a site
    scores them)."""

    test: tuple[Tensor, Tensor] | None = None
    val: tuple[Tensor, Tensor] | None = None
    sites: tuple[tuple[Tensor, Tensor], ...] = ()
    site_vals: tuple[tuple[Tensor, Tensor], ...] = ()  # each site's validation split
    multi_label: bool = False
    site_scorer: SiteScorer | None = None
    where: Literal["hub", "sites"] = "hub"

    def __post_init__(self) -> None:
        if self.where not in ("hub", "sites"):
            raise ValueError(f"where must be 'hub' or 'sites', got {self.where!r}")
        if self.where == "hub" and self.test is None:
            raise ValueError("where='hub' scores the hub's test split: test= is needed")
        if self.where == "sites" and (self.test is not None or self.val is not None):
            raise ValueError("where='sites' scores at the sites: no test= or val= here")
        if self.where == "sites" and self.site_scorer is None and not self.sites:
            raise ValueError("where='sites' needs the sites: site_scorer= or sites=")


@dataclass(frozen=True, kw_only=True)
class Execution:
    """How the sampled clients are trained: by one of this process's backends, or by an
    executor of its own (``executor``, e.g. clients that live elsewhere)."""

    backend: Backend = "sequential"
    max_parallel: int | None = None  # batched: clients trained at once (None: by memory)
    executor: ClientExecutor | None = None

    def __post_init__(self) -> None:
        if self.backend not in get_args(Backend):
            raise ValueError(f"backend must be one of {get_args(Backend)}, got {self.backend!r}")
        if self.max_parallel is not None and self.max_parallel < 1:
            raise ValueError(f"max_parallel must be >= 1 or None, got {self.max_parallel}")


class Federation:
    """A federation assembled from frozen parts (clients, local training, the defence,
    the threat model, the evaluation sets, the execution) and the round step over an
    explicit :class:`ServerState`."""

    def __init__(
        self,
        *,
        model: nn.Module,
        clients: Sequence[ClientData | RegisteredClient],
        local: LocalTraining,
        config: FederationConfig,
        defence: Defence,
        evaluation: EvaluationSets,
        threat: ThreatModel = ThreatModel(),
        execution: Execution = Execution(),
    ) -> None:
        if not clients:
            raise ValueError("a federation needs at least one client")
        if evaluation.sites and len(evaluation.sites) != len(clients):
            raise ValueError(
                f"sites: one local test split per client ({len(clients)}), "
                f"got {len(evaluation.sites)}"
            )
        if evaluation.site_vals and len(evaluation.site_vals) != len(clients):
            raise ValueError(
                f"site_vals: one validation split per client ({len(clients)}), "
                f"got {len(evaluation.site_vals)}"
            )
        _check_evaluation(config, evaluation, defence, threat)
        remote = [c.client_id for c in clients if not isinstance(c, ClientData)]
        if remote and execution.executor is None:
            raise ValueError(
                f"clients {remote[:5]} hold no data here: they need an executor of their "
                "own (execution.executor=)"
            )
        if remote and defence.noniid is not None and evaluation.site_scorer is None:
            raise ValueError(
                f"clients {remote[:5]} hold no data here: the non-IID check needs their "
                "losses from a site scorer (evaluation.site_scorer=)"
            )
        device = (
            evaluation.test[0].device
            if evaluation.test is not None
            else next(model.parameters()).device
        )
        self.model = use_fast_layout_(model, device)  # the workspace
        self._device = device
        self.clients = list(clients)
        self.local = local
        self.config = config
        self.defence = defence
        self.evaluation = evaluation
        self.threat = threat
        self.initial_vector = model_to_vector(self.model).to(self.device)
        self._held_here = {c.client_id for c in self.clients if isinstance(c, ClientData)}
        self.clients_per_round = clients_per_round(config.client_fraction, len(self.clients))
        _check_privacy(defence.privacy, len(self.clients), self.clients_per_round)
        self.loss_fn = loss_function(evaluation.multi_label)
        self.executor = execution.executor or self._local_executor(execution)

    def _local_executor(self, execution: Execution) -> ClientExecutor:
        """The sequential executor, or the batched one where ``backend`` asks for it."""
        sequential = SequentialExecutor(
            model=self.model,
            clients={c.client_id: c for c in self.clients if isinstance(c, ClientData)},
            local=self.local,
            loss_fn=self.loss_fn,
            seed_of=self._shuffle_seed,
        )
        unsupported = (
            None if execution.backend == "sequential" else batched_unsupported_reason(self.model)
        )
        if execution.backend == "batched" and unsupported is not None:
            raise ValueError(f"backend 'batched' cannot train this model: {unsupported}")
        batched = execution.backend == "batched" or (
            execution.backend == "auto"
            and unsupported is None
            and batched_pays(self.model, self.device)
        )
        if not batched:
            return sequential
        max_parallel = execution.max_parallel
        if max_parallel is None:  # sized to free memory once, not every round
            sample = next(c for c in self.clients if isinstance(c, ClientData)).images
            max_parallel = auto_max_parallel(self.model, sample, self.local.batch_size)
        return BatchedExecutor(sequential=sequential, max_parallel=max_parallel)

    @property
    def batched(self) -> bool:
        """Whether the round's clients are trained in one batched call."""
        return isinstance(self.executor, BatchedExecutor)

    @property
    def device(self) -> torch.device:
        return self._device

    def initial_state(self) -> ServerState:
        """Round 0: the model's weights as the federation was built (the workspace model
        holds whatever was loaded last), fresh rule, filter and attack states."""
        return ServerState(
            round=0,
            global_vector=self.initial_vector.clone(),
            aggregator_state=self.defence.rule.init_state(),
            filter_states=[f.init_state() for f in self.defence.filters],
            attack_state=self.threat.model_attack.init_state() if self.threat.model_attack else {},
            preaggregator_states=[p.init_state() for p in self.defence.preaggregators],
        )

    def sample_clients(self, round_number: int) -> list[int]:
        """Seeded choice of ``clients_per_round`` client positions for a round."""
        return sample_clients(
            self.config.seed, round_number, len(self.clients), self.clients_per_round
        )

    def _load(self, vector: Tensor) -> nn.Module:
        vector_to_model_(self.model, vector)
        return self.model.eval()

    def global_model(self, state: ServerState) -> nn.Module:
        """The workspace model holding the state's global weights (eval mode)."""
        return self._load(state.global_vector)

    def selected_model(self, state: ServerState) -> nn.Module:
        """The model the run ends with: the last round's, or (``select="best_val"``) the
        best validation round's (eval mode)."""
        best = state.best_vector
        return self._load(best if best is not None else state.global_vector)

    def _scores(
        self, model: nn.Module, split: tuple[Tensor, Tensor], *, full: bool = True
    ) -> dict[str, float]:
        images, targets = split
        return evaluate(
            model, images, targets, multi_label=self.evaluation.multi_label,
            batch_size=self.config.eval_batch_size, full=full,
        )  # fmt: skip

    def evaluate(
        self, state: ServerState, split: str = "test", *, selected: bool = False
    ) -> dict[str, float]:
        """Loss, ACC and AUC of the state's global model (``selected``: of the model the
        run ends with, see :meth:`selected_model`) on the test or validation split (with
        ``where="sites"``, the sites' pooled splits)."""
        if self.evaluation.where == "sites":
            best = state.best_vector if selected else None
            vector = best if best is not None else state.global_vector
            request = ScoreRequest(splits=(split,), rows=False)
            return self._pooled(self._site_scorer().score(vector, self._ids(), request), split)
        data = self.evaluation.test if split == "test" else self.evaluation.val
        if data is None:
            raise ValueError("this federation has no validation split (val=)")
        model = self.selected_model(state) if selected else self.global_model(state)
        return self._scores(model, data)

    def _ids(self) -> list[int]:
        return [c.client_id for c in self.clients]

    def _site_scorer(self) -> SiteScorer:
        """The sites that score the model: elsewhere (``site_scorer``), or the local
        ``sites`` and ``site_vals`` scored here as a site scores its own."""
        if self.evaluation.site_scorer is not None:
            return self.evaluation.site_scorer
        splits: dict[int, dict[str, tuple[Tensor, Tensor]]] = {}
        for index, client in enumerate(self.clients):
            held = {"test": self.evaluation.sites[index]} if self.evaluation.sites else {}
            if self.evaluation.site_vals:
                held["val"] = self.evaluation.site_vals[index]
            splits[client.client_id] = held
        return LocalSiteScorer(
            model=self.model, splits=splits, multi_label=self.evaluation.multi_label,
            batch_size=self.config.eval_batch_size,
        )  # fmt: skip

    def _pooled(
        self, evaluations: Sequence[SiteEvaluation], split: str, *, full: bool = True
    ) -> dict[str, float]:
        summaries = [e.splits[split] for e in evaluations if split in e.splits]
        return pooled_scores(summaries, multi_label=self.evaluation.multi_label, full=full)

    def _evaluate_at_sites(
        self, state: ServerState, round_number: int, next_round: NextRound | None = None
    ) -> list[SiteEvaluation]:
        """Every site's summaries of its test and validation splits (and, when per-site
        evaluation is due, its row) for the state's global model."""
        request = ScoreRequest(
            splits=("test", "val"), full=self._full(round_number),
            rows=self._sites_due(round_number), data_loss=self._losses_ahead(next_round),
        )  # fmt: skip
        return self._site_scorer().score(state.global_vector, self._ids(), request, next_round)

    def _next_round(self, state: ServerState) -> NextRound | None:
        """The round after the state's, when one is due: the clients it samples, who train
        on the state's model (remote sites then score it and train in one exchange)."""
        following = state.round + 1
        if following > self.config.rounds or state.halted or self.budget_spent(state):
            return None
        ids = tuple(self.clients[p].client_id for p in self.sample_clients(following))
        return NextRound(following, ids)

    def _full(self, round_number: int) -> bool:
        return self.config.round_scores == "full" or round_number == self.config.rounds

    def site_scores(self, model: nn.Module) -> list[dict[str, float]]:
        """``model``'s scores on every site's local test split, one row per site."""
        splits = {
            c.client_id: split for c, split in zip(self.clients, self.evaluation.sites, strict=True)
        }
        return site_scores(
            model,
            splits,
            multi_label=self.evaluation.multi_label,
            batch_size=self.config.eval_batch_size,
        )

    def _site_rows(
        self, state: ServerState, evaluations: Sequence[SiteEvaluation] | None = None,
        next_round: NextRound | None = None,
    ) -> list[dict[str, float]]:  # fmt: skip
        """Every site's scores of the state's global model: on the local test splits held
        here, or as the sites scored it on their own (those that answered, from
        ``evaluations`` when the round's already came)."""
        scorer = self.evaluation.site_scorer
        if scorer is None and evaluations is None:
            return self.site_scores(self.global_model(state))
        if evaluations is None:
            request = ScoreRequest(data_loss=self._losses_ahead(next_round))
            evaluations = scorer.score(state.global_vector, self._ids(), request, next_round)
        return [{"site": e.site, **e.row, "n": int(e.row["n"])} for e in evaluations if e.row]

    def budget_spent(self, state: ServerState) -> str | None:
        """Why no further round may run (the next would take ε past
        ``privacy.target_epsilon``), in one line; None while the budget admits it."""
        privacy, done = self.defence.privacy, state.round
        if privacy is None or privacy.admits(done + 1):
            return None
        return (
            f"privacy budget: round {done + 1} would take ε to {privacy.epsilon(done + 1):.3f}, "
            f"past privacy.target_epsilon = {privacy.target_epsilon:g} (δ = {privacy.delta:g}); "
            f"the run ends with round {done}'s model (ε = {privacy.epsilon(done):.3f})"
        )

    def _sites_due(self, round_number: int) -> bool:
        every = self.config.site_every
        scored = bool(self.evaluation.sites) or self.evaluation.site_scorer is not None
        return scored and (round_number % every == 0 or round_number == self.config.rounds)

    def backdoor_asr(self, state: ServerState, *, selected: bool = False) -> float | None:
        """The backdoor's attack success rate on the triggered test images for the state's
        global (``selected``: final) model; ``None`` without a backdoor."""
        if self.threat.backdoor_test is None:
            return None
        model = self.selected_model(state) if selected else self.global_model(state)
        return attack_success_rate(model, *self.threat.backdoor_test)

    def data_losses(
        self, vector: Tensor, positions: Sequence[int], loss: str,
        then_train: NextRound | None = None,
    ) -> dict[int, float]:  # fmt: skip
        """The model ``vector``'s ``loss`` on the training data of the clients at
        ``positions``, by client id (EMA's Algorithm 3): computed here for clients held here
        (as the server sees their data, poisoned labels included), or by the sites on their
        own data, one number each (those that answered; ``then_train``: the round whose
        clients train on ``vector``, which remote sites do in the same exchange)."""
        clients = [self.clients[p] for p in positions]
        if all(c.client_id in self._held_here for c in clients):
            model = self._load(vector)
            datasets = [(c.images, c.targets) for c in clients]  # type: ignore[union-attr]
            values = client_losses(model, datasets, loss=loss, device=self.device)  # type: ignore[arg-type]
            return dict(zip([c.client_id for c in clients], values.tolist(), strict=True))
        request = ScoreRequest(rows=False, data_loss=loss)
        ids = [c.client_id for c in clients]
        answers = self._site_scorer().score(vector, ids, request, then_train)
        return {e.site: e.data_loss for e in answers if e.data_loss is not None}

    def trained_model_noniid(
        self, model: nn.Module, loss: str, threshold: float
    ) -> NonIIDResult | None:
        """EMA's Algorithms 3-4 as the paper runs them: the trained ``model``'s ``loss`` on
        every client's local data (at the sites, by the sites) and the CV verdict against
        ``threshold``; ``client_ids`` are the clients the losses are of. None when fewer
        than two sites answered (a CV of one loss says nothing)."""
        losses = self.data_losses(model_to_vector(model), range(len(self.clients)), loss)
        if len(losses) < 2:
            return None
        result = noniid_verdict(np.array(list(losses.values())), threshold=threshold)
        return replace(result, client_ids=tuple(losses))

    def _screened(self, round_number: int) -> bool:
        """Whether the round's clients are screened by the non-IID check (due by ``every``,
        or every round when it excludes)."""
        check = self.defence.noniid
        if check is None:
            return False
        return check.exclude or (check.every > 0 and round_number % check.every == 0)

    def _trains_with_scoring(self) -> bool:
        """Whether remote sites may train in the exchange that scores the model they train
        on: not when the non-IID check excludes, which must screen a site before it trains
        (an excluded site's work would be wasted and, under local DP, its update would
        count towards its ε)."""
        return self.defence.noniid is None or not self.defence.noniid.exclude

    def _losses_ahead(self, next_round: NextRound | None) -> str:
        """The non-IID check's loss when the next round screens clients at remote sites:
        asked with this round's scoring, so the screen needs no exchange of its own
        (``""``: not needed)."""
        check = self.defence.noniid
        if check is None or next_round is None or len(self._held_here) == len(self.clients):
            return ""
        return check.loss if self._screened(next_round.round) else ""

    def _noniid_screen(self, state: ServerState, round_number: int, positions: list[int]) -> Screen:
        """EMA's Algorithms 3-4 on the round's clients at the current global model: their
        losses, the CV verdict, and (``exclude``) the ids whose loss z-score is too high."""
        check = self.defence.noniid
        if check is None or not self._screened(round_number) or len(positions) < 2:
            return Screen()
        ids = [self.clients[p].client_id for p in positions]
        then_train = NextRound(round_number, tuple(ids)) if self._trains_with_scoring() else None
        by_id = self.data_losses(state.global_vector, positions, check.loss, then_train)
        ids = [i for i in ids if i in by_id]  # a site that did not answer is not screened
        if len(ids) < 2:
            return Screen()
        losses = np.array([by_id[i] for i in ids])
        verdict = noniid_verdict(losses, threshold=check.threshold)
        excluded: set[int] = set()
        if check.exclude:
            keep = noniid_exclusions(losses, check.z)
            excluded = {i for i, kept in zip(ids, keep.tolist(), strict=True) if not kept}
        metrics = {"noniid_cv": verdict.cv, "noniid_non_iid": float(verdict.verdict == "non_iid")}
        return Screen(dict(zip(ids, losses.tolist(), strict=True)), excluded, metrics)

    def _oracle(self, state: ServerState) -> Callable[[Tensor], Tensor]:
        """Loss on the server's batch after applying each candidate update (Zeno)."""
        if self.defence.server_batch is None:
            raise ValueError(
                f"aggregator {type(self.defence.rule).__name__} needs a server batch (server_batch=)"
            )
        images, targets = self.defence.server_batch

        @torch.no_grad()
        def oracle(candidates: Tensor) -> Tensor:
            losses = []
            for row in candidates:
                vector_to_model_(self.model, state.global_vector + row.to(state.global_vector))
                self.model.eval()
                losses.append(self.loss_fn(self.model(images), targets))
            return torch.stack(losses)

        return oracle

    def _shuffle_seed(self, round_number: int, client_id: int) -> int:
        return derive_seed(self.config.seed, round_number, client_id, SHUFFLE)

    def run_round(
        self, state: ServerState, on_client: Callable[[int], None] | None = None
    ) -> tuple[ServerState, RoundReport]:
        """One round: sample, screen, train, attack, filter, aggregate, score.
        ``on_client(client_id)`` is called as each sampled client is done (trained,
        screened out or failed), e.g. to advance a progress bar."""
        round_number = state.round + 1
        sampled = self.sample_clients(round_number)
        screen = self._noniid_screen(state, round_number, sampled)
        rows, updates = self._train_clients(state, round_number, sampled, screen, on_client)
        outcome = self._aggregate(state, round_number, updates, rows)
        self._site_epsilons(state, rows)
        halted = self._exclusion_bound_exceeded(round_number, rows)
        if halted is not None:  # fail closed: no aggregate from what was left
            outcome.global_vector = state.global_vector
        new_state = self._next_state(state, round_number, outcome)
        new_state.halted = halted
        evaluations = None
        next_round = self._next_round(new_state) if self._trains_with_scoring() else None
        if self.evaluation.where == "sites":
            evaluations = self._evaluate_at_sites(new_state, round_number, next_round)
        metrics = self._round_metrics(
            new_state, round_number, rows, updates, screen, outcome, evaluations
        )
        sites = []
        if self._sites_due(round_number):
            scored = self._site_rows(new_state, evaluations, next_round)
            sites = [{"round": round_number, **row} for row in scored]
            if sites:  # remote sites that all failed to answer leave none
                metrics |= site_summary(sites, self.config.target_acc)
            new_state.sites.extend(sites)
        if self.defence.privacy is not None:  # spent after this round (a skipped round spends too)
            metrics["privacy_epsilon"] = self.defence.privacy.epsilon(round_number)
        new_state.history.append(metrics)
        trail_rows = list(rows.values())
        new_state.trail.extend(trail_rows)
        report = RoundReport(round=round_number, metrics=metrics, clients=trail_rows, sites=sites)
        return new_state, report

    def _exclusion_bound_exceeded(
        self, round_number: int, rows: dict[int, dict[str, Any]]
    ) -> str | None:
        """Why the round must not be aggregated, if more of its clients were left out
        than ``max_excluded`` allows (a client whose training failed is not counted)."""
        bound = self.config.max_excluded
        if bound is None:
            return None
        excluded = left_out(list(rows.values()))
        allowed = bound if isinstance(bound, int) else math.floor(bound * len(rows))
        if excluded <= allowed:
            return None
        return (
            f"round {round_number}: {excluded} of {len(rows)} clients left out, more than "
            f"train.max_excluded = {bound!r} allows ({allowed}); the round was not aggregated"
        )

    def _train_clients(
        self,
        state: ServerState,
        round_number: int,
        sampled: list[int],
        screen: Screen,
        on_client: Callable[[int], None] | None,
    ) -> tuple[dict[int, dict[str, Any]], list[ClientUpdate]]:
        """Ask the executor for the updates of every sampled client the screen kept and
        check each one: its trail row (by client id) and the updates that passed."""
        rows: dict[int, dict[str, Any]] = {}
        for position in sampled:
            client = self.clients[position]
            row = rows[client.client_id] = self._trail_row(round_number, client)
            if client.client_id in screen.losses:
                row["noniid_loss"] = screen.losses[client.client_id]
            if client.client_id in screen.excluded:
                row.update(excluded=True, reason="noniid_loss")
        to_train = [i for i in rows if i not in screen.excluded]
        done = (lambda result: on_client(result.client_id)) if on_client is not None else None
        results = self.executor.train(state.global_vector, round_number, to_train, done)
        if on_client is not None:
            for client_id in screen.excluded & rows.keys():
                on_client(client_id)
        updates = []
        for result in results:
            update = self._checked_update(result, rows[result.client_id], state.global_vector)
            if update is not None:
                updates.append(update)
        return rows, updates

    def _checked_update(
        self, result: ClientResult, row: dict[str, Any], global_vector: Tensor
    ) -> ClientUpdate | None:
        """The result's update if one came and it fits the model; otherwise ``None`` and
        the row marked with why: ``client_<outcome>`` (``client_error``, ...) or
        ``bad_update`` (a wrong shape or dtype)."""
        update = result.update
        if result.outcome != "ok" or update is None:
            row.update(excluded=True, reason=f"client_{result.outcome}", message=result.message)
            return None
        if update.delta.shape != global_vector.shape or not update.delta.is_floating_point():
            row.update(
                excluded=True, reason="bad_update",
                message=f"update of shape {tuple(update.delta.shape)} and dtype "
                f"{update.delta.dtype}; the model has {tuple(global_vector.shape)} parameters",
            )  # fmt: skip
            return None
        row["train_loss"] = update.train_loss
        if update.num_samples != row["num_samples"]:  # weighted by the registered count
            row["reported_samples"] = update.num_samples
            row["message"] = (
                f"reported {update.num_samples} training samples, {row['num_samples']} "
                "registered: weighted by the registered count"
            )
            update = replace(update, num_samples=row["num_samples"])
        return update

    def _trail_row(
        self, round_number: int, client: ClientData | RegisteredClient
    ) -> dict[str, Any]:
        site = {"site": client.name} if isinstance(client, RegisteredClient) else {}
        return {
            "round": round_number,
            "client": client.client_id,
            **site,  # a real site's name (whom the hub's operator calls)
            "num_samples": len(client),
            "malicious": client.client_id in self.threat.malicious,
            "excluded": False,
            "reason": "",
            "message": "",
        }

    def _aggregate(
        self,
        state: ServerState,
        round_number: int,
        updates: list[ClientUpdate],
        rows: dict[int, dict[str, Any]],
    ) -> Aggregation:
        """Attack, drop non-finite rows, filter, aggregate: the new global vector, the
        rule's, filters' and attack's states and the ids that reached the rule."""
        outcome = Aggregation(
            state.global_vector, state.aggregator_state, list(state.filter_states), [],
            preaggregator_states=list(state.preaggregator_states),
            attack_state=state.attack_state,
        )  # fmt: skip
        if not updates:
            return outcome
        ids = [u.client_id for u in updates]
        stacked = torch.stack([u.delta for u in updates])
        weights = torch.tensor(
            [float(u.num_samples) for u in updates], device=stacked.device, dtype=stacked.dtype
        )
        if self.defence.privacy is not None and self.defence.privacy.mode == "local":
            stacked = self._privatised_for_simulated(round_number, stacked, ids)
        stacked = self._attacked(state, round_number, stacked, weights, ids, outcome)
        _, _, keep = drop_non_finite(stacked, weights)
        keep = keep.clone()
        for client_id, finite in zip(ids, keep.tolist(), strict=True):
            if not finite:
                rows[client_id].update(excluded=True, reason="non_finite")
        outcome.filter_states = self._filter(
            outcome.filter_states, stacked, weights, ids, keep, rows
        )
        positions = keep.nonzero().flatten()
        outcome.kept_ids = [ids[p] for p in positions.tolist()]
        if len(outcome.kept_ids) < self.config.min_clients:
            return outcome
        kept, kept_weights = stacked, weights  # everyone kept: no copy of the round
        if len(positions) < len(ids):
            kept, kept_weights = stacked[positions], weights[positions]
        if (
            self.defence.privacy is not None
        ):  # DP-FedAvg: clipped (by the server, centrally), equal weights
            kept = (
                self.defence.privacy.clipped(kept)
                if self.defence.privacy.mode == "central"
                else kept
            )
            kept_weights = torch.ones_like(kept_weights)
        decided = self._decide(state, round_number, kept, kept_weights, outcome.kept_ids)
        aggregate = decided.aggregate
        outcome.aggregator_state = decided.rule_state
        outcome.preaggregator_states = decided.preaggregator_states
        if self.defence.privacy is not None:
            aggregate = self._privately_released(round_number, aggregate, kept)
        self._record_decisions(decided.columns, outcome.kept_ids, rows)
        outcome.global_vector = state.global_vector + self.config.server_lr * aggregate.to(
            state.global_vector.dtype
        )
        return outcome

    def _privatised_for_simulated(
        self, round_number: int, stacked: Tensor, ids: list[int]
    ) -> Tensor:
        """``local`` mode: the rows of the clients simulated here, clipped and noised as
        each client would (its noise from a seed of the run); a real site's row came
        privatised by the site itself and is left as it is."""
        held = [p for p, i in enumerate(ids) if i in self._held_here]
        if not held:
            return stacked
        generators = [
            torch_generator(derive_seed(self.config.seed, round_number, PRIVACY, ids[p]), stacked.device)
            for p in held
        ]  # fmt: skip
        privatised = self.defence.privacy.privatised_by_clients(stacked[held], generators)
        if len(held) == len(ids):
            return privatised
        stacked = stacked.clone()
        stacked[held] = privatised
        return stacked

    def _site_epsilons(self, state: ServerState, rows: dict[int, dict[str, Any]]) -> None:
        """``local`` mode: each client that sent an update this round gets its ε against
        the server in its trail row (``privacy_epsilon``), after every round it sent one
        in, by the accountant a real site runs on itself."""
        privacy = self.defence.privacy
        if privacy is None or privacy.mode != "local":
            return
        sent = Counter(int(row["client"]) for row in state.trail if sent_update(row))
        for client_id, row in rows.items():
            if sent_update(row):
                row["privacy_epsilon"] = privacy.site_epsilon(sent[client_id] + 1)

    def _privately_released(self, round_number: int, aggregate: Tensor, kept: Tensor) -> Tensor:
        """The aggregate the server releases under DP-FedAvg: the noisy fixed-denominator
        mean of the kept rows; a rule other than the mean (run outside the accountant,
        ``privacy.unaccounted: warn``) keeps its output, plus the noise the mean would get."""
        generator = torch_generator(
            derive_seed(self.config.seed, round_number, PRIVACY), kept.device
        )
        if isinstance(self.defence.rule, FedAvg):
            return self.defence.privacy.released(kept.sum(dim=0), generator)
        return aggregate + self.defence.privacy.released(torch.zeros_like(aggregate), generator)

    def _attacked(
        self,
        state: ServerState,
        round_number: int,
        stacked: Tensor,
        weights: Tensor,
        ids: list[int],
        outcome: Aggregation,
    ) -> Tensor:
        """The round's updates ``(n, d)`` after the model attack, if any malicious client
        is among them; the attack's new state and its diagnostics go into ``outcome``."""
        attack = self.threat.model_attack
        if attack is None or not self.threat.malicious:
            return stacked
        mask = torch.tensor([i in self.threat.malicious for i in ids], device=stacked.device)
        if not bool(mask.any()):
            return stacked
        generator = torch_generator(
            derive_seed(self.config.seed, round_number, ATTACK), stacked.device
        )
        defence = (
            self._simulated_defence(state, round_number, weights, ids)
            if attack.requires_aggregate
            else None
        )
        attacked, outcome.attack_state, diagnostics = attack.step(
            state.attack_state, stacked, mask, generator, aggregate=defence
        )
        outcome.attack_metrics = {f"attack_{k}": float(v) for k, v in diagnostics.items()}
        return attacked

    def _simulated_defence(
        self, state: ServerState, round_number: int, weights: Tensor, ids: list[int]
    ) -> Callable[[Tensor], Tensor]:
        """What the server would make of a candidate round ``(n, d)`` (rows in ``ids``'
        order): non-finite rows dropped, the filters, the rule; no state advanced. What an
        optimising attacker (Opt-ALIE, Opt-IPM) is assumed to know of the defence."""

        def defend(candidate: Tensor) -> Tensor:
            _, _, keep = drop_non_finite(candidate, weights)
            keep = keep.clone()
            run_filters(self.defence.filters, state.filter_states, candidate, weights, ids, keep)
            positions = keep.nonzero().flatten()
            if len(positions) < self.config.min_clients:  # the round would be skipped
                return torch.zeros_like(candidate[0])
            kept = [ids[p] for p in positions.tolist()]
            return self._decide(
                state, round_number, candidate[positions], weights[positions], kept
            ).aggregate

        return defend

    def _filter(
        self,
        filter_states: list[dict[str, Any]],
        stacked: Tensor,
        weights: Tensor,
        ids: list[int],
        keep: Tensor,
        rows: dict[int, dict[str, Any]],
    ) -> list[dict[str, Any]]:
        """Run the filters in order on the rows still kept (``keep`` is updated in place),
        recording each client's scores and any exclusion; the filters' new states."""
        steps, states = run_filters(
            self.defence.filters, filter_states, stacked, weights, ids, keep
        )
        for step in steps:
            decision = step.decision
            for row_index, position in enumerate(step.positions.tolist()):
                row = rows[ids[position]]
                if decision.scores is not None:
                    row["score"] = float(decision.scores[row_index])
                if decision.threshold is not None:
                    row["threshold"] = float(decision.threshold)
                for name, column in decision.columns.items():
                    row[name] = float(column[row_index])
                if not bool(decision.keep[row_index]):
                    row.update(excluded=True, reason=decision.reason, message=decision.note)
        return states

    def _decide(
        self,
        state: ServerState,
        round_number: int,
        updates: Tensor,
        weights: Tensor,
        ids: list[int],
    ) -> RuleOutcome:
        """The pre-aggregators, then the rule, on the rows that passed the filters
        (:func:`aggregation.defence.run_rule`, with the server's oracle and reference)."""
        generator = torch_generator(
            derive_seed(self.config.seed, round_number, PREAGGREGATION), updates.device
        )
        return run_rule(
            self.defence.rule, state.aggregator_state, self.defence.preaggregators,
            state.preaggregator_states, Rows(updates, weights, ids), generator=generator,
            oracle=lambda: self._oracle(state),
            reference=lambda: self._reference(state, round_number),
        )  # fmt: skip

    def _reference(self, state: ServerState, round_number: int) -> Tensor:
        """The server's own update from its root data, made as a client makes its own."""
        assert self.defence.root is not None  # checked when the federation was built
        seed = derive_seed(self.config.seed, round_number, self.defence.root.client_id, SHUFFLE)
        return train_client(
            self.model, state.global_vector, self.defence.root, self.local, self.loss_fn, seed=seed
        ).delta

    @staticmethod
    def _record_decisions(
        columns: dict[str, Tensor], kept_ids: list[int], rows: dict[int, dict[str, Any]]
    ) -> None:
        """Per-client values of the pre-aggregators and the rule into the trail; a
        selecting rule's choice (Krum, Multi-Krum, Bulyan) as ``selected``."""
        for name, values in columns.items():
            for client_id, value in zip(kept_ids, values.tolist(), strict=True):
                if name == "selected":
                    rows[client_id]["selected"] = bool(value)
                elif value == value:  # NaN: the value does not apply to this client
                    rows[client_id][name] = float(value)

    def _next_state(
        self, state: ServerState, round_number: int, outcome: Aggregation
    ) -> ServerState:
        return ServerState(
            round=round_number,
            global_vector=outcome.global_vector,
            aggregator_state=outcome.aggregator_state,
            filter_states=outcome.filter_states,
            history=list(state.history),
            trail=list(state.trail),
            best_round=state.best_round,
            best_val_auc=state.best_val_auc,
            best_vector=state.best_vector,
            attack_state=outcome.attack_state,
            preaggregator_states=outcome.preaggregator_states,
            sites=list(state.sites),
        )

    def _round_metrics(
        self,
        new_state: ServerState,
        round_number: int,
        rows: dict[int, dict[str, Any]],
        updates: list[ClientUpdate],
        screen: Screen,
        outcome: Aggregation,
        evaluations: Sequence[SiteEvaluation] | None = None,
    ) -> dict[str, float]:
        """Test (and validation) scores of the new global model (``evaluations``: pooled
        from the sites' summaries), the round's counts and detections; keeps the best
        validation round when ``select="best_val"``."""
        if evaluations is None:
            metrics = self._hub_scores(new_state, round_number)
        else:
            metrics = self._pooled_metrics(evaluations, round_number)
        val_auc = metrics.get("val_auc", math.nan)  # no site holds a validation split: NaN
        if self.config.select == "best_val" and val_auc > new_state.best_val_auc:
            new_state.best_round = round_number  # NaN AUC (one class) never counts as best
            new_state.best_val_auc = val_auc
            new_state.best_vector = new_state.global_vector.clone()
        skipped = len(outcome.kept_ids) < self.config.min_clients
        losses = [u.train_loss for u in updates]
        trail_rows = list(rows.values())
        return metrics | {
            "round": float(round_number),
            "clients_sampled": float(len(rows)),
            "clients_kept": float(0 if skipped else len(outcome.kept_ids)),
            "clients_excluded": float(sum(r["excluded"] for r in trail_rows)),
            "round_skipped": float(skipped),
            "client_loss_mean": float(np.mean(losses)) if losses else math.nan,
            **screen.metrics,
            **outcome.attack_metrics,
            **detection_counts(trail_rows),
        }

    def _hub_scores(self, new_state: ServerState, round_number: int) -> dict[str, float]:
        """The new global model on the server's test (and validation) split, and the
        backdoor's success rate."""
        model = self.global_model(new_state)  # loaded once for both splits
        full = self._full(round_number)
        splits = {"test": self.evaluation.test, "val": self.evaluation.val}
        metrics = {
            f"{name}_{k}": v
            for name, split in splits.items()
            if split is not None
            for k, v in self._scores(model, split, full=full).items()
        }
        if self.threat.backdoor_test is not None:
            triggered, target = self.threat.backdoor_test
            metrics["backdoor_asr"] = attack_success_rate(model, triggered, target)
        return metrics

    def _pooled_metrics(
        self, evaluations: Sequence[SiteEvaluation], round_number: int
    ) -> dict[str, float]:
        """The sites' pooled test scores (NaN when none answered) and validation scores
        (left out when no site holds a validation split), under the hub's names, and how
        many sites' test splits the pooled scores cover (``sites_scored``: a site that did
        not answer is not in them)."""
        full = self._full(round_number)
        metrics = {f"test_{k}": v for k, v in self._pooled(evaluations, "test", full=full).items()}
        metrics["sites_scored"] = float(
            sum(1 for e in evaluations if e.splits.get("test") is not None and e.splits["test"].n)
        )
        if any(e.splits.get("val") is not None and e.splits["val"].n for e in evaluations):
            val = self._pooled(evaluations, "val", full=full)
            metrics |= {f"val_{k}": v for k, v in val.items()}
        return metrics


def failed_to_answer(row: dict[str, Any]) -> bool:
    """A trail row of a client that sent no update (``client_error``, ``client_timeout``,
    ``client_unavailable``): a failure, not a detection."""
    return str(row["reason"]).startswith("client_")


def sent_update(row: dict[str, Any]) -> bool:
    """A trail row of a client whose update reached the server (kept or not)."""
    return not failed_to_answer(row) and row["reason"] != "noniid_loss"


def is_left_out(row: dict[str, Any]) -> bool:
    """Excluded by a check, screen or filter, or not chosen by a selecting rule."""
    return bool(row["excluded"] or row.get("selected") is False)


def left_out(rows: Sequence[dict[str, Any]]) -> int:
    """How many of a round's clients the defence left out (failures to answer aside)."""
    return sum(is_left_out(r) for r in rows if not failed_to_answer(r))


def _check_evaluation(
    config: FederationConfig, evaluation: EvaluationSets, defence: Defence, threat: ThreatModel
) -> None:
    """What the evaluation sets cannot serve: a best-validation choice without a
    validation split; scoring at the sites with a rule, screen or attack metric that needs
    data at the server."""
    if evaluation.where == "hub":
        if config.select == "best_val" and evaluation.val is None:
            raise ValueError("select='best_val' needs a validation split (val=)")
        return
    if config.select == "best_val" and not evaluation.site_vals and evaluation.site_scorer is None:
        raise ValueError("select='best_val' needs the sites' validation splits (site_vals=)")
    needs = {
        "the non-IID check": defence.noniid is not None,
        "a server batch (Zeno)": defence.server_batch is not None or defence.rule.requires_oracle,
        "root data (FLTrust)": defence.root is not None,
        "a backdoor's triggered test images": threat.backdoor_test is not None,
    }
    held = [name for name, needed in needs.items() if needed]
    if held:
        raise ValueError(f"where='sites': the server holds no data, but {held[0]} needs it")


def _check_privacy(privacy: ClientPrivacy | None, population: int, per_round: int) -> None:
    if privacy is not None and (privacy.population != population or privacy.per_round != per_round):
        raise ValueError(
            f"privacy: accounted for {privacy.per_round} of {privacy.population} clients "
            f"a round, but the federation samples {per_round} of {population}"
        )


def detection_counts(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Exclusions against the ground truth: a false positive is an honest client left out,
    a false negative a malicious client kept. Left out means excluded by a screen or filter,
    or not chosen by a selecting rule (Krum, Multi-Krum, Bulyan record ``selected``): such
    a rule's choice is its detection. Client errors are not detections."""
    judged = [r for r in rows if not failed_to_answer(r)]
    left_out = [is_left_out(r) for r in judged]
    malicious = [bool(r["malicious"]) for r in judged]
    tp = sum(out and bad for out, bad in zip(left_out, malicious, strict=True))
    fp = sum(out and not bad for out, bad in zip(left_out, malicious, strict=True))
    fn = sum(not out and bad for out, bad in zip(left_out, malicious, strict=True))
    counts = {
        "true_positives": float(tp),
        "false_positives": float(fp),
        "false_negatives": float(fn),
    }
    if tp + fp:  # undefined (left out) when nobody was excluded
        counts["precision"] = tp / (tp + fp)
    if tp + fn:  # undefined when nobody is malicious
        counts["recall"] = tp / (tp + fn)
    return counts
