"""AFL: Agnostic Federated Learning, the minimax over mixtures of the clients.

Mohri, Sivek and Suresh 2019, "Agnostic Federated Learning" (ICML,
https://arxiv.org/abs/1902.00146): the model minimises max_{λ ∈ Λ} Σ_k λ_k L_k(w) over
mixture weights λ on the simplex Λ of the clients, solved by alternating steps
(Stochastic-AFL, Algorithm 1): the model steps along the λ-weighted mixture of the
clients' updates, and λ ascends along its gradient, the clients' losses,
λ ← Π_Λ(λ + γ_λ · L(w)) (Π_Λ: the exact Euclidean projection onto the simplex,
:func:`project_to_simplex`).

Here a round's aggregate is Σ_k λ_k Δ_k / Σ_k λ_k over the rows the rule receives (the
clients' sample counts are not used: λ is the weighting), then λ ascends by
``step_size`` (γ_λ ≥ 0) times each row's client's loss of the round's global model on
its own training data (``losses``, given by the server), a client not in the round
adding nothing, and is projected. λ is kept by client id (``requires_client_ids``),
uniform over the clients of the first round; a client first seen later joins at the mean
weight and λ is renormalised. Diagnostics: ``effective_weight`` = λ_k/Σλ over the rows
(``effective_weight @ updates == result``), ``columns``: ``afl_lambda`` (each row's λ
after the round's ascent).

Example: ``step_size=0`` and a uniform λ make AFL the unweighted mean (FedAvg with
``weights=None``); rows ``[[0.0], [4.0]]`` with losses ``[1, 3]`` and ``step_size=0.25``:
the aggregate is 2.0 and λ moves from [0.5, 0.5] to Π([0.75, 1.25]) = [0.25, 0.75].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from aggregation.base import AggregationRule, RoundInputs, State, required
from aggregation.registry import register_aggregator
from registry.constraints import Interval, allowed, check_fields

__all__ = ["AFL", "project_to_simplex"]


def project_to_simplex(values: Tensor) -> Tensor:
    """The Euclidean projection of ``values`` ``(n,)`` onto {λ ≥ 0, Σλ = 1}, exact: sort,
    find the largest ρ with u_ρ − (Σ_{j≤ρ} u_j − 1)/ρ > 0, shift by that θ and clip at 0
    (Held, Wolfe and Crowder 1974; Duchi et al. 2008, Figure 1)."""
    ordered, _ = torch.sort(values, descending=True)
    cumulative = torch.cumsum(ordered, dim=0) - 1
    ranks = torch.arange(1, len(values) + 1, dtype=values.dtype, device=values.device)
    rho = int((ordered - cumulative / ranks > 0).nonzero().max())
    theta = cumulative[rho] / (rho + 1)
    return torch.clamp(values - theta, min=0)


@register_aggregator("afl")
@dataclass(frozen=True, kw_only=True)
class AFL(AggregationRule):
    """λ-weighted mean with projected ascent on λ; ``(n, d), losses (n,) -> (d,)``."""

    requires_client_ids: ClassVar[bool] = True
    requires_losses: ClassVar[bool] = True

    # γ_λ: λ's ascent step along the clients' losses (0: λ stays uniform, the plain mean)
    step_size: float = field(default=0.01, metadata=allowed(Interval(float, 0)))

    def __post_init__(self) -> None:
        check_fields(self, "afl")

    def init_state(self) -> State:
        return {"ids": [], "lambda": torch.zeros(0, dtype=torch.float64)}

    def advance(
        self, state: State, updates: Tensor, weights: Tensor | None, inputs: RoundInputs
    ) -> tuple[Tensor, State, dict[str, Any]]:
        ids = list(required(inputs.client_ids, "afl", "client_ids", "the rows' client ids"))
        losses = required(inputs.losses, "afl", "losses", "each client's loss of the model")
        known, weights_by_id = _joined(list(state["ids"]), state["lambda"], ids)
        present = torch.tensor([known.index(i) for i in ids])
        mixture = weights_by_id[present]
        effective = mixture / mixture.sum()
        result = effective.to(updates.device, updates.dtype) @ updates
        gradient = torch.zeros_like(weights_by_id)
        gradient[present] = losses
        ascended = project_to_simplex(weights_by_id + self.step_size * gradient)
        columns = {"afl_lambda": ascended[present].clone()}
        new_state = {"ids": known, "lambda": ascended}
        return result, new_state, {"effective_weight": effective, "columns": columns}


def _joined(known: list[int], weights: Tensor, ids: list[int]) -> tuple[list[int], Tensor]:
    """λ over the known ids and the round's new ones: uniform in the first round, a new
    client at the mean weight, renormalised."""
    new = [i for i in ids if i not in known]
    if not new:
        return known, weights
    if not known:
        return new, torch.full((len(new),), 1.0 / len(new), dtype=torch.float64)
    joined = torch.cat(
        [weights, torch.full((len(new),), float(weights.mean()), dtype=torch.float64)]
    )
    return known + new, joined / joined.sum()
