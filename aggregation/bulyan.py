"""Bulyan.

El Mhamdi, Guerraoui, Rouault 2018, "The Hidden Vulnerability of Distributed Learning in
Byzantium" (ICML, https://arxiv.org/abs/1802.07927).

1. Selection: ``theta = n - 2f`` updates chosen by iterated Krum: Krum (Blanchard et al.
   2017) is applied to the remaining set R, scoring each update on its ``|R| - f - 2``
   nearest others in R; the winner moves to the selection; repeat ``theta`` times. When
   ``|R| - f - 2 <= 0`` (the last rounds for small f) every score is 0 and the tie-break
   picks the update with the smallest sum of squared distances to the rest of R.
2. Aggregation, per coordinate: over the ``theta`` selected values, the ``beta = theta -
   2f`` values closest to their median (mean of the two middle values for even theta)
   are averaged. The ``beta`` closest values form a window of the sorted values; between
   two windows at equal distance the lower one is kept.

Needs ``n >= 4f + 3`` (checked at call time). Client weights are ignored.

Parameters: ``f: int`` (>= 0, required). Shapes: ``(n, d), (n,) | None -> (d,)``;
diagnostics: ``selected`` (LongTensor, CPU: the theta chosen rows, ascending);
``effective_weight`` (n,), each client's coefficient averaged over the coordinates (1/beta
where its value is among the beta averaged, 0 for the rows not selected; an attribution,
as for the median); ``columns["trimmed_share"]``, the share of its coordinates not
averaged (1 for the rows not selected).

Example (f = 1, n = 7, theta = 5, beta = 3): updates ``[[0, 5], [10, 0], [20, 1],
[30, 2], [40, 10], [50, 11], [1000, -500]]``. Iterated Krum keeps rows 1-5 (the far row
6 and the edge row 0 are left out). Per coordinate the selected values are 10, 20, 30,
40, 50 (median 30; closest three 20, 30, 40) and 0, 1, 2, 10, 11 (median 2; closest
three 0, 1, 2), so Bulyan returns ``[30, 1]`` (a trimmed mean of the second column
would give 13/3). Rows 2, 3 are averaged in both coordinates, rows 1, 4 in one, row 5 and
the unselected rows 0, 6 in none: effective weights ``[0, 1/6, 1/3, 1/3, 1/6, 0, 0]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aggregation.base import AggregationRule
from aggregation.median import sorted_median, window_rule
from aggregation.ops import (
    centered_gram,
    krum_scores,
    ranking,
    squared_distances,
)
from aggregation.registry import register_aggregator
from registry.constraints import Interval, allowed, check_fields

__all__ = ["Bulyan", "closest_to_median_mean", "closest_to_median_start", "iterated_krum"]


def iterated_krum(dist: Tensor, f: int, count: int) -> Tensor:
    """Rows chosen by ``count`` rounds of Krum on the shrinking remaining set, in order of
    selection, from the squared-distance matrix ``dist`` (n, n)."""
    remaining = list(range(dist.shape[0]))
    chosen: list[int] = []
    for _ in range(count):
        index = torch.tensor(remaining)
        sub = dist[index][:, index]
        scores = krum_scores(sub, len(remaining) - f - 2)
        best = int(ranking(scores, sub.sum(dim=1))[0])
        chosen.append(remaining.pop(best))
    return torch.tensor(chosen, dtype=torch.long)


def closest_to_median_start(ordered: Tensor, beta: int) -> Tensor:
    """Per column of a sorted block ``(theta, c)``, the start s ``(c,)`` of the window
    ``[s, s + beta)`` of the ``beta`` values closest to the column's median.

    Moving the window from s to s + 1 swaps ``x[s]`` for ``x[s + beta]``, which is closer
    to the median m iff ``x[s] + x[s + beta] < 2m``; that sum grows with s, so the best
    start is the number of s in ``0 .. theta - beta - 1`` for which it holds (ties keep
    the lower).
    """
    theta = ordered.shape[0]
    median = sorted_median(ordered)
    shifts = theta - beta
    # (x[s] - m) < (m - x[s + beta]) is x[s] + x[s + beta] < 2m without overflow.
    closer = (ordered[:shifts] - median) < (median - ordered[beta : beta + shifts])
    return closer.sum(dim=0)


def closest_to_median_mean(ordered: Tensor, beta: int, start: Tensor | None = None) -> Tensor:
    """Per column of a sorted block ``(theta, c)``, the mean of the ``beta`` values
    closest to the column's median (the window from :func:`closest_to_median_start`,
    unless its ``start`` is given)."""
    if beta == ordered.shape[0]:
        return ordered.mean(dim=0)
    if start is None:
        start = closest_to_median_start(ordered, beta)
    window = start[None, :] + torch.arange(beta, device=ordered.device)[:, None]
    return ordered.gather(0, window).mean(dim=0)


@register_aggregator("bulyan")
@dataclass(frozen=True, kw_only=True)
class Bulyan(AggregationRule):
    """Iterated Krum selection, then a coordinate-wise mean around the median."""

    f: int = field(metadata=allowed(Interval(int, 0)))  # Byzantine clients tolerated

    def __post_init__(self) -> None:
        check_fields(self)

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        n = updates.shape[0]
        f = self.f
        if n < 4 * f + 3:
            raise ValueError(
                f"bulyan with f={f} needs n_clients >= 4f + 3 = {4 * f + 3}, got {n} "
                "clients: lower f or wait for more clients"
            )
        theta, beta = n - 2 * f, n - 4 * f
        dist = squared_distances(centered_gram(updates)).cpu()
        selected = torch.sort(iterated_krum(dist, f, theta)).values
        out, diagnostics = window_rule(
            updates,
            lambda ordered: (closest_to_median_start(ordered, beta), beta),
            lambda ordered, start: closest_to_median_mean(ordered, beta, start),
            rows=selected,
        )
        return out, {"selected": selected, **diagnostics}
