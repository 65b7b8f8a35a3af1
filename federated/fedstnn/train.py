"""Local SNN training and the FedStNN federation (the paper's Algorithms 3 and 4).

Local training: each step draws K noise samples from the client's generator, scores the
K outputs against the targets with a proper scoring rule
(:mod:`federated.fedstnn.losses`) and takes an optimiser step with either autograd's
pathwise gradient or the paper's sample-wise SMP gradient (:mod:`federated.fedstnn.smp`);
both give the same numbers, autograd is faster on CPU and is the default.

Federation (FedAvg with common initialisation, the paper's Sec. 2 and 4), run by the
engine's round loop (:func:`federated.loop.train` over a
:class:`~federated.server.Federation`) like every other federation: each round a fraction
``C`` of the clients, ``m = max(ceil(C n), 1)`` (the engine's one definition; the
presets' ``C n`` are whole numbers), is sampled without replacement from one generator
over the run (``sampling="stream"``); each trains a copy of the global model on its own
data (:class:`SNNExecutor`); the server then aggregates *the drift network and the
diffusion network separately* ("the server will aggregate the drift and the diffusion
network separately", Eq. 39) with the clients' sample counts as weights
(:class:`NetworkRules`). Each network has its own rule from the aggregation registry
(``fedavg`` by default, which is exactly Eq. 39). Rules see updates, ``local - global``
``(n_selected, n_params)``, and the global model moves by the result; for FedAvg that is
the sample-weighted average of the local models. The round's exclusion trail, counts and
the caller's per-round scores (``EvaluationSets.model_scores``) are the engine's.

Which parameters belong to which network: the paper's SNN has only the two internal
networks; the lift and the read-out here are deterministic parts of the forward map, so
they travel with the drift network (``NETWORKS``). No entry is in both, none is left out.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from aggregation import AggregationRule, build_aggregator
from aggregation.base import RoundInputs
from federated.client import ClientUpdate, RegisteredClient
from federated.execution import ClientResult, ResultOf, RoundExecutor
from federated.fedstnn.losses import build_loss
from federated.fedstnn.smp import smp_gradients
from federated.loop import train
from federated.parts import (
    Defence,
    EvaluationSets,
    Execution,
    FederationConfig,
    RoundReport,
    ServerState,
)
from federated.server import Federation
from federated.vectors import model_to_vector, vector_to_model_
from models.snn import SNN
from registry.constraints import POSITIVE, Interval, Options, allowed, check_fields

__all__ = [
    "NETWORKS",
    "LocalTrainConfig",
    "NetworkRules",
    "SNNClientData",
    "SNNExecutor",
    "SNNFederationConfig",
    "SNNFederationResult",
    "client_generator",
    "network_columns",
    "network_vector",
    "run_federation",
    "train_local",
    "train_standalone",
]

Optimizer = Literal["adam", "sgd"]
Gradient = Literal["autograd", "smp"]

# network name -> the SNN submodules whose parameters it aggregates (in this order)
NETWORKS: dict[str, tuple[str, ...]] = {
    "drift": ("lift", "drift", "readout"),
    "diffusion": ("diffusion",),
}


@dataclass(frozen=True, kw_only=True)
class LocalTrainConfig:
    """One client's local training per round."""

    # passes over the client's data per round
    epochs: int = field(default=20, metadata=allowed(Interval(int, 0)))
    # None: full batch (clients hold ~100 points)
    batch_size: int | None = field(default=None, metadata=allowed(Interval(int, 1), None))
    lr: float = field(default=1e-2, metadata=allowed(POSITIVE))
    # a fresh optimiser each round
    optimizer: Optimizer = field(default="adam", metadata=allowed(Options.of(Optimizer)))
    # the diffusion network's lr is lr * this
    diffusion_lr_scale: float = field(default=1.0, metadata=allowed(POSITIVE))
    # SGD only
    momentum: float = field(default=0.9, metadata=allowed(Interval(float, 0, 1, closed="left")))
    n_paths: int | None = None  # K paths per step; None: the model config's
    loss: str = "energy_score"  # a registered loss (federated.fedstnn.losses)
    # same numbers; autograd is faster
    gradient: Gradient = field(default="autograd", metadata=allowed(Options.of(Gradient)))

    def __post_init__(self) -> None:
        check_fields(self)
        loss = build_loss(self.loss)  # fails here, listing the losses, on an unknown name
        if self.n_paths is not None and self.n_paths < getattr(loss, "min_paths", 2):
            raise ValueError(
                f"n_paths must be >= 2 for the loss {self.loss!r} (a scoring rule needs "
                f"spread), got {self.n_paths}; squared_error takes one path"
            )


@dataclass(frozen=True, kw_only=True)
class SNNFederationConfig:
    """Rounds, client sampling and the per-network aggregation rules."""

    rounds: int = field(default=10, metadata=allowed(Interval(int, 1)))  # communication rounds
    # C: share of clients sampled per round
    fraction: float = field(default=0.1, metadata=allowed(Interval(float, 0, 1, closed="right")))
    # local lr in round r is local.lr * lr_decay**r
    lr_decay: float = field(default=1.0, metadata=allowed(Interval(float, 0, 1, closed="right")))
    drift_rule: str = "fedavg"  # aggregation rule for the drift network (+ lift, read-out)
    drift_rule_params: Mapping[str, Any] = field(default_factory=dict)
    diffusion_rule: str = "fedavg"  # aggregation rule for the diffusion network
    diffusion_rule_params: Mapping[str, Any] = field(default_factory=dict)
    local: LocalTrainConfig = field(default_factory=LocalTrainConfig)

    def __post_init__(self) -> None:
        check_fields(self)
        self.rules  # noqa: B018  (an unknown rule or a bad parameter fails here, naming the choices)

    @cached_property
    def rules(self) -> Mapping[str, AggregationRule]:
        """Each network's rule, built once (a rule keeps no state of its own)."""
        return MappingProxyType(
            {
                "drift": build_aggregator(self.drift_rule, **self.drift_rule_params),
                "diffusion": build_aggregator(self.diffusion_rule, **self.diffusion_rule_params),
            }
        )


@dataclass(frozen=True)
class SNNClientData:
    """One client's local dataset: inputs ``x (n, in)``, targets ``y (n, out)``."""

    x: Tensor
    y: Tensor
    group: int = 0  # client group (non-IID settings), for reporting only

    def __len__(self) -> int:
        return self.x.shape[0]


@dataclass
class SNNFederationResult:
    """The trained global model and one plain-dict record per round."""

    model: SNN
    history: list[dict[str, Any]]


def client_generator(seed: int, *keys: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator seeded from ``(seed, *keys)`` (e.g. round and client id), so each
    client's noise is reproducible and independent of the others'."""
    state = np.random.SeedSequence([seed, *keys]).generate_state(2, dtype=np.uint32)
    generator = torch.Generator(device=device)
    generator.manual_seed(int(state[0]) << 32 | int(state[1]))
    return generator


def train_local(
    model: SNN, data: SNNClientData, config: LocalTrainConfig, *, generator: torch.Generator
) -> dict[str, float]:
    """Train ``model`` in place on one client's data; returns the mean loss of the last
    epoch and the number of steps."""
    loss_fn = build_loss(config.loss)
    groups = [
        {"params": [p for n, p in model.named_parameters() if not n.startswith("diffusion.")]},
        {"params": list(model.diffusion.parameters()), "lr": config.lr * config.diffusion_lr_scale},
    ]
    if config.optimizer == "sgd":
        optimiser: torch.optim.Optimizer = torch.optim.SGD(
            groups, lr=config.lr, momentum=config.momentum
        )
    else:
        optimiser = torch.optim.Adam(groups, lr=config.lr)
    n = len(data)
    batch = config.batch_size or n
    model.train()
    last = float("nan")
    steps = 0
    for _ in range(config.epochs):
        order = torch.randperm(n, generator=generator, device=generator.device)
        total = 0.0
        for start in range(0, n, batch):
            idx = order[start : start + batch].to(data.x.device)
            x, y = data.x[idx], data.y[idx]
            noise = model.sample_noise(x.shape[0], config.n_paths, generator=generator)
            optimiser.zero_grad(set_to_none=True)
            if config.gradient == "smp":
                loss, grads = smp_gradients(model, x, y, loss_fn, noise)
                for name, p in model.named_parameters():
                    p.grad = grads[name]
            else:
                loss = loss_fn(model(x, noise=noise), y)
                loss.backward()
            optimiser.step()
            total += float(loss.detach()) * x.shape[0]
            steps += 1
        last = total / n
    return {"loss": last, "steps": float(steps)}


def network_vector(model: nn.Module, network: str) -> Tensor:
    """The flat parameters of one network (``NETWORKS[network]``) of ``model``."""
    return torch.cat([model_to_vector(getattr(model, name)) for name in NETWORKS[network]])


def network_columns(model: nn.Module) -> dict[str, Tensor]:
    """Each network's entries of the model vector (:func:`model_to_vector`'s order), in
    the order :func:`network_vector` lays them out."""
    spans: dict[str, tuple[int, int]] = {}
    start = 0
    for key, value in model.state_dict().items():
        if value.is_floating_point():
            spans[key] = (start, start + value.numel())
            start += value.numel()
    return {
        network: torch.cat(
            [torch.arange(*spans[k]) for name in modules for k in spans if k.split(".")[0] == name]
        )
        for network, modules in NETWORKS.items()
    }


@dataclass(frozen=True, eq=False)
class NetworkRules(AggregationRule):
    """FedStNN's aggregation (the paper's Eq. 39): each network's rule on that network's
    entries of the updates alone (``columns[network]``, from :func:`network_columns`).

    Diagnostics: a client's ``effective_weight`` is its networks' weights averaged by
    their sizes (each network's own is the column ``<network>_effective_weight``); under a
    selecting rule a client is ``selected`` when any network's rule chose it."""

    columns: Mapping[str, Tensor]
    rules: Mapping[str, AggregationRule]

    def __post_init__(self) -> None:
        for network, rule in self.rules.items():
            if rule.requires_oracle or rule.requires_reference or rule.requires_client_ids:
                raise ValueError(
                    f"the {network} network's rule {type(rule).__name__} needs server data "
                    "or client ids, which FedStNN's per-network aggregation does not pass"
                )

    def init_state(self) -> dict[str, Any]:
        return {network: rule.init_state() for network, rule in self.rules.items()}

    def advance(
        self, state: dict[str, Any], updates: Tensor, weights: Tensor | None, inputs: RoundInputs
    ) -> tuple[Tensor, dict[str, Any], dict[str, Any]]:
        result = torch.empty_like(updates[0])
        new_state: dict[str, Any] = {}
        parts: dict[str, dict[str, Any]] = {}
        for network, rule in self.rules.items():
            columns = self.columns[network].to(updates.device)
            result[columns], new_state[network], parts[network] = rule.step(
                state[network], updates[:, columns], weights
            )
        return result, new_state, self._diagnostics(parts, updates.shape[0])

    def _diagnostics(self, parts: Mapping[str, Mapping[str, Any]], n: int) -> dict[str, Any]:
        sizes = {network: float(self.columns[network].numel()) for network in parts}
        weights = {network: torch.as_tensor(d["effective_weight"]) for network, d in parts.items()}
        combined = sum(sizes[k] * w.to(torch.float64) for k, w in weights.items())
        diagnostics: dict[str, Any] = {
            "effective_weight": combined / sum(sizes.values()),
            "columns": {f"{k}_effective_weight": w for k, w in weights.items()},
            "networks": {
                k: {key: v for key, v in d.items() if key != "columns"} for k, d in parts.items()
            },
        }
        if any("selected" in d for d in parts.values()):
            chosen = [torch.as_tensor(d.get("selected", range(n))) for d in parts.values()]
            diagnostics["selected"] = torch.unique(torch.cat(chosen).long().cpu())
        return diagnostics


@dataclass(frozen=True, kw_only=True, eq=False)
class SNNExecutor(RoundExecutor):
    """FedStNN's clients (the paper's Algorithm 3): each trains a copy of the global SNN
    on its own data with round r's learning rate (``local.lr * lr_decay**(r - 1)``) and
    noise from its own generator (:func:`client_generator`), and returns its update."""

    model: SNN  # the executor's own workspace (the federation keeps another)
    clients: Sequence[SNNClientData]
    config: SNNFederationConfig
    seed: int

    def round_results(
        self, global_vector: Tensor, round_number: int, client_ids: Sequence[int]
    ) -> ResultOf:
        decay = self.config.lr_decay ** (round_number - 1)
        local = dataclasses.replace(self.config.local, lr=self.config.local.lr * decay)
        return lambda client_id: self._train_one(global_vector, round_number, client_id, local)

    def _train_one(
        self, global_vector: Tensor, round_number: int, client_id: int, local: LocalTrainConfig
    ) -> ClientResult:
        data = self.clients[client_id]
        vector_to_model_(self.model, global_vector)
        generator = client_generator(
            self.seed, round_number - 1, client_id, device=global_vector.device
        )
        stats = train_local(self.model, data, local, generator=generator)
        delta = model_to_vector(self.model) - global_vector
        update = ClientUpdate(client_id, delta, len(data), stats["loss"])
        return ClientResult(client_id, "ok", update)


def run_federation(
    model: SNN,
    clients: Sequence[SNNClientData],
    config: SNNFederationConfig,
    *,
    seed: int,
    on_round: Callable[[int, SNN], Mapping[str, float]] | None = None,
) -> SNNFederationResult:
    """Run FedStNN from the common initial ``model`` (modified in place and returned) on
    the engine's round loop (:func:`federated.loop.train`): its clients are an
    :class:`SNNExecutor`, its rule :class:`NetworkRules`, its sampling the ``stream`` rule.

    ``on_round(round, global_model)`` (rounds from 1) may return metrics to record in that
    round's history entry (e.g. the global model's test error, for per-round tracking).
    """
    if not clients:
        raise ValueError("no clients")

    def scores(global_model: nn.Module, round_number: int) -> Mapping[str, float]:
        assert isinstance(global_model, SNN)
        return on_round(round_number, global_model) if on_round is not None else {}

    federation = Federation(
        model=model,
        clients=[RegisteredClient(client_id=i, num_samples=len(c)) for i, c in enumerate(clients)],
        local=None,
        config=FederationConfig(
            rounds=config.rounds, client_fraction=config.fraction, seed=seed, sampling="stream"
        ),
        defence=Defence(
            rule=NetworkRules(columns=network_columns(model), rules=dict(config.rules))
        ),
        evaluation=EvaluationSets(model_scores=scores),
        execution=Execution(
            executor=SNNExecutor(
                model=copy.deepcopy(model), clients=clients, config=config, seed=seed
            )
        ),
    )
    history: list[dict[str, Any]] = []

    def record(report: RoundReport, _: ServerState) -> None:
        clients_of_round = [int(row["client"]) for row in report.clients]
        history.append(
            report.metrics
            | {"clients": clients_of_round, "local_loss": report.metrics["client_loss_mean"]}
        )

    state = train(federation, federation.initial_state(), config.rounds, on_round=record)
    vector_to_model_(model, state.global_vector)
    return SNNFederationResult(model=model, history=history)


def train_standalone(
    model: SNN, data: SNNClientData, config: SNNFederationConfig, *, seed: int, client: int
) -> SNN:
    """The paper's "local model" baseline: one client training a copy of ``model`` alone,
    with the same schedule it would follow in every round (``config.rounds`` times
    ``config.local``, lr decayed per round) but never aggregated."""
    local = copy.deepcopy(model)
    device = next(local.parameters()).device
    for r in range(config.rounds):
        local_config = dataclasses.replace(config.local, lr=config.local.lr * config.lr_decay**r)
        generator = client_generator(seed, 0x10CA1, r, client, device=device)
        train_local(local, data, local_config, generator=generator)
    return local
