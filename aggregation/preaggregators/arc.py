"""ARC: adaptive robust clipping (a pre-aggregator).

Allouah, Guerraoui, Gupta, Jellouli, Rizk, Stephan 2024, "The Vital Role of Gradient
Clipping in Byzantine-Resilient Distributed Learning" (https://arxiv.org/abs/2405.14432),
as ByzFL's ``ARC`` defines it: with ``k = floor(2 f (n - f) / n)``, the k updates of
largest norm are clipped to the norm of the largest one left unclipped, i.e. every update
is scaled by ``min(1, tau / ||x_i||)`` with tau the (n - k)-th smallest norm. Equal norms
at tau need no clipping, so the result does not depend on the client order. k is computed
in integers (ByzFL multiplies floats, which can round one lower in rare cases).

Parameters: ``f: int = 0`` (>= 0, ByzFL's default: no clipping). Needs ``n > 2f`` (checked
at call time). Shapes: ``(n, d) -> (n, d)``; ``mixing`` is the diagonal of the clip
factors; weights pass through. Columns: ``clip_factor``, ``norm``; ``info["threshold"]``
is tau, ``info["clipped"]`` k.

Example (f = 1, ByzFL's): ``[[1, 2, 3], [4, 5, 6], [7, 8, 9]]``: k = floor(2 * 1 * 2 / 3)
= 1, so the largest (norm 13.928) is clipped to the norm of ``[4, 5, 6]``, 8.775: scaled
by 0.6300 to ``[4.4100, 5.0400, 5.6701]``; the other two are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from aggregation.base import (
    Rng,
    State,
    TolerantPreAggregator,
    Transformed,
    Weights,
)
from aggregation.norm_bounded_mean import clip_factors
from aggregation.ops import row_products
from aggregation.preaggregators.clip import scaled_rows
from aggregation.registry import register_preaggregator

__all__ = ["ARC"]


@register_preaggregator("arc")
@dataclass(frozen=True, kw_only=True)
class ARC(TolerantPreAggregator):
    """Clip the ``floor(2f(n - f)/n)`` largest updates to the next norm."""

    def transform(self, state: State, updates: Tensor, weights: Weights, rng: Rng) -> Transformed:
        n = self.check_clients("arc", updates)
        clipped = (2 * self.f * (n - self.f)) // n
        norms = row_products(updates)[1].sqrt()
        threshold = float(torch.sort(norms).values[n - clipped - 1])
        result = scaled_rows(updates, weights, clip_factors(norms, threshold), norms)
        result.info = {"threshold": threshold, "clipped": clipped}
        return result, state
