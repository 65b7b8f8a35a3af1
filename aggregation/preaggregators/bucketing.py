"""Bucketing (a pre-aggregator).

Karimireddy, He, Jaggi 2022, "Byzantine-Robust Learning on Heterogeneous Datasets via
Bucketing" (ICLR, https://arxiv.org/abs/2006.09365), as ByzFL's ``Bucketing`` defines it:
the updates are shuffled by a random permutation pi and cut into buckets of s
consecutive updates (the last one smaller when s does not divide n); each bucket is
replaced by the plain mean of its updates:

    Bucketing_s(x_1, ..., x_n) = (mean(x_pi(1..s)), mean(x_pi(s+1..2s)), ...),

``m = ceil(n / s)`` rows in all. Averaging s random updates shrinks the honest spread the
rule sees, so robust rules keep their guarantees under heterogeneity.

Randomness: ``step(..., generator=...)`` draws the permutation (``torch.randperm`` on that
CPU generator); the server seeds it per round. Calling with s > 1 and no generator raises;
with s = 1 the rows are kept in order (ByzFL shuffles them, which order-free rules do not
notice). The buckets follow the rows' order, so the same seed with the clients in another
order gives other buckets.

Weights: each bucket weighs the sum of its clients' weights (its mean itself is
unweighted, as in the paper). ``keeps_rows = False``: rows are buckets, not clients.

Parameters: ``s: int = 1`` (>= 1, ByzFL's default). Shapes: ``(n, d) -> (ceil(n/s), d)``;
``mixing`` ``(m, n)`` has ``1 / |bucket|`` on each bucket's clients. Columns: ``bucket``
(the index of the client's bucket); ``info["buckets"]`` m.

Example (s = 2): updates ``[[1, 2, 3], [4, 5, 6], [7, 8, 9]]`` and the permutation (2, 0,
1): buckets {2, 0} and {1}, rows ``[[4, 5, 6], [4, 5, 6]]`` (ByzFL's numpy example); with
(1, 2, 0): buckets {1, 2} and {0}, rows ``[[5.5, 6.5, 7.5], [1, 2, 3]]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from aggregation.base import (
    PreAggregation,
    PreAggregator,
    Rng,
    State,
    Transformed,
    Weights,
)
from aggregation.registry import register_preaggregator
from registry.constraints import Interval, allowed, check_fields

__all__ = ["Bucketing", "bucket_mixing"]


def bucket_mixing(order: Tensor, s: int) -> Tensor:
    """``(ceil(n/s), n)`` float64: bucket j averages ``order[j*s : (j+1)*s]``."""
    n = order.numel()
    mixing = torch.zeros(math.ceil(n / s), n, dtype=torch.float64)
    for j, start in enumerate(range(0, n, s)):
        members = order[start : start + s]
        mixing[j, members] = 1.0 / members.numel()
    return mixing


@register_preaggregator("bucketing")
@dataclass(frozen=True, kw_only=True)
class Bucketing(PreAggregator):
    """Means of s randomly grouped updates."""

    keeps_rows: ClassVar[bool] = False

    s: int = field(default=1, metadata=allowed(Interval(int, 1)))  # updates per bucket

    def __post_init__(self) -> None:
        check_fields(self)

    def transform(self, state: State, updates: Tensor, weights: Weights, rng: Rng) -> Transformed:
        n = updates.shape[0]
        if self.s == 1:
            order = torch.arange(n)
        elif rng is None:
            raise TypeError(
                "bucketing draws a random permutation: call step(state, updates, weights, "
                "generator=torch.Generator().manual_seed(seed)) with the round's seed"
            )
        else:
            order = torch.randperm(n, generator=rng)
        mixing = bucket_mixing(order, self.s)
        bucket = torch.empty(n, dtype=torch.float64)
        bucket[order] = (torch.arange(n) // self.s).to(torch.float64)
        member = (mixing > 0).to(updates)
        result = PreAggregation(
            rows=mixing.to(updates) @ updates,
            weights=None if weights is None else member @ weights.to(updates),
            mixing=mixing,
            row_of=None,
            columns={"bucket": bucket},
            info={"buckets": mixing.shape[0]},
        )
        return result, state
