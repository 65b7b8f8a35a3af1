"""Geometric median by the smoothed Weiszfeld algorithm (RFA).

Pillutla, Kakade, Harchaoui 2022, "Robust Aggregation for Federated Learning" (IEEE
Trans. Signal Processing, https://arxiv.org/abs/1912.13445), smoothed Weiszfeld. The
aggregate approximately minimises ``sum_i alpha_i * ||z - w_i||`` over z, with
``alpha`` the normalised client weights (RFA weights clients by their sample counts; equal
weights when None). From the weighted mean, each iteration sets
``beta_i = alpha_i / max(nu, ||z - w_i||)`` and ``z = sum_i beta_i w_i / sum_i beta_i``. It
stops when z moves by at most ``tol`` times the weighted mean distance
``sum_i alpha_i ||z - w_i||``, or after ``max_iter`` iterations. (The RFA code stops on the
relative change of the objective instead; the objective is flat at the optimum, so that
test stops early: on the example below, at 1e-6 it leaves z off by 1e-2.)

Since z stays a convex combination ``sum_j beta_j w_j`` of the updates, every distance
follows from the clients' centered Gram matrix G (computed once, one O(n²·d) pass):
``||z - w_i||² = beta' G beta - 2 (G beta)_i + G_ii``. The iterations therefore cost
O(n²) each on CPU, and a second pass over the updates forms ``z = beta @ updates``.

Parameters: ``nu: float = 1e-6`` (smoothing, > 0, in update units), ``max_iter: int =
100`` (>= 1), ``tol: float = 1e-6`` (>= 0). The RFA paper reports that a few iterations
suffice in practice; the defaults aim at a converged median, which costs little here.
Shapes: ``(n, d), (n,) | None -> (d,)``; diagnostics ``{"effective_weight": float64 (n,)
the final Weiszfeld weights beta (CPU, sum to 1; exact: the median is beta @ updates),
"columns": {"distance": float64 (n,) ||z - w_i|| at the median}, "iterations": int,
"objective": float}``. A far client gets weight ``alpha_i / ||z - w_i||`` (normalised).

Example: updates ``[[0, 0], [2, 0], [0, 2], [2, 2], [100, 100]]`` with equal weights.
By symmetry the median lies on the diagonal at ``(t, t)``; there the unit vectors
towards the five points sum to zero when ``3t² - 6t + 2 = 0``, so ``t = 1 + 1/sqrt(3)``:
``[1.5774, 1.5774]`` (the far point pulls with unit force; the mean is ``[20.8, 20.8]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aggregation.base import AggregationRule, normalised_weights
from aggregation.ops import centered_gram
from aggregation.registry import register_aggregator
from registry.constraints import POSITIVE, Interval, allowed, check_fields

__all__ = ["GeometricMedian", "weiszfeld_on_gram"]


def weiszfeld_on_gram(
    gram: Tensor, alpha: Tensor, *, nu: float, max_iter: int, tol: float
) -> tuple[Tensor, int, float]:
    """Smoothed Weiszfeld iterations on a Gram matrix ``(n, n)`` with weights ``alpha``
    (n,), both float64. Returns ``(beta, distances, iterations)``: the median is
    ``beta @ points``, ``distances`` (n,) its distances to the points (the objective is
    ``alpha @ distances``)."""

    def distances(beta: Tensor) -> Tensor:
        g_beta = gram @ beta
        squared = beta @ g_beta - 2.0 * g_beta + gram.diagonal()
        return squared.clamp_min(0.0).sqrt()

    beta = alpha.clone()
    dist = distances(beta)
    iterations = 0
    for iterations in range(1, max_iter + 1):  # noqa: B007  (the count is returned)
        new_beta = alpha / dist.clamp_min(nu)
        new_beta = new_beta / new_beta.sum()
        change = new_beta - beta
        step = float((change @ gram @ change).clamp_min(0.0).sqrt())
        beta = new_beta
        dist = distances(beta)
        if step <= tol * float(alpha @ dist):
            break
    return beta, dist, iterations


@register_aggregator("geometric_median")
@dataclass(frozen=True, kw_only=True)
class GeometricMedian(AggregationRule):
    """RFA's smoothed Weiszfeld geometric median."""

    # smoothing: distances below nu count as nu
    nu: float = field(default=1e-6, metadata=allowed(POSITIVE))
    # Weiszfeld iterations at most
    max_iter: int = field(default=100, metadata=allowed(Interval(int, 1)))
    # stop when z moves by at most tol x the mean distance
    tol: float = field(default=1e-6, metadata=allowed(Interval(float, 0)))

    def __post_init__(self) -> None:
        check_fields(self)

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        alpha = normalised_weights(updates, weights).to(device="cpu", dtype=torch.float64)
        gram = centered_gram(updates).cpu()
        beta, dist, iterations = weiszfeld_on_gram(
            gram, alpha, nu=self.nu, max_iter=self.max_iter, tol=self.tol
        )
        result = beta.to(device=updates.device, dtype=updates.dtype) @ updates
        diagnostics = {
            "effective_weight": beta,
            "columns": {"distance": dist},
            "iterations": iterations,
            "objective": float(alpha @ dist),
        }
        return result, diagnostics
