"""Krum and Multi-Krum.

Blanchard, El Mhamdi, Guerraoui, Stainer 2017, "Machine Learning with Adversaries:
Byzantine Tolerant Gradient Descent" (NeurIPS,
https://proceedings.neurips.cc/paper/2017/hash/f4b9ec30ad9f68f89b29639786cb62ef-Abstract.html).

Krum scores each update by the sum of its squared Euclidean distances to its
``n - f - 2`` nearest other updates and returns the update with the smallest score.
Multi-Krum (same paper) averages the ``m`` updates with the smallest scores
(``m = n - f`` by default). The paper's condition ``n > 2f + 2`` is checked at call time.
Client weights are ignored (the rules are unweighted). Equal scores are broken by the
sum of squared distances to all other updates, so the choice does not depend on the
client order. Distances come from the centered Gram matrix (one O(n²·d) matmul pass).

Parameters: ``f: int`` (>= 0, required), Multi-Krum also ``m: int | None`` (>= 1).
Shapes: ``(n, d), (n,) | None -> (d,)``; diagnostics: ``selected`` (LongTensor, CPU: the
chosen rows, ascending), ``columns["krum_score"]`` (float64 (n,) Krum scores) and
``effective_weight`` (one-hot for Krum, 1/m on the selected rows for Multi-Krum; exact).

Example (f = 1, so each update is scored on its 5 - 1 - 2 = 2 nearest others): updates
``[[0, 0], [1, 0], [2, 0], [4, 0], [10, 0]]`` have scores ``[5, 2, 5, 13, 100]``
(row 1: 1 + 1; row 3: 4 + 9), so Krum returns ``[1, 0]``; Multi-Krum (m = n - f = 4)
averages rows 0-3: ``[1.75, 0]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aggregation.base import AggregationRule, row_mean
from aggregation.ops import centered_gram, krum_scores, ranking, squared_distances
from aggregation.registry import register_aggregator
from registry.constraints import Interval, allowed, check_fields

__all__ = ["Krum", "MultiKrum", "check_krum_condition", "krum_ranking"]


def check_krum_condition(rule: str, n: int, f: int) -> None:
    """Raise if the paper's condition ``n > 2f + 2`` does not hold."""
    if n <= 2 * f + 2:
        raise ValueError(
            f"{rule} with f={f} needs n_clients > 2f + 2 = {2 * f + 2}, got {n} clients: "
            "lower f or wait for more clients"
        )


def krum_ranking(updates: Tensor, f: int) -> tuple[Tensor, Tensor]:
    """``(order, scores)``: rows from best to worst Krum score, and the scores (CPU)."""
    dist = squared_distances(centered_gram(updates)).cpu()
    n = updates.shape[0]
    scores = krum_scores(dist, n - f - 2)
    return ranking(scores, dist.sum(dim=1)), scores


@register_aggregator("krum")
@dataclass(frozen=True, kw_only=True)
class Krum(AggregationRule):
    """The update with the smallest Krum score."""

    f: int = field(metadata=allowed(Interval(int, 0)))  # Byzantine clients tolerated

    def __post_init__(self) -> None:
        check_fields(self)

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        check_krum_condition("krum", updates.shape[0], self.f)
        order, scores = krum_ranking(updates, self.f)
        best = order[:1]
        weight = torch.zeros(updates.shape[0], dtype=torch.float64)
        weight[best] = 1.0
        diagnostics = {
            "selected": best,
            "effective_weight": weight,
            "columns": {"krum_score": scores},
        }
        return updates[int(best)].clone(), diagnostics


@register_aggregator("multi_krum")
@dataclass(frozen=True, kw_only=True)
class MultiKrum(AggregationRule):
    """Mean of the ``m`` updates with the smallest Krum scores."""

    f: int = field(metadata=allowed(Interval(int, 0)))  # Byzantine clients tolerated
    # updates averaged; None: n - f
    m: int | None = field(default=None, metadata=allowed(Interval(int, 1), None))

    def __post_init__(self) -> None:
        check_fields(self)

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        n = updates.shape[0]
        check_krum_condition("multi_krum", n, self.f)
        m = n - self.f if self.m is None else self.m
        if m > n:
            raise ValueError(f"multi_krum averages m={m} updates but only {n} clients sent one")
        order, scores = krum_ranking(updates, self.f)
        selected = torch.sort(order[:m]).values
        result, weight = row_mean(updates, selected)
        diagnostics = {
            "selected": selected,
            "effective_weight": weight,
            "columns": {"krum_score": scores},
        }
        return result, diagnostics
