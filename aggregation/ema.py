"""EMA: quartile-based estimated-mean aggregation.

Wu, Deng, Chen, Nguyen, Yesha, "Enabling Quartile-based Estimated-Mean Gradient
Aggregation as Baseline for Federated Image Classifications"
(https://github.com/AnonymousUser08/EMA.git; ../shared/papers/ema.txt), Algorithms 1-2,
with the estimator of Luo, Wan, Liu, Tong 2018, "Optimally estimating the sample mean
from the sample size, median, mid-range, and/or mid-quartile range" (Stat. Methods Med.
Res. 27(6)).

Per parameter, over the n clients' values:

1. the median m of all n sorted values (Algorithm 1, lines 5-10: before any trimming);
2. Q1, Q3 and IQR = Q3 - Q1, and the values inside ``[Q1 - k*IQR, Q3 + k*IQR]`` kept
   (Algorithm 2; Algorithm 1, line 11: ``G_aggregated = sg[L : U]``);
3. over the kept values, the quartiles q1 and q3 (Algorithm 1, lines 14-18);
4. return ``w (q1 + q3) / 2 + (1 - w) m`` with ``w = 0.70 + 0.39 / n_kept`` (Luo et al.'s
   weight for the {q1, m, q3; n} scenario; Algorithm 1, lines 16 and 19), computed as
   ``m + w ((q1 + q3) / 2 - m)`` so that equal values return exactly that value.

Choices the paper leaves open, made here:

- the thresholding is per parameter (the paper's "G_i lies between" is ambiguous between
  whole vectors and coordinates; the quartiles of Algorithm 1 are per coordinate);
- quartiles and medians are sample quantiles with linear interpolation between order
  statistics (Hyndman-Fan type 7, the numpy/torch default): the q-quantile of sorted
  ``x_0..x_{m-1}`` is ``x_j + (p - j)(x_{j+1} - x_j)`` at ``p = q (m - 1)``, so the median
  of an even count is the mean of the two middle values. Algorithm 1's index arithmetic
  (``quar1 = len/4``, ``q1 = G[: quar1 - 1]``) is garbled in the text and not followed;
- the bounds are inclusive; ``n`` in ``w`` is the number of kept values per coordinate
  (the paper's line 16 writes n without saying which);
- nothing is kept only when n = 2 and k < 0.5 (for n >= 3 the values between Q1 and Q3
  always survive); such a coordinate keeps all values;
- client weights are ignored (the paper's rule is unweighted).

Parameters: ``k: float = 1.5`` (>= 0, Tukey's fence). Shapes: ``(n, d), (n,) | None ->
(d,)``. Diagnostics: ``columns["fenced_share"]``, the share of a client's coordinates
outside the fences; ``effective_weight`` (n,), its coefficient in the output averaged over
the coordinates (the estimate is ``(1 - w) m + (w/2) q1 + (w/2) q3`` and each quantile
interpolates two order statistics, so each coordinate is a fixed combination of at most
six values; equal values share equally): an attribution, as for the median. A fenced
client can keep a share through m, which is taken before the fences.

Example (k = 1.5): one coordinate with values ``0, 1, 2, 3, 4, 5, 6, 7, 8, 100``: the
median of all ten is m = 4.5; Q1 = 2.25, Q3 = 6.75, IQR = 4.5, fences [-4.5, 13.5], so
100 is dropped; over 0..8, q1 = 2 and q3 = 6, w = 0.70 + 0.39/9, so the result is
``4.5 + w (4 - 4.5) = 4.12833`` (to 5 places). A skewed second coordinate ``0, 0, 0, 0,
0, 0, 1, 1, 2, 4``: m = 0; Q1 = 0, Q3 = 1, fences [-1.5, 2.5], 4 is dropped; over the
nine kept values q1 = 0, q3 = 1, so the result is ``(0.70 + 0.39/9) / 2 = 0.37167``. The client holding 100 in
the first coordinate and 4 in the second is fenced in both: fenced share 1, effective
weight 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aggregation.base import AggregationRule
from aggregation.ops import (
    block_columns,
    column_blocks,
    compute_dtype,
    order_kernels_for,
    point_shares,
    sort_columns,
)
from aggregation.registry import register_aggregator
from registry.constraints import Interval, allowed, check_fields

__all__ = ["EstimatedMean", "window_quantile"]


def window_quantile(ordered: Tensor, start: Tensor, count: Tensor, q: float) -> Tensor:
    """Linear-interpolation q-quantile of the window ``ordered[start : start + count]`` of
    each column of a sorted block ``(n, c)``; ``start``, ``count`` are (c,) with count >= 1."""
    position = start.to(ordered.dtype) + q * (count - 1).to(ordered.dtype)
    low = position.floor()
    high = torch.minimum(low + 1, (start + count - 1).to(ordered.dtype))
    below = ordered.gather(0, low.long()[None, :])[0]
    above = ordered.gather(0, high.long()[None, :])[0]
    return below + (position - low) * (above - below)


def _fixed_quantile(ordered: Tensor, q: float) -> Tensor:
    """Linear-interpolation q-quantile of every column of a sorted block ``(n, c)``: the
    same positions in every column, so plain row slices."""
    position = q * (ordered.shape[0] - 1)
    low = int(position)
    fraction = position - low
    if fraction == 0.0:
        return ordered[low]
    return ordered[low] + fraction * (ordered[low + 1] - ordered[low])


@register_aggregator("ema")
@dataclass(frozen=True, kw_only=True)
class EstimatedMean(AggregationRule):
    """IQR fences, then Luo et al.'s estimated mean from (q1, median, q3)."""

    k: float = field(default=1.5, metadata=allowed(Interval(float, 0)))  # fence width in IQRs

    def __post_init__(self) -> None:
        check_fields(self)

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        n, d = updates.shape
        kernels = order_kernels_for(updates)
        # On a CUDA GPU the result comes from one kernel pass; the sorts below then only
        # attribute it to the clients.
        out = torch.empty(d, dtype=updates.dtype, device=updates.device)
        if kernels is not None:
            out = kernels.estimated_mean(updates, self.k)
        dtype = compute_dtype(updates.dtype)
        weight = torch.zeros(n, dtype=torch.float64)
        fenced = torch.zeros(n, dtype=torch.float64)
        for columns in column_blocks(d, block_columns(updates, 10 * n * dtype.itemsize)):
            values = updates[:, columns].to(dtype)
            ordered = sort_columns(values)
            start, count = self._window(ordered)
            if kernels is None:
                out[columns] = self._estimate(ordered, start, count).to(updates.dtype)
            low = ordered.gather(0, start[None, :])
            high = ordered.gather(0, (start + count - 1)[None, :])
            fenced += ((values < low) | (values > high)).sum(dim=1).to("cpu", torch.float64)
            coefficients = self._coefficients(values, ordered, start, count)
            weight += coefficients.sum(dim=1).to("cpu", torch.float64)
        diagnostics = {"effective_weight": weight / d, "columns": {"fenced_share": fenced / d}}
        return out, diagnostics

    def _coefficients(
        self, values: Tensor, ordered: Tensor, start: Tensor, count: Tensor
    ) -> Tensor:
        """Each client's coefficient ``(n, c)`` in the estimate of each column."""
        w = 0.70 + 0.39 / count.to(ordered.dtype)
        coefficients = torch.zeros_like(values)
        everything = (torch.zeros_like(start), torch.full_like(count, ordered.shape[0]))
        for q, share, (first, size) in (
            (0.25, w / 2, (start, count)),
            (0.5, 1.0 - w, everything),  # the median of all values
            (0.75, w / 2, (start, count)),
        ):
            position = first.to(ordered.dtype) + q * (size - 1).to(ordered.dtype)
            low = position.floor()
            high = torch.minimum(low + 1, (first + size - 1).to(ordered.dtype))
            for index, part in ((low, 1.0 - (position - low)), (high, position - low)):
                point = ordered.gather(0, index.long()[None, :])[0]
                coefficients += point_shares(values, point) * (share * part)
        return coefficients

    def _window(self, ordered: Tensor) -> tuple[Tensor, Tensor]:
        """Per column, ``(start, count)`` of the sorted values inside the fences."""
        n, c = ordered.shape
        everything = torch.zeros(c, dtype=torch.long, device=ordered.device)
        all_n = torch.full((c,), n, dtype=torch.long, device=ordered.device)
        q1, q3 = (_fixed_quantile(ordered, q) for q in (0.25, 0.75))
        iqr = q3 - q1
        lower, upper = q1 - self.k * iqr, q3 + self.k * iqr
        # Rows from ceil((n-1)/4) on are >= Q1 >= lower, rows up to floor(3(n-1)/4) are
        # <= Q3 <= upper: only the outer quarters need comparing.
        below = math.ceil(0.25 * (n - 1))
        inside = math.floor(0.75 * (n - 1)) + 1
        start = (ordered[:below] < lower).sum(dim=0, dtype=torch.int32).long()
        count = inside + (ordered[inside:] <= upper).sum(dim=0, dtype=torch.int32).long() - start
        empty = count == 0
        return torch.where(empty, everything, start), torch.where(empty, all_n, count)

    def _estimate(self, ordered: Tensor, start: Tensor, count: Tensor) -> Tensor:
        """Luo et al.'s estimate: the median of every value of each column, the quartiles of
        its kept values ``[start, start + count)``."""
        kept_q1 = window_quantile(ordered, start, count, 0.25)
        median = _fixed_quantile(ordered, 0.5)
        kept_q3 = window_quantile(ordered, start, count, 0.75)
        w = 0.70 + 0.39 / count.to(ordered.dtype)
        return median + w * ((kept_q1 + kept_q3) / 2 - median)
