"""Zeno: suspicion-based aggregation with a server-side loss oracle.

Xie, Koyejo, Gupta 2019, "Zeno: Distributed Stochastic Gradient Descent with
Suspicion-based Fault-tolerance" (ICML, https://proceedings.mlr.press/v97/xie19b.html):
the stochastic descendant score and the Zeno_b rule. The server scores each candidate update on a small batch of its own
data (here: from the validation split) by the stochastic descendant score

    score_i = loss(x) - loss(x after update i) - rho * ||g_i||²

and averages the ``n - b`` updates with the highest scores (unweighted).

The seam with the server loop. Zeno needs the model and a loss, so it is not a pure
``(n, d)`` rule: ``requires_oracle = True`` tells the server to call
``step(state, updates, weights, oracle=oracle)`` where ``oracle`` maps a batch of
candidate updates ``(k, d)`` to the server-batch loss after applying each one, ``(k,)``.
The rule obtains the base loss as ``oracle(zeros(1, d))`` (applying nothing) and the
other losses as ``oracle(updates)`` in one call. Calling the rule without an oracle
raises.

Sign convention and learning rate. The rule does not apply updates itself: ``g_i`` is
the row as the server passes it, and the oracle decides how it is applied. In this
project rows are model deltas ``w_local - w_global`` and the oracle evaluates
``loss(w_global + g_i)``. The paper writes the update as a gradient ``u_i`` applied as
``x - gamma * u_i`` with penalty ``rho_paper * ||u_i||²``; with ``g_i = -gamma * u_i`` that
is this rule with ``rho = rho_paper / gamma²``. A non-finite loss counts as the worst score.

Parameters: ``b: int`` (required, >= 0: updates discarded, at least the number of
suspected faulty clients; ``n > b`` is checked at call time), ``rho: float = 5e-4``
(>= 0, in 1/update² units; tune it with the loss scale). Client weights are ignored.
Shapes: ``(n, d), (n,) | None -> (d,)``; diagnostics ``{"selected": LongTensor (CPU) of
the kept rows, ascending, "columns": {"zeno_score": float64 (n,)}, "effective_weight":
1/(n - b) on the kept rows (exact), "base_loss": float}``.

Example (b = 1, rho = 0.1): loss ``(x - 1)²`` summed over 2 parameters from x = 0 (base
loss 2); updates ``[[1, 1], [0.5, 0.5], [-1, 0]]`` give losses 0, 0.5, 5 and scores
``2 - 0 - 0.2 = 1.8``, ``2 - 0.5 - 0.05 = 1.45``, ``2 - 5 - 0.1 = -3.1``: the last is
dropped and Zeno returns ``[0.75, 0.75]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from aggregation.base import AggregationRule, Oracle, RoundInputs, State, required, row_mean
from aggregation.registry import register_aggregator
from registry.constraints import Interval, allowed, check_fields

__all__ = ["Oracle", "Zeno"]


@register_aggregator("zeno")
@dataclass(frozen=True, kw_only=True)
class Zeno(AggregationRule):
    """Mean of the ``n - b`` updates with the best stochastic descendant scores."""

    requires_oracle: ClassVar[bool] = True

    b: int = field(metadata=allowed(Interval(int, 0)))  # updates discarded each round
    # weight of the ||g||² penalty
    rho: float = field(default=5e-4, metadata=allowed(Interval(float, 0)))

    def __post_init__(self) -> None:
        check_fields(self)

    def advance(
        self, state: State, updates: Tensor, weights: Tensor | None, inputs: RoundInputs
    ) -> tuple[Tensor, State, dict[str, Any]]:
        oracle = required(
            inputs.oracle,
            "zeno",
            "oracle",
            "a map from updates (k, d) to the server-batch loss after each, (k,)",
        )
        n, d = updates.shape
        if n <= self.b:
            raise ValueError(
                f"zeno with b={self.b} discards {self.b} updates but only {n} clients "
                "sent one: it needs n_clients > b (lower b)"
            )
        zero = torch.zeros(1, d, dtype=updates.dtype, device=updates.device)
        base = _losses(oracle, zero, 1)[0]
        losses = _losses(oracle, updates, n)
        penalty = torch.linalg.vector_norm(updates, dim=1).to("cpu", torch.float64).square()
        scores = base - losses - self.rho * penalty
        scores = torch.where(torch.isnan(scores), -torch.inf, scores)
        keep = n - self.b
        # Highest scores first; equal scores keep the lower row index (stable sort).
        selected = torch.sort(torch.sort(-scores, stable=True).indices[:keep]).values
        result, weight = row_mean(updates, selected)
        diagnostics = {
            "selected": selected,
            "effective_weight": weight,
            "columns": {"zeno_score": scores},
            "base_loss": float(base),
        }
        return result, state, diagnostics


def _losses(oracle: Oracle, candidates: Tensor, expected: int) -> Tensor:
    """The oracle's losses as float64 on CPU, checked to be one per candidate."""
    losses = torch.as_tensor(oracle(candidates)).detach()
    if losses.shape != (expected,):
        raise ValueError(
            f"the zeno oracle returned shape {tuple(losses.shape)} for {expected} "
            f"candidate updates; it must return one loss per update, shape ({expected},)"
        )
    return losses.to("cpu", torch.float64)
