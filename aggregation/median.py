"""Coordinate-wise median.

Yin, Chen, Kannan, Bartlett 2018, "Byzantine-Robust Distributed Learning: Towards
Optimal Statistical Rates" (https://arxiv.org/abs/1803.01498), Definition 1. For each
parameter k, ``out[k] = median(updates[0, k], ..., updates[n-1, k])``; with an even
number of clients, the mean of the two middle values. Client weights are ignored (the
rule is unweighted, and a Byzantine client could inflate a reported sample count).

Shapes: ``(n, d), (n,) | None -> (d,)``.

Diagnostics: ``effective_weight`` (n,), each client's average over the coordinates of its
coefficient in the output (1 for the middle value, 1/2 for each of the two middle values
of an even count; equal values share equally): an attribution, since no single weight
vector reproduces a coordinate-wise median; ``columns["trimmed_share"]``, the share of
coordinates where the client's value was not used.

Example: updates ``[[1, 10], [2, 30], [9, 20], [4, 40]]`` -> ``[3, 25]``
(column 0 sorted is 1, 2, 4, 9: (2 + 4) / 2 = 3; column 1: (20 + 30) / 2 = 25). Clients
0-3 are used in 0, 2, 1 and 1 of the 2 coordinates, each time with coefficient 1/2:
effective weights ``[0, 0.5, 0.25, 0.25]``, trimmed shares ``[1, 0, 0.5, 0.5]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aggregation.base import AggregationRule, Diagnostics
from aggregation.ops import (
    block_columns,
    column_blocks,
    compute_dtype,
    order_kernels_for,
    sort_columns,
    window_shares,
)
from aggregation.registry import register_aggregator

__all__ = [
    "Median",
    "WindowTally",
    "coordinate_median",
    "middle_window",
    "sorted_median",
    "window_rule",
]


def sorted_median(sorted_block: Tensor) -> Tensor:
    """Median of each column of an already sorted block ``(n, c) -> (c,)``."""
    n = sorted_block.shape[0]
    if n % 2 == 1:
        return sorted_block[n // 2].clone()
    return sorted_block[n // 2 - 1] * 0.5 + sorted_block[n // 2] * 0.5


def coordinate_median(updates: Tensor) -> Tensor:
    """The coordinate-wise median ``(d,)`` alone (no attribution), e.g. as an anchor."""
    kernels = order_kernels_for(updates)
    if kernels is not None:  # one pass on a CUDA GPU
        return kernels.median(updates)
    n, d = updates.shape
    dtype = compute_dtype(updates.dtype)
    out = torch.empty(d, dtype=updates.dtype, device=updates.device)
    for columns in column_blocks(d, block_columns(updates, 4 * n * dtype.itemsize)):
        out[columns] = sorted_median(sort_columns(updates[:, columns].to(dtype))).to(out.dtype)
    return out


def middle_window(n: int) -> tuple[int, int]:
    """``(start, count)`` of the sorted positions the median of ``n`` values averages."""
    return (n - 1) // 2, 2 - n % 2


class WindowTally:
    """Per-client attribution of a rule that averages a window of each column's sorted
    values, accumulated block by block: the effective weight (average coefficient) and
    the trimmed share (average share of coordinates outside the window)."""

    def __init__(self, n: int, d: int) -> None:
        self.d = d
        self.weight = torch.zeros(n, dtype=torch.float64)
        self.used = torch.zeros(n, dtype=torch.float64)

    def add(
        self, values: Tensor, ordered: Tensor, start: Tensor | int, count: Tensor | int
    ) -> None:
        shares = window_shares(values, ordered, start, count)  # (n, c)
        self.used += shares.sum(dim=1).to("cpu", torch.float64)
        self.weight += (shares / count).sum(dim=1).to("cpu", torch.float64)

    def diagnostics(self, rows: Tensor | None = None, n: int | None = None) -> Diagnostics:
        """The diagnostics; with ``rows``, the tallies belong to those of ``n`` clients
        (the others were never in a window)."""
        weight, used = self.weight / self.d, self.used / self.d
        if rows is not None and n is not None:
            weight = torch.zeros(n, dtype=torch.float64).index_copy(0, rows, weight)
            used = torch.zeros(n, dtype=torch.float64).index_copy(0, rows, used)
        return {"effective_weight": weight, "columns": {"trimmed_share": 1.0 - used}}


# Maps a sorted block (m, c) to the window (start: int or (c,), count) its rule averages.
Window = Callable[[Tensor], tuple[Tensor | int, int]]
# Maps a sorted block (m, c) and the window's start to the rule's values (c,).
Reduce = Callable[[Tensor, Tensor | int], Tensor]


def window_rule(
    updates: Tensor,
    window: Window,
    reduce: Reduce,
    fast: Tensor | None = None,
    rows: Tensor | None = None,
) -> tuple[Tensor, Diagnostics]:
    """A rule that reduces a window of each column's sorted values, with its attribution.

    Works on ``updates[rows]`` (all rows when None; the others get weight 0 and trimmed
    share 1). ``fast`` is the result from a one-pass GPU kernel where there is one: the
    sorts then only attribute it to the clients.
    """
    n, d = updates.shape
    m = n if rows is None else rows.numel()
    picked = slice(None) if rows is None else rows.to(updates.device)
    out = torch.empty(d, dtype=updates.dtype, device=updates.device) if fast is None else fast
    dtype = compute_dtype(updates.dtype)
    tally = WindowTally(m, d)
    for columns in column_blocks(d, block_columns(updates, 8 * m * dtype.itemsize)):
        values = updates[picked, columns].to(dtype)
        ordered = sort_columns(values)
        start, count = window(ordered)
        if fast is None:
            out[columns] = reduce(ordered, start).to(updates.dtype)
        tally.add(values, ordered, start, count)
    return out, tally.diagnostics(rows, n)


@register_aggregator("median")
@dataclass(frozen=True, kw_only=True)
class Median(AggregationRule):
    """Coordinate-wise median; no hyperparameters."""

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        kernels = order_kernels_for(updates)
        fast = None if kernels is None else kernels.median(updates)
        middle = middle_window(updates.shape[0])
        return window_rule(
            updates, lambda _: middle, lambda ordered, _: sorted_median(ordered), fast
        )
