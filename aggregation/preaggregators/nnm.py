"""NNM: nearest-neighbour mixing (a pre-aggregator).

Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan 2023, "Fixing by Mixing: A Recipe
for Optimal Byzantine ML under Heterogeneity" (AISTATS,
https://proceedings.mlr.press/v206/allouah23a.html), as ByzFL's ``NNM`` defines it: every
update is replaced by the mean of its ``n - f`` nearest neighbours (Euclidean, itself
included):

    NNM_f(x_1, ..., x_n) = (mean of N_1, ..., mean of N_n),

which pulls the Byzantine updates towards the honest ones before the rule. Equal
distances: ByzFL's ``argpartition`` keeps any; here they are ordered by the sum of
squared distances to all updates, then by row, so the result does not depend on the
client order except for exact ties in both. Distances come from the centered Gram matrix
(one O(n²·d) pass); the rows are ``mixing @ updates`` (another).

Parameters: ``f: int = 0`` (>= 0, ByzFL's default: every row becomes the mean). Needs
``n > 2f`` (checked at call time). Shapes: ``(n, d) -> (n, d)``; ``mixing`` ``(n, n)`` has
1/(n - f) on each row's neighbours; weights pass through (row i stands for client i).
Columns: ``in_neighbourhoods``, how many of the n neighbourhoods hold the client (a far
outlier is in few but its own).

Example (f = 1, ByzFL's): ``[[1, 2, 3], [4, 5, 6], [7, 8, 9]]``: the two nearest of row 0
are rows 0, 1; of row 1, itself and row 0 or 2, both 27 away (their total squared
distances tie too, at 135, so the lower row, 0); of row 2, rows 2, 1. NNM gives ``[[2.5, 3.5, 4.5], [2.5, 3.5, 4.5], [5.5, 6.5, 7.5]]``;
``in_neighbourhoods`` ``[2, 3, 1]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from aggregation.base import (
    PreAggregation,
    Rng,
    State,
    TolerantPreAggregator,
    Transformed,
    Weights,
)
from aggregation.ops import centered_gram, ranking, squared_distances
from aggregation.registry import register_preaggregator

__all__ = ["NNM", "neighbour_mixing"]


def neighbour_mixing(dist: Tensor, k: int) -> Tensor:
    """``(n, n)`` float64: row i has 1/k on the k rows nearest to row i (squared distances
    ``dist``), equal distances ordered by the rows' total squared distance, then row."""
    n = dist.shape[0]
    total = dist.sum(dim=1)
    mixing = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        mixing[i, ranking(dist[i], total)[:k]] = 1.0 / k
    return mixing


@register_preaggregator("nnm")
@dataclass(frozen=True, kw_only=True)
class NNM(TolerantPreAggregator):
    """Replace every update by the mean of its ``n - f`` nearest neighbours."""

    def transform(self, state: State, updates: Tensor, weights: Weights, rng: Rng) -> Transformed:
        n = self.check_clients("nnm", updates)
        mixing = neighbour_mixing(squared_distances(centered_gram(updates)).cpu(), n - self.f)
        result = PreAggregation(
            rows=mixing.to(updates) @ updates,
            weights=weights,
            mixing=mixing,
            row_of=torch.arange(n),
            columns={"in_neighbourhoods": (mixing > 0).sum(dim=0).to(torch.float64)},
        )
        return result, state
