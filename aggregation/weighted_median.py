"""Size-weighted coordinate-wise median.

For each parameter, the weighted median of the clients' values with the clients' weights
(their sample counts): the value m minimising ``sum_i w_i |x_ik - m|``. With the values
sorted and W the total weight, it is the first value whose cumulative weight reaches
W/2; when the cumulative weight equals W/2 exactly, every value up to the next one
minimises the sum and the midpoint of the two is returned, so equal weights give the
ordinary median (the mean of the two middle values for an even count). Clients of weight
0 have no say. Equal weights when None.

Why a weighted robust rule: a size-weighted mean (FedAvg) lets one site move the model
in proportion to its size and lets a small site drag it arbitrarily far; the plain median
and Krum ignore how much data each site holds. The weighted median keeps the median's
robustness to a minority of the *weight*: clients holding less than half of the total
weight cannot move it outside the range of the others. It trusts the reported sizes; a
client that can inflate its sample count can take the median over.

The rule is the classical weighted median (the minimiser of weighted absolute
deviations), applied per coordinate as Yin et al. 2018 (https://arxiv.org/abs/1803.01498)
apply the median; RFA (Pillutla et al. 2022) weights its geometric median by sample
counts the same way. ``numpy.quantile(x, 0.5, weights=w, method="inverted_cdf")``
computes the same value whenever no cumulative weight equals W/2 exactly.

Shapes: ``(n, d), (n,) | None -> (d,)``. Diagnostics: ``effective_weight`` (n,), each
client's coefficient averaged over the coordinates (1, or 1/2 for the two values of an
exact tie at W/2; equal values share it by weight): an attribution; ``columns
["trimmed_share"]``, the share of its coordinates where its coefficient is 0.

Example: one parameter with values ``1, 2, 3, 10`` and weights ``1, 1, 1, 5``: the
cumulative weights are 1, 2, 3, 8 of W = 8, first reaching 4 at 10, so the weighted
median is 10 (the plain median is 2.5: the client with 5/8 of the data is the majority).
With weights ``3, 1, 1, 3``: cumulative 3, 4, 5, 8, exactly 4 at 2, so the result is
``(2 + 3) / 2 = 2.5``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aggregation.base import AggregationRule, Diagnostics, normalised_weights
from aggregation.ops import WeightedColumns, block_columns, column_blocks, compute_dtype
from aggregation.registry import register_aggregator

__all__ = ["WeightedMedian", "weighted_rule"]


def weighted_rule(
    updates: Tensor,
    weights: Tensor | None,
    coefficients: Callable[[WeightedColumns], Tensor],
) -> tuple[Tensor, Diagnostics]:
    """A size-weighted coordinate-wise rule: ``coefficients(columns)`` gives the weight
    ``(n, c)`` of each sorted position of a :class:`WeightedColumns` block in the output,
    which is their weighted sum; returns the result and the clients' attribution."""
    n, d = updates.shape
    normalised_weights(updates, weights)  # validates them
    # Raw weights (sample counts): their partial sums are exact, so ties at W/2 are seen.
    w = torch.ones(n, dtype=torch.float64) if weights is None else weights.to(torch.float64)
    w = w.to(updates.device)
    dtype = compute_dtype(updates.dtype)
    out = torch.empty(d, dtype=updates.dtype, device=updates.device)
    weight = torch.zeros(n, dtype=torch.float64)
    used = torch.zeros(n, dtype=torch.float64)
    for columns in column_blocks(d, block_columns(updates, 12 * n * 8)):
        block = WeightedColumns(updates[:, columns].to(dtype), w)
        position = coefficients(block)  # (n, c) float64
        out[columns] = (position * block.ordered).sum(dim=0).to(updates.dtype)
        client = block.spread(position)
        weight += client.sum(dim=1).cpu()
        used += (client > 0).sum(dim=1).cpu()
    return out, {"effective_weight": weight / d, "columns": {"trimmed_share": 1.0 - used / d}}


def median_positions(block: WeightedColumns) -> Tensor:
    """Coefficients ``(n, c)`` of the sorted positions in the weighted median."""
    total = block.before[-1] + block.weight[-1]  # (c,)
    reached = 2.0 * (block.before + block.weight)
    low = (reached < total).sum(dim=0, keepdim=True)  # first position reaching W/2
    high = (reached <= total).sum(dim=0, keepdim=True).clamp(max=block.weight.shape[0] - 1)
    position = torch.zeros_like(block.weight)
    position.scatter_add_(0, low, torch.full_like(low, 0.5, dtype=torch.float64))
    position.scatter_add_(0, high, torch.full_like(high, 0.5, dtype=torch.float64))
    return position


@register_aggregator("weighted_median")
@dataclass(frozen=True, kw_only=True)
class WeightedMedian(AggregationRule):
    """Size-weighted coordinate-wise median; no hyperparameters."""

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        return weighted_rule(updates, weights, median_positions)
