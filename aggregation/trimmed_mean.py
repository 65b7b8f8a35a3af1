"""Coordinate-wise trimmed mean.

Yin, Chen, Kannan, Bartlett 2018, "Byzantine-Robust Distributed Learning: Towards
Optimal Statistical Rates" (https://arxiv.org/abs/1803.01498), Definition 2. For each
parameter, sort the n clients' values, drop the ``f`` smallest and the ``f`` largest, and
average the remaining ``n - 2f``. Give either ``f`` (values dropped per side) or ``beta``
(the fraction dropped per side, ``f = floor(beta * n)``, as in the paper and in
``scipy.stats.trim_mean``), not both. Client weights are ignored (unweighted rule).

Parameters: ``f: int | None`` (>= 0), ``beta: float | None`` (0 <= beta < 0.5); exactly
one is required. Needs ``n > 2f`` clients, checked at call time.

Shapes: ``(n, d), (n,) | None -> (d,)``. Diagnostics: ``effective_weight`` (n,), each
client's coefficient averaged over the coordinates (1/(n - 2f) where its value is kept;
equal values at the trimming edge share the kept positions equally): an attribution, as
for the median; ``columns["trimmed_share"]``, the share of its coordinates trimmed.

Example (f = 1): updates ``[[1, 0], [2, 10], [3, 20], [100, 30], [-50, 40]]`` ->
``[2, 20]`` (column 0 sorted is -50, 1, 2, 3, 100: mean of 1, 2, 3; column 1: mean of
10, 20, 30). Clients 0 and 3 are trimmed in one column, client 4 in both: effective
weights ``[1/6, 1/3, 1/3, 1/6, 0]``, trimmed shares ``[0.5, 0, 0, 0.5, 1]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from aggregation.base import AggregationRule
from aggregation.median import window_rule
from aggregation.ops import (
    order_kernels_for,
)
from aggregation.registry import register_aggregator
from registry.constraints import Interval, allowed, check_fields

__all__ = ["TrimmedMean"]


@register_aggregator("trimmed_mean")
@dataclass(frozen=True, kw_only=True)
class TrimmedMean(AggregationRule):
    """Mean of the middle ``n - 2f`` values per coordinate."""

    # values dropped at each end
    f: int | None = field(default=None, metadata=allowed(Interval(int, 0), None))
    # or: fraction dropped at each end, f = floor(beta * n)
    beta: float | None = field(
        default=None, metadata=allowed(Interval(float, 0, 0.5, closed="left"), None)
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if (self.f is None) == (self.beta is None):
            raise ValueError(
                "trimmed_mean needs exactly one of f (values dropped per side) "
                f"or beta (fraction dropped per side); got f={self.f}, beta={self.beta}"
            )

    def trimmed(self, n: int) -> int:
        """Values dropped at each end for ``n`` clients."""
        if self.f is not None:
            return self.f
        assert self.beta is not None
        return math.floor(self.beta * n)

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        n = updates.shape[0]
        f = self.trimmed(n)
        if n <= 2 * f:
            raise ValueError(
                f"trimmed_mean with f={f} drops {2 * f} values per coordinate but only "
                f"{n} clients sent updates: it needs n_clients > 2f (lower f)"
            )
        kernels = order_kernels_for(updates)
        fast = None if kernels is None else kernels.trimmed_mean(updates, f)
        return window_rule(
            updates,
            lambda _: (f, n - 2 * f),
            lambda ordered, _: ordered[f : n - f].mean(dim=0),
            fast,
        )
