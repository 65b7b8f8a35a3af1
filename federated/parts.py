"""The frozen parts a :class:`~federated.server.Federation` is assembled from (its
:class:`FederationConfig`, :class:`Defence`, :class:`ThreatModel`, :class:`EvaluationSets`
and :class:`Execution`), the :class:`ServerState` its rounds pass on, and the checks of
parts that only make sense together. Each part checks its own values where it is declared,
so the engine's library callers (benchmarks, the Flower apps) get the same one-line errors
as the params layer gives its users."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from aggregation.base import AggregationRule, Filter, PreAggregator, ServerOptimizer
from aggregation.server_optimizers import ServerSGD
from federated.attacks.base import ModelAttack
from federated.client import ClientData, LocalTraining, LocalWork, RegisteredClient
from federated.execution import ClientExecutor, ControlledExecutor, SiteScorer
from federated.privacy import ClientPrivacy
from federated.seeding import clients_per_round
from registry.constraints import POSITIVE, Interval, Options, allowed, check_fields

__all__ = [
    "Backend",
    "Defence",
    "EvaluationSets",
    "Execution",
    "FederationConfig",
    "ModelScores",
    "NonIIDCheck",
    "RoundReport",
    "ServerState",
    "ThreatModel",
    "check_assembly",
    "check_local",
]

Backend = Literal["sequential", "batched", "auto"]
Select = Literal["last", "best_val"]
RoundScores = Literal["full", "accuracy"]
Sampling = Literal["per_round", "stream"]
Where = Literal["hub", "sites"]
NonIIDLoss = Literal["mse", "cross_entropy"]
ModelScores = Callable[[nn.Module, int], Mapping[str, float]]  # (global model, round) -> scores


@dataclass(frozen=True, kw_only=True)
class FederationConfig:
    rounds: int = field(metadata=allowed(Interval(int, 1)))
    # share of clients sampled per round
    client_fraction: float = field(
        default=1.0, metadata=allowed(Interval(float, 0, 1, closed="right"))
    )
    # fewer survivors than this: the round is skipped
    min_clients: int = field(default=1, metadata=allowed(Interval(int, 1)))
    seed: int = 0
    eval_batch_size: int = field(default=512, metadata=allowed(Interval(int, 1)))
    # the model a run ends with: the last round's, or the round with the best validation
    # AUC (MedMNIST's protocol; earliest on ties; needs the Federation's ``val`` split)
    select: Select = field(default="last", metadata=allowed(Options.of(Select)))
    # fail closed: the most clients a round may leave out (filters, screens, non-finite
    # updates, a selecting rule's choice): an int is a count, a float in [0, 1) a share of
    # the round's sampled clients; a round above it is not aggregated and halts the run
    max_excluded: int | float | None = field(
        default=None,
        metadata=allowed(Interval(int, 0), Interval(float, 0, 1, closed="left"), None),
    )
    # score the sites' local test splits every N rounds (and the last)
    site_every: int = field(default=1, metadata=allowed(Interval(int, 1)))
    # per-site evaluation: the share of sites reaching it
    target_acc: float = field(default=0.8, metadata=allowed(Interval(float, 0, 1)))
    # what every round scores on the test (and validation) split: loss, ACC, AUC, ECE and
    # Brier ("full"), or loss and ACC ("accuracy"; the last round is always scored fully)
    round_scores: RoundScores = field(default="full", metadata=allowed(Options.of(RoundScores)))
    # which clients a round samples: a seeded draw of its own per round ("per_round"), or
    # draws from one generator over the run ("stream": FedStNN's rule)
    sampling: Sampling = field(default="per_round", metadata=allowed(Options.of(Sampling)))
    # SCAFFOLD (Karimireddy et al. 2020, option II): the server's control variate c and
    # each client's c_i correct every local step; the clients train in this process
    scaffold: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        if self.round_scores == "accuracy" and self.select == "best_val":
            raise ValueError(
                "select='best_val' picks by validation AUC: it needs round_scores='full'"
            )


@dataclass(frozen=True, kw_only=True)
class NonIIDCheck:
    """EMA's non-IID check: client losses of the global model, CV = σ/μ vs ``threshold``."""

    # rounds between checks (0 = only when excluding)
    every: int = field(default=1, metadata=allowed(Interval(int, 0)))
    # "mse" (softmax vs one-hot, the paper's) or "cross_entropy"
    loss: NonIIDLoss = field(default="mse", metadata=allowed(Options.of(NonIIDLoss)))
    # the verdict is non_iid when CV > threshold
    threshold: float = field(default=0.25, metadata=allowed(POSITIVE))
    exclude: bool = False  # leave out clients whose loss z-score exceeds z
    z: float = field(default=2.0, metadata=allowed(POSITIVE))

    def __post_init__(self) -> None:
        check_fields(self)


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
    # the server optimizer's memory (its step count and moments): state_dict() as it was
    server_optimizer_state: dict[str, Any] = field(default_factory=dict)
    # SCAFFOLD: the server's control variate c (d,) and, in a simulation, each simulated
    # client's own c_i by client id (the clients' half, kept here because they are here)
    control: Tensor | None = None
    client_controls: dict[int, Tensor] = field(default_factory=dict)

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
            "server_optimizer_state": {
                key: value.detach().cpu() if isinstance(value, Tensor) else value
                for key, value in self.server_optimizer_state.items()
            },
            "control": None if self.control is None else self.control.detach().cpu(),
            "client_controls": {
                client: value.detach().cpu() for client, value in self.client_controls.items()
            },
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
            server_optimizer_state={
                key: value.to(device) if isinstance(value, Tensor) else value
                for key, value in data.get("server_optimizer_state", {}).items()
            },
            control=None if data.get("control") is None else data["control"].to(device),
            client_controls={
                int(client): value.to(device)
                for client, value in data.get("client_controls", {}).items()
            },
        )

    @property
    def selected_round(self) -> int:
        """The round whose weights :meth:`Federation.selected_model` returns."""
        return self.best_round if self.best_vector is not None else self.round

    @property
    def selected_vector(self) -> Tensor:
        """The weights :meth:`Federation.selected_model` holds: the best validation
        round's when one was kept (``select="best_val"``), else the last round's."""
        return self.best_vector if self.best_vector is not None else self.global_vector

    def keep_if_best(self, val_auc: float) -> None:
        """Keep this round's global weights as the selected ones when ``val_auc`` beats
        the best validation AUC so far (a NaN AUC, of one class or of no validation split,
        never does)."""
        if val_auc > self.best_val_auc:
            self.best_round = self.round
            self.best_val_auc = val_auc
            self.best_vector = self.global_vector.clone()


@dataclass(frozen=True)
class RoundReport:
    round: int  # 1-based
    metrics: dict[str, float]
    clients: list[dict[str, Any]]  # this round's exclusion-trail rows
    sites: list[dict[str, float]] = field(default_factory=list)  # this round's per-site scores


@dataclass(frozen=True, kw_only=True)
class Defence:
    """What the server does with the updates it receives, in order: the non-IID screen,
    the filters, the pre-aggregators, the rule, DP-FedAvg's clipping and noise, and the
    server optimizer that takes the released aggregate as its pseudo-gradient (``sgd``
    at lr 1, FedAvg's step, unless given). ``root``
    (FLTrust's reference update) and ``server_batch`` (Zeno's oracle) are the server's own
    data, for the rules that need them."""

    rule: AggregationRule
    filters: tuple[Filter, ...] = ()
    preaggregators: tuple[PreAggregator, ...] = ()  # in front of the rule, in this order
    noniid: NonIIDCheck | None = None
    privacy: ClientPrivacy | None = None
    root: ClientData | None = None
    server_batch: tuple[Tensor, Tensor] | None = None
    server_optimizer: ServerOptimizer = field(default_factory=ServerSGD)

    def __post_init__(self) -> None:
        if (self.rule.requires_local_norms or self.rule.requires_losses) and self.preaggregators:
            raise ValueError(
                f"aggregator {type(self.rule).__name__} weighs each client's own update by what "
                "it knows of that client: pre-aggregators, which remake the rows, cannot go "
                "before it"
            )
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
    scores them).

    ``model_scores(model, round)``: scores of the caller's own for the round's global
    model, added to the round's metrics (a model that is not a classifier, e.g.
    FedStNN's regression metrics, is scored by them alone: no ``test`` split)."""

    test: tuple[Tensor, Tensor] | None = None
    val: tuple[Tensor, Tensor] | None = None
    sites: tuple[tuple[Tensor, Tensor], ...] = ()
    site_vals: tuple[tuple[Tensor, Tensor], ...] = ()  # each site's validation split
    multi_label: bool = False
    site_scorer: SiteScorer | None = None
    where: Where = field(default="hub", metadata=allowed(Options.of(Where)))
    model_scores: ModelScores | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        if self.where == "hub" and self.test is None and self.model_scores is None:
            raise ValueError(
                "where='hub' scores the hub's test split: test= (or model_scores=) is needed"
            )
        if self.where == "sites" and (self.test is not None or self.val is not None):
            raise ValueError("where='sites' scores at the sites: no test= or val= here")
        if self.where == "sites" and self.site_scorer is None and not self.sites:
            raise ValueError("where='sites' needs the sites: site_scorer= or sites=")


@dataclass(frozen=True, kw_only=True)
class Execution:
    """How the sampled clients are trained: by one of this process's backends, or by an
    executor of its own (``executor``, e.g. clients that live elsewhere). ``local_work``
    draws each client's local epochs per round (this process's backends only)."""

    backend: Backend = field(default="sequential", metadata=allowed(Options.of(Backend)))
    # batched: clients trained at once (None: by memory)
    max_parallel: int | None = field(default=None, metadata=allowed(Interval(int, 1), None))
    executor: ClientExecutor | None = None
    local_work: LocalWork | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        if self.executor is not None and self.local_work is not None:
            raise ValueError(
                "local_work draws the epochs of the clients trained here: an executor of "
                "its own (executor=) trains its clients as they are set up"
            )


def check_assembly(
    clients: Sequence[ClientData | RegisteredClient],
    config: FederationConfig,
    defence: Defence,
    evaluation: EvaluationSets,
    threat: ThreatModel,
    execution: Execution,
) -> None:
    """What the parts cannot do together, in one line each: splits that are not one per
    client, clients that hold no data here without an executor (or a site scorer for the
    non-IID check), evaluation sets that cannot serve the defence, an accountant made for
    another sample."""
    if not clients:
        raise ValueError("a federation needs at least one client")
    one_per_client = {
        "sites: one local test split": evaluation.sites,
        "site_vals: one validation split": evaluation.site_vals,
    }
    for what, splits in one_per_client.items():
        if splits and len(splits) != len(clients):
            raise ValueError(f"{what} per client ({len(clients)}), got {len(splits)}")
    _check_evaluation(config, evaluation, defence, threat)
    validating = [type(f).__name__ for f in defence.filters if f.requires_validation]
    held_out = evaluation.site_scorer is not None or evaluation.sites or evaluation.site_vals
    if validating and not held_out:
        raise ValueError(
            f"filter {validating[0]} has the sites score candidates on their own held-out "
            "splits, but the clients hold none: give each a held-out split "
            "(partition.local_test) or sites that score (evaluation.site_scorer=)"
        )
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
    per_round = clients_per_round(config.client_fraction, len(clients))
    _check_privacy(defence.privacy, len(clients), per_round)


def _check_evaluation(
    config: FederationConfig, evaluation: EvaluationSets, defence: Defence, threat: ThreatModel
) -> None:
    """What the evaluation sets cannot serve: a best-validation choice without a
    validation split; scoring at the sites with a rule or attack metric that needs data at
    the server (the non-IID check does not: its losses are the clients' own)."""
    if evaluation.where == "hub":
        if config.select == "best_val" and evaluation.val is None:
            raise ValueError("select='best_val' needs a validation split (val=)")
        return
    if config.select == "best_val" and not evaluation.site_vals and evaluation.site_scorer is None:
        raise ValueError("select='best_val' needs the sites' validation splits (site_vals=)")
    needs = {
        "a server batch (Zeno)": defence.server_batch is not None or defence.rule.requires_oracle,
        "root data (FLTrust)": defence.root is not None,
        "a backdoor's triggered test images": threat.backdoor_test is not None,
    }
    held = [name for name, needed in needs.items() if needed]
    if held:
        raise ValueError(f"where='sites': the server holds no data, but {held[0]} needs it")


def _check_privacy(privacy: ClientPrivacy | None, population: int, per_round: int) -> None:
    """A privacy accountant made for the federation's population and sample size."""
    if privacy is not None and (privacy.population != population or privacy.per_round != per_round):
        raise ValueError(
            f"privacy: accounted for {privacy.per_round} of {privacy.population} clients "
            f"a round, but the federation samples {per_round} of {population}"
        )


def check_local(
    local: LocalTraining | None, config: FederationConfig, defence: Defence, execution: Execution
) -> None:
    """What needs the clients' local training settings (``local=``): the clients held
    here and the server's root data, FedNova's ‖a_i‖₁, SCAFFOLD's plain steps."""
    if local is None and (execution.executor is None or defence.root is not None):
        raise ValueError(
            "local= is needed: it trains the clients held here and the server's root data"
        )
    if config.scaffold:
        _check_scaffold(local, execution)
    if local is None and defence.rule.requires_local_norms:
        raise ValueError(
            f"aggregator {type(defence.rule).__name__} needs local= (the clients' local "
            "training: its steps, momentum and proximal term make each client's ‖a_i‖₁)"
        )


def _check_scaffold(local: LocalTraining | None, execution: Execution) -> None:
    """What SCAFFOLD as the paper writes it needs, in one line each: clients that keep
    their variates (here, or at sites that do), with plain local SGD steps (option II
    reads (x − y)/(K·η_l) as their mean corrected gradient)."""
    if execution.executor is not None and not isinstance(execution.executor, ControlledExecutor):
        raise ValueError(
            f"scaffold needs an executor whose clients keep their own variates "
            f"(train_with_control); {type(execution.executor).__name__} has none"
        )
    if local is not None and (local.momentum or local.prox_mu):
        raise ValueError(
            "scaffold's option II assumes plain local SGD steps: local momentum and "
            f"prox_mu must be 0 (got {local.momentum:g} and {local.prox_mu:g})"
        )
