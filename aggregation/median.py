"""Coordinate-wise median.

Yin, Chen, Kannan, Bartlett 2018, "Byzantine-Robust Distributed Learning: Towards
Optimal Statistical Rates" (https://arxiv.org/abs/1803.01498), Definition 1. For each
parameter k, ``out[k] = median(updates[0, k], ..., updates[n-1, k])``; with an even
number of clients, the mean of the two middle values. Client weights are ignored (the
rule is unweighted, and a Byzantine client could inflate a reported sample count).

Shapes: ``(n, d), (n,) | None -> (d,)``.

Example: updates ``[[1, 10], [2, 30], [9, 20], [4, 40]]`` -> ``[3, 25]``
(column 0 sorted is 1, 2, 4, 9: (2 + 4) / 2 = 3; column 1: (20 + 30) / 2 = 25).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aggregation.base import AggregationRule
from aggregation.ops import (
    block_columns,
    column_blocks,
    compute_dtype,
    order_kernels_for,
    sort_columns,
)
from aggregation.registry import register_aggregator

__all__ = ["Median", "sorted_median"]


def sorted_median(sorted_block: Tensor) -> Tensor:
    """Median of each column of an already sorted block ``(n, c) -> (c,)``."""
    n = sorted_block.shape[0]
    if n % 2 == 1:
        return sorted_block[n // 2].clone()
    return sorted_block[n // 2 - 1] * 0.5 + sorted_block[n // 2] * 0.5


@register_aggregator("median")
@dataclass(frozen=True, kw_only=True)
class Median(AggregationRule):
    """Coordinate-wise median; no hyperparameters."""

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        kernels = order_kernels_for(updates)
        if kernels is not None:  # one pass on a CUDA GPU
            return kernels.median(updates), {}
        n, d = updates.shape
        dtype = compute_dtype(updates.dtype)
        out = torch.empty(d, dtype=updates.dtype, device=updates.device)
        block = block_columns(updates, 4 * n * dtype.itemsize)
        for columns in column_blocks(d, block):
            ordered = sort_columns(updates[:, columns].to(dtype))
            out[columns] = sorted_median(ordered).to(updates.dtype)
        return out, {}
