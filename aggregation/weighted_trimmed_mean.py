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

Parameters: ``beta: float`` (required, 0 <= beta < 0.5: the weight share dropped at each
end). Shapes: ``(n, d), (n,) | None -> (d,)`` (equal weights when None). Diagnostics:
``effective_weight`` (n,), each client's coefficient averaged over the coordinates (its
kept weight over ``(1 - 2 beta) W``; equal values share by weight): an attribution;
``columns["trimmed_share"]``, the share of its coordinates where its coefficient is 0.

Example (beta = 0.25): one parameter with values ``0, 1, 2, 100`` and weights ``2, 1, 3,
2`` (W = 8): the intervals are 0: [0, 2], 1: [2, 3], 2: [3, 6], 100: [6, 8]; the kept
range is [2, 6], which holds all of the value 1 and all of the value 2, so the result is
``(1 * 1 + 3 * 2) / 4 = 1.75`` (FedAvg: 27.0). Coefficients ``[0, 0.25, 0.75, 0]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from aggregation.base import AggregationRule
from aggregation.ops import WeightedColumns
from aggregation.registry import register_aggregator
from aggregation.weighted_median import weighted_rule

__all__ = ["WeightedTrimmedMean"]


@register_aggregator("weighted_trimmed_mean")
@dataclass(frozen=True, kw_only=True)
class WeightedTrimmedMean(AggregationRule):
    """Weighted mean of the middle ``1 - 2 beta`` of the weight, per coordinate."""

    beta: float  # weight share dropped at each end

    def __post_init__(self) -> None:
        if not 0.0 <= self.beta < 0.5:
            raise ValueError(f"beta must lie in [0, 0.5), got {self.beta!r}")

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        return weighted_rule(updates, weights, self._positions)

    def _positions(self, block: WeightedColumns) -> Tensor:
        """Coefficients ``(n, c)`` of the sorted positions: their kept weight over the
        total kept weight."""
        total = block.before[-1] + block.weight[-1]  # (c,)
        low, high = self.beta * total, (1.0 - self.beta) * total
        kept = (block.before + block.weight).minimum(high) - block.before.maximum(low)
        return kept.clamp_min(0.0) / (high - low)
