"""Local SNN training and the FedStNN federation (the paper's Algorithms 3 and 4).

Local training: each step draws K noise samples from the client's generator, scores the
K outputs against the targets with a proper scoring rule
(:mod:`federated.fedstnn.losses`) and takes an optimiser step with either autograd's
pathwise gradient or the paper's sample-wise SMP gradient (:mod:`federated.fedstnn.smp`);
both give the same numbers, autograd is faster on CPU and is the default.

Federation (FedAvg with common initialisation, the paper's Sec. 2 and 4): each round a
fraction ``C`` of the clients, ``m = max(round(C n), 1)``, is sampled without
replacement; each trains a copy of the global model on its own data; the server then
aggregates *the drift network and the diffusion network separately* ("the server will
aggregate the drift and the diffusion network separately", Eq. 39) with the clients'
sample counts as weights. Each network has its own rule from the aggregation registry
(``fedavg`` by default, which is exactly Eq. 39). Rules see updates, ``local - global``
``(n_selected, n_params)``, and the global model moves by the result; for FedAvg that is
the sample-weighted average of the local models.

Which parameters belong to which network: the paper's SNN has only the two internal
networks; the lift and the read-out here are deterministic parts of the forward map, so
they travel with the drift network (``NETWORKS``). No entry is in both, none is left out.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from aggregation import AggregationRule, build_aggregator
from federated.fedstnn.losses import build_loss
from federated.fedstnn.smp import smp_gradients
from federated.vectors import model_to_vector, vector_to_model_
from models.snn import SNN

__all__ = [
    "NETWORKS",
    "LocalTrainConfig",
    "SNNClientData",
    "SNNFederationConfig",
    "SNNFederationResult",
    "aggregate_networks",
    "client_generator",
    "network_vector",
    "run_federation",
    "set_network_vector_",
    "train_local",
    "train_standalone",
]

# network name -> the SNN submodules whose parameters it aggregates (in this order)
NETWORKS: dict[str, tuple[str, ...]] = {
    "drift": ("lift", "drift", "readout"),
    "diffusion": ("diffusion",),
}


@dataclass(frozen=True, kw_only=True)
class LocalTrainConfig:
    """One client's local training per round."""

    epochs: int = 20  # passes over the client's data per round
    batch_size: int | None = None  # None: full batch (clients hold ~100 points)
    lr: float = 1e-2  # step size
    optimizer: Literal["adam", "sgd"] = "adam"  # a fresh optimiser each round
    diffusion_lr_scale: float = 1.0  # the diffusion network's lr is lr * this
    momentum: float = 0.9  # SGD only
    n_paths: int | None = None  # K paths per step; None: the model config's
    loss: str = "energy_score"  # a registered loss (federated.fedstnn.losses)
    gradient: Literal["autograd", "smp"] = "autograd"  # same numbers; autograd is faster

    def __post_init__(self) -> None:
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {self.epochs}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        loss = build_loss(self.loss)  # fails here, listing the losses, on an unknown name
        if self.n_paths is not None and self.n_paths < getattr(loss, "min_paths", 2):
            raise ValueError(
                f"n_paths must be >= 2 for the loss {self.loss!r} (a scoring rule needs "
                f"spread), got {self.n_paths}; squared_error takes one path"
            )
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if not self.diffusion_lr_scale > 0:
            raise ValueError(f"diffusion_lr_scale must be > 0, got {self.diffusion_lr_scale}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.gradient not in ("autograd", "smp"):
            raise ValueError(f"gradient must be 'autograd' or 'smp', got {self.gradient!r}")


@dataclass(frozen=True, kw_only=True)
class SNNFederationConfig:
    """Rounds, client sampling and the per-network aggregation rules."""

    rounds: int = 10  # communication rounds
    fraction: float = 0.1  # C: share of clients sampled per round
    lr_decay: float = 1.0  # local lr in round r is local.lr * lr_decay**r
    drift_rule: str = "fedavg"  # aggregation rule for the drift network (+ lift, read-out)
    drift_rule_params: Mapping[str, Any] = field(default_factory=dict)
    diffusion_rule: str = "fedavg"  # aggregation rule for the diffusion network
    diffusion_rule_params: Mapping[str, Any] = field(default_factory=dict)
    local: LocalTrainConfig = field(default_factory=LocalTrainConfig)

    def __post_init__(self) -> None:
        if self.rounds < 0:
            raise ValueError(f"rounds must be >= 0, got {self.rounds}")
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")
        if not 0 < self.lr_decay <= 1:
            raise ValueError(f"lr_decay must be in (0, 1], got {self.lr_decay}")

    def rules(self) -> dict[str, AggregationRule]:
        return {
            "drift": build_aggregator(self.drift_rule, **self.drift_rule_params),
            "diffusion": build_aggregator(self.diffusion_rule, **self.diffusion_rule_params),
        }


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


def set_network_vector_(model: nn.Module, network: str, vector: Tensor) -> None:
    """Write ``vector`` into one network's parameters (inverse of :func:`network_vector`)."""
    offset = 0
    for name in NETWORKS[network]:
        module = getattr(model, name)
        size = model_to_vector(module).numel()
        vector_to_model_(module, vector[offset : offset + size])
        offset += size
    if offset != vector.numel():
        raise ValueError(f"vector has {vector.numel()} entries, network {network!r} has {offset}")


def aggregate_networks(
    global_model: SNN,
    local_models: Sequence[SNN],
    weights: Tensor,
    rules: Mapping[str, AggregationRule],
    states: Mapping[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Move ``global_model`` in place by each network's rule applied to that network's
    updates only (the paper's Eq. 39 for FedAvg); returns ``(new rule states,
    diagnostics)`` keyed by network. ``weights (n,)`` are the clients' sample counts."""
    states = states or {name: rule.init_state() for name, rule in rules.items()}
    new_states: dict[str, dict[str, Any]] = {}
    diagnostics: dict[str, dict[str, Any]] = {}
    for network, rule in rules.items():
        base = network_vector(global_model, network)  # (d,)
        updates = torch.stack([network_vector(m, network) - base for m in local_models])  # (n, d)
        step, new_states[network], diagnostics[network] = rule.step(
            states[network], updates, weights.to(updates)
        )
        set_network_vector_(global_model, network, base + step)
    return new_states, diagnostics


def run_federation(
    model: SNN,
    clients: Sequence[SNNClientData],
    config: SNNFederationConfig,
    *,
    seed: int,
    on_round: Callable[[int, SNN], Mapping[str, float]] | None = None,
) -> SNNFederationResult:
    """Run FedStNN from the common initial ``model`` (modified in place and returned).

    ``on_round(round, global_model)`` may return metrics to record in that round's
    history entry (e.g. the global model's test error, for per-round tracking).
    """
    if not clients:
        raise ValueError("no clients")
    device = next(model.parameters()).device
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC11E]))
    rules = config.rules()
    states = {name: rule.init_state() for name, rule in rules.items()}
    m = max(round(config.fraction * len(clients)), 1)
    history: list[dict[str, Any]] = []
    for r in range(config.rounds):
        local_config = dataclasses.replace(config.local, lr=config.local.lr * config.lr_decay**r)
        selected = sorted(int(c) for c in rng.choice(len(clients), size=m, replace=False))
        local_models: list[SNN] = []
        losses: list[float] = []
        for c in selected:
            local = copy.deepcopy(model)
            stats = train_local(
                local,
                clients[c],
                local_config,
                generator=client_generator(seed, r, c, device=device),
            )
            local_models.append(local)
            losses.append(stats["loss"])
        weights = torch.tensor([float(len(clients[c])) for c in selected], device=device)
        states, diagnostics = aggregate_networks(model, local_models, weights, rules, states)
        entry: dict[str, Any] = {
            "round": r,
            "clients": selected,
            "local_loss": float(np.mean(losses)),
            "diagnostics": {
                net: {k: v.tolist() if isinstance(v, Tensor) else v for k, v in diag.items()}
                for net, diag in diagnostics.items()
            },
        }
        if on_round is not None:
            entry.update(on_round(r, model))
        history.append(entry)
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
