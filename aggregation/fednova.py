"""FedNova: normalized averaging of clients that did different amounts of local work.

Wang, Liu, Liang, Joshi and Poor 2020, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization" (NeurIPS, https://arxiv.org/abs/2007.07481),
Eq. (6)-(7). Client i ran τ_i local steps; its update Δ_i = −η Σ_k a_{i,k} g_{i,k} is
divided by ‖a_i‖₁ (how much of its gradients the steps accumulated), and the normalised
updates are averaged and scaled back by the effective number of steps τ_eff:

    Δ = τ_eff · Σ_i p_i · Δ_i / ‖a_i‖₁,     τ_eff = Σ_i p_i · ‖a_i‖₁,

with p_i the clients' sample weights (normalised; equal when None), over the rows the
rule receives (a filter's exclusions leave τ_eff to the kept clients). ‖a_i‖₁ comes from
the server as ``local_norms`` (:func:`local_norm` of the client's steps and the local
optimizer's momentum ρ and proximal ημ): τ for plain SGD,
[τ − ρ(1 − ρ^τ)/(1 − ρ)]/(1 − ρ) with momentum, [1 − (1 − ημ)^τ]/(ημ) with FedProx's term,
built step by step as the authors' code does (github.com/JYWa/FedNova, ``FedNova``
optimizer's ``local_normalizing_vec``; weight decay does not enter it there either).
With equal ‖a_i‖₁ the rule is FedAvg. Diagnostics: ``effective_weight`` =
p_i·τ_eff/‖a_i‖₁ (exact: ``effective_weight @ updates == result``; the weights need not
sum to 1), ``columns``: ``local_norm``.

Example: updates ``[[2.0], [8.0]]``, equal weights, norms ``[1, 4]`` -> τ_eff = 2.5,
Δ = 2.5 · (0.5·2/1 + 0.5·8/4) = 5.0 (FedAvg: 5.0 too; with norms ``[1, 1]`` 5.0 as well;
updates ``[[2.0], [4.0]]`` with norms ``[1, 4]`` -> 2.5 · (1 + 0.5) = 3.75, FedAvg 3.0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from aggregation.base import AggregationRule, RoundInputs, State, normalised_weights, required
from aggregation.registry import register_aggregator

__all__ = ["FedNova", "local_norm"]


def local_norm(steps: int, *, momentum: float = 0.0, lr_mu: float = 0.0) -> float:
    """‖a_i‖₁ after ``steps`` local SGD steps with ``momentum`` ρ and proximal ``lr_mu``
    (the local learning rate times FedProx's μ), as FedNova's reference code accumulates it
    step by step. 0 steps: 0."""
    counter, norm = 0.0, 0.0
    for _ in range(steps):
        if momentum:
            counter = counter * momentum + 1
            norm += counter
        if lr_mu:
            norm = norm * (1 - lr_mu) + 1
        if not momentum and not lr_mu:
            norm += 1
    return norm


@register_aggregator("fednova")
@dataclass(frozen=True, kw_only=True)
class FedNova(AggregationRule):
    """Normalized averaging; shapes ``(n, d), (n,), local_norms (n,) -> (d,)``."""

    requires_local_norms: ClassVar[bool] = True

    def advance(
        self, state: State, updates: Tensor, weights: Tensor | None, inputs: RoundInputs
    ) -> tuple[Tensor, State, dict[str, Any]]:
        norms = required(
            inputs.local_norms, "fednova", "local_norms", "each client's ‖a_i‖₁ (local_norm)"
        )
        p = normalised_weights(updates, weights).to("cpu", torch.float64)
        tau_eff = p @ norms
        effective = p * tau_eff / norms
        result = effective.to(updates.device, updates.dtype) @ updates
        columns = {"local_norm": norms.clone()}
        return result, state, {"effective_weight": effective, "columns": columns}
