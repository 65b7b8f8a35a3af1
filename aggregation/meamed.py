"""Meamed: the mean around the median, per coordinate.

Xie, Koyejo, Gupta 2018, "Generalized Byzantine-tolerant SGD"
(https://arxiv.org/abs/1802.10116), the mean-around-median rule: for each parameter,
the mean of the ``n - f`` clients' values closest to the parameter's median. Client
weights are ignored (unweighted rule).

Parameters: ``f: int`` (>= 0, required: the values left out per coordinate, at least
the number of Byzantine clients tolerated). Needs ``n > 2f`` clients (a Byzantine
minority, so that the median stays among honest values), checked at call time. Shapes: ``(n, d), (n,) | None -> (d,)``.

How it differs from ByzFL's ``Meamed``: ByzFL's torch path takes ``torch.median``, the
lower of the two middle values for an even count (its numpy path the mean of the two);
here the median is always the mean of the two middle values. Values at equal distance
from the median: ByzFL's ``argpartition`` keeps any of them; here the ``n - f`` closest
values form a window of the sorted values and between two windows at equal distance the
lower one is kept (as in Bulyan's second phase), so the result never depends on the
client order.

Diagnostics: ``effective_weight`` (n,), each client's coefficient averaged over the
coordinates (1/(n - f) where its value is among the averaged; equal values share
equally): an attribution, as for the median; ``columns["trimmed_share"]``, the share of
its coordinates left out.

Example (f = 1): updates ``[[1, 0], [2, 0], [3, 4], [10, 5]]``. Column 0 has median 2.5;
the three closest values are 1, 2, 3 (10 is 7.5 away): mean 2. Column 1 has median 2;
the window 0, 0, 4 (worst distance 2) beats 0, 4, 5 (worst 3): mean 4/3. Meamed returns
``[2, 1.3333]``; clients 0-2 are averaged in both coordinates and client 3 in none:
effective weights ``[1/3, 1/3, 1/3, 0]``, trimmed shares ``[0, 0, 0, 1]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from aggregation.base import AggregationRule, check_minority
from aggregation.bulyan import closest_to_median_mean, closest_to_median_start
from aggregation.median import window_rule
from aggregation.registry import register_aggregator
from registry.constraints import Interval, allowed, check_fields

__all__ = ["Meamed"]


@register_aggregator("meamed")
@dataclass(frozen=True, kw_only=True)
class Meamed(AggregationRule):
    """Mean of the ``n - f`` values closest to the median, per coordinate."""

    f: int = field(metadata=allowed(Interval(int, 0)))  # values left out per coordinate

    def __post_init__(self) -> None:
        check_fields(self)

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        n = updates.shape[0]
        check_minority("meamed", n, self.f)
        kept = n - self.f
        return window_rule(
            updates,
            lambda ordered: (closest_to_median_start(ordered, kept), kept),
            lambda ordered, start: closest_to_median_mean(ordered, kept, start),
        )
