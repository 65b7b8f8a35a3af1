"""FedAvg: the sample-weighted mean of client updates.

McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from
Decentralized Data" (https://arxiv.org/abs/1602.05629). ``weights`` are the clients'
sample counts, normalised to sum to one; equal weights when None. Diagnostics:
``effective_weight`` = the normalised weights (exact: ``effective_weight @ updates``).

Example: updates ``[[0, 2], [4, 6]]`` with weights ``[1, 3]`` -> ``[3, 5]`` (effective
weights ``[0.25, 0.75]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aggregation.base import AggregationRule, normalised_weights
from aggregation.registry import register_aggregator

__all__ = ["FedAvg"]


@register_aggregator("fedavg")
@dataclass(frozen=True, kw_only=True)
class FedAvg(AggregationRule):
    """Weighted mean; shapes ``(n, d), (n,) -> (d,)``."""

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        w = normalised_weights(updates, weights)
        return w @ updates, {"effective_weight": w.to("cpu", torch.float64), "columns": {}}
