"""Norm-bounded size-weighted averaging.

Sun, Kairouz, Suresh, McMahan 2019, "Can You Really Backdoor Federated Learning?"
(https://arxiv.org/abs/1911.07963), norm thresholding: every update is scaled into the
ball of radius M, ``x_i * min(1, M / ||x_i||)``, and the scaled updates are averaged with
the clients' weights (sample counts, normalised; equal when None), as FedAvg does:

    out = sum_i w_i min(1, M / ||x_i||) x_i

It keeps FedAvg's respect for site sizes while bounding how far any one client can pull
the model: a client of weight w_i moves it by at most ``w_i M``. The paper fixes M; with
``max_norm=None`` (default) M is the median of the round's update norms, so at most half
the clients are scaled and no constant needs tuning to the model's update scale.

Parameters: ``max_norm: float | None = None`` (> 0; None: the median norm). Shapes:
``(n, d), (n,) | None -> (d,)``. Diagnostics: ``effective_weight`` (n,) the coefficients
``w_i min(1, M / ||x_i||)`` (exact: ``effective_weight @ updates``; they sum to less than
1 when a client was scaled), ``columns["clip_factor"]`` and ``columns["norm"]``, and the
scalar ``max_norm`` (the M used).

Example (max_norm = 1): updates ``[[0.6, 0], [0, 0.8], [3, 4]]`` with weights ``[1, 2,
1]``: norms 0.6, 0.8, 5; the third is scaled by 1/5 to ``[0.6, 0.8]``; the result is
``(1 * [0.6, 0] + 2 * [0, 0.8] + 1 * [0.6, 0.8]) / 4 = [0.3, 0.6]``, coefficients
``[0.25, 0.5, 0.05]``. With the median norm (M = 0.8) the third is scaled by 0.16 to
``[0.48, 0.64]`` and the result is ``[0.27, 0.56]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aggregation.base import AggregationRule, normalised_weights
from aggregation.ops import row_products
from aggregation.registry import register_aggregator
from registry.constraints import POSITIVE, allowed, check_fields

__all__ = ["NormBoundedMean", "clip_factors"]


def clip_factors(norms: Tensor, bound: float) -> Tensor:
    """``min(1, bound / norm)`` per row (1 for a zero row)."""
    return (bound / norms).clamp(max=1.0).nan_to_num(nan=1.0)


@register_aggregator("norm_bounded_mean")
@dataclass(frozen=True, kw_only=True)
class NormBoundedMean(AggregationRule):
    """Size-weighted mean of the updates scaled into a ball of radius M."""

    # M; None: the median norm of the round's updates
    max_norm: float | None = field(default=None, metadata=allowed(POSITIVE, None))

    def __post_init__(self) -> None:
        check_fields(self)

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        w = normalised_weights(updates, weights).to("cpu", torch.float64)
        _, squares = row_products(updates)
        norms = squares.sqrt()
        bound = float(norms.quantile(0.5)) if self.max_norm is None else self.max_norm
        factors = clip_factors(norms, bound)
        coefficients = w * factors
        diagnostics = {
            "effective_weight": coefficients,
            "columns": {"clip_factor": factors, "norm": norms},
            "max_norm": bound,
        }
        return coefficients.to(updates) @ updates, diagnostics
