"""Static clipping (a pre-aggregator).

ByzFL's ``Clipping`` pre-aggregation rule (https://byzfl.readthedocs.io): every update is
scaled into the ball of radius c,

    Clipping_c(x_1, ..., x_n) = (min(1, c / ||x_1||) x_1, ..., min(1, c / ||x_n||) x_n),

so no client can weigh in by the size of its update; the rule after it decides the rest.
Norms are computed in float64, block by block. A zero update stays zero.

Parameters: ``c: float = 2.0`` (> 0, ByzFL's default; in update units: tune it to the
norm of honest updates). Shapes: ``(n, d) -> (n, d)``; ``mixing`` is the diagonal of the
clip factors; weights pass through. Columns: ``clip_factor``, ``norm``.

Example (c = 2, ByzFL's): ``[[1, 2, 3], [4, 5, 6], [7, 8, 9]]`` have norms 3.742, 8.775
and 13.928, so they are scaled by 0.5345, 0.2279 and 0.1436 to ``[0.5345, 1.0690,
1.6036]``, ``[0.9117, 1.1396, 1.3675]`` and ``[1.0051, 1.1487, 1.2923]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from aggregation.base import PreAggregation, PreAggregator, Rng, State, Transformed, Weights
from aggregation.norm_bounded_mean import clip_factors
from aggregation.ops import row_products
from aggregation.registry import register_preaggregator
from registry.constraints import POSITIVE, allowed, check_fields

__all__ = ["StaticClipping", "scaled_rows"]


def scaled_rows(
    updates: Tensor, weights: Tensor | None, factors: Tensor, norms: Tensor
) -> PreAggregation:
    """The pre-aggregation that multiplies row i by ``factors[i]`` (float64 (n,))."""
    n = updates.shape[0]
    return PreAggregation(
        rows=factors.to(updates)[:, None] * updates,
        weights=weights,
        mixing=torch.diag(factors),
        row_of=torch.arange(n),
        columns={"clip_factor": factors, "norm": norms},
    )


@register_preaggregator("clip")
@dataclass(frozen=True, kw_only=True)
class StaticClipping(PreAggregator):
    """Scale every update into the ball of radius c."""

    # clipping radius
    c: float = field(default=2.0, metadata=allowed(POSITIVE))

    def __post_init__(self) -> None:
        check_fields(self)

    def transform(self, state: State, updates: Tensor, weights: Weights, rng: Rng) -> Transformed:
        norms = row_products(updates)[1].sqrt()
        return scaled_rows(updates, weights, clip_factors(norms, self.c), norms), state
