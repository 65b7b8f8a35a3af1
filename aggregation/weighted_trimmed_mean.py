"""Size-weighted coordinate-wise trimmed mean.

For each parameter, sort the clients' values and lay their weights (sample counts) end
to end on ``[0, W]``; drop the weight ``beta * W`` at each end (a client straddling a cut
is cut fractionally) and return the weighted mean of what remains:

    out_k = sum_p |[B_p, B_p + w_p] ∩ [beta W, (1 - beta) W]| x_(p)k / ((1 - 2 beta) W)

with x_(p) the sorted values, w_p their weights and B_p the weight before position p.
This is the weighted trimmed mean of robust statistics (the trimmed mean of the
weight-weighted empirical distribution); with equal weights and ``beta * n`` an integer
f it is the trimmed mean of Yin et al. 2018 (https://arxiv.org/abs/1803.01498,
Definition 2) with f values dropped per side, and ``beta = 0`` is FedAvg.

Why: a size-weighted mean lets a small site drag the model arbitrarily far and a large
one dominate it; the unweighted trimmed mean ignores site sizes. Here every site counts
in proportion to its data, while a group of clients holding less than ``beta`` of the
total weight cannot move the output outside the range of the others. It trusts the
reported sizes.

Parameters: ``beta: float`` (0 <= beta < 0.5: the weight share dropped at each end) or
``f: int`` (the share the ``f`` heaviest clients of the round hold, computed from the
weights each round): exactly one. ``beta = f/n`` leaks whenever the attackers hold more
than ``f/n`` of the weight (IID clients of 25 or 26 images are enough); ``f`` does not,
and a round whose ``f`` heaviest clients hold half the weight or more is refused. Shapes: ``(n, d), (n,) | None -> (d,)`` (equal weights when None). Diagnostics:
``effective_weight`` (n,), each client's coefficient averaged over the coordinates (its
kept weight over ``(1 - 2 beta) W``; equal values share by weight): an attribution;
``columns["trimmed_share"]``, the share of its coordinates where its coefficient is 0.

Example (beta = 0.25): one parameter with values ``0, 1, 2, 100`` and weights ``2, 1, 3,
2`` (W = 8): the intervals are 0: [0, 2], 1: [2, 3], 2: [3, 6], 100: [6, 8]; the kept
range is [2, 6], which holds all of the value 1 and all of the value 2, so the result is
``(1 * 1 + 3 * 2) / 4 = 1.75`` (FedAvg: 27.0). Coefficients ``[0, 0.25, 0.75, 0]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor

from aggregation.base import AggregationRule
from aggregation.ops import WeightedColumns
from aggregation.registry import register_aggregator
from aggregation.weighted_median import weighted_rule
from registry.constraints import Interval, allowed, check_fields

__all__ = ["WeightedTrimmedMean"]


@register_aggregator("weighted_trimmed_mean")
@dataclass(frozen=True, kw_only=True)
class WeightedTrimmedMean(AggregationRule):
    """Weighted mean of the middle ``1 - 2 beta`` of the weight, per coordinate."""

    # weight share dropped at each end
    beta: float | None = field(
        default=None, metadata=allowed(Interval(float, 0, 0.5, closed="left"), None)
    )
    # or: the share of the f heaviest clients, per round
    f: int | None = field(default=None, metadata=allowed(Interval(int, 0), None))

    def __post_init__(self) -> None:
        check_fields(self)
        if (self.beta is None) == (self.f is None):
            raise ValueError(
                "weighted_trimmed_mean takes exactly one of beta (a weight share) or f (a "
                f"number of clients), got beta={self.beta!r}, f={self.f!r}"
            )

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        beta = self.beta if self.beta is not None else self._share(updates, weights)
        return weighted_rule(updates, weights, partial(trimmed_positions, beta))

    def _share(self, updates: Tensor, weights: Tensor | None) -> float:
        """The weight share the ``f`` heaviest clients of this round hold."""
        assert self.f is not None
        n = updates.shape[0]
        if self.f >= n:
            raise ValueError(
                f"weighted_trimmed_mean with f={self.f} needs more than f clients, got {n}"
            )
        w = torch.ones(n, dtype=torch.float64) if weights is None else weights.double()
        share = float(w.topk(self.f).values.sum() / w.sum())
        if share >= 0.5:
            raise ValueError(
                f"weighted_trimmed_mean with f={self.f}: the {self.f} heaviest clients hold "
                f"{share:.3f} of the weight; trimming needs less than half"
            )
        return share


def trimmed_positions(beta: float, block: WeightedColumns) -> Tensor:
    """Coefficients ``(n, c)`` of the sorted positions: their kept weight over the total
    kept weight, ``beta`` of the weight dropped at each end."""
    total = block.before[-1] + block.weight[-1]  # (c,)
    low, high = beta * total, (1.0 - beta) * total
    kept = (block.before + block.weight).minimum(high) - block.before.maximum(low)
    return kept.clamp_min(0.0) / (high - low)
