"""Centered clipping (CC).

Karimireddy, He, Jaggi 2021, "Learning from History for Byzantine Robust Optimization"
(ICML, https://proceedings.mlr.press/v139/karimireddy21a.html), the CC rule.
Starting from the previous round's aggregate ``v`` (the rule's state; zero in the first
round, as in the authors' code), each of ``n_iter`` iterations moves ``v`` by the mean of
the clipped differences:

    v <- v + (1/n) * sum_i (x_i - v) * min(1, tau / ||x_i - v||)

and the final ``v`` is the aggregate and the next round's center. The paper pairs CC with
worker momentum (clients send momentum vectors); that belongs to the client side. Client
weights are ignored (the paper's rule is unweighted).

State (kept in the open, checkpointable): ``{"center": Tensor (d,) | None}``.

Parameters: ``tau: float = 10.0`` (clipping radius, > 0, in update units: tune it to the
norm of honest updates; 10 is the usual default of public implementations),
``n_iter: int = 1`` (>= 1; the authors' reference code uses 1, the paper's analysis
allows more). Shapes: ``(n, d), (n,) | None -> (d,)``.

Diagnostics: ``columns["clip_factor"]`` float64 (n,), the factor ``min(1, tau / ||x_i -
v||)`` of the last iteration (``columns["distance"]`` the distance it came from);
``effective_weight`` (n,): the coefficients c with ``result = a * previous_center + c @
updates`` (exact; each iteration maps ``c -> (1 - mean(s)) c + s / n``, so they sum to
``1 - a``, less than 1 when clipping kept the center back; the center's own share ``a``
is ``diagnostics["center_weight"]``).

Example (tau = 1, n_iter = 1, center 0): updates ``[[0.5, 0], [0, 0.5], [4, 3]]``:
the first two are inside the ball and kept, the third (norm 5) is scaled by 1/5 to
``[0.8, 0.6]``; the mean is ``[(0.5 + 0.8) / 3, (0.5 + 0.6) / 3] = [0.4333, 0.3667]``.
Clip factors ``[1, 1, 0.2]``, effective weights ``[1/3, 1/3, 0.2/3]``, center weight
``1 - 2.2/3 = 0.2667``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aggregation.base import AggregationRule, RoundInputs, State
from aggregation.ops import block_columns, column_blocks, compute_dtype
from aggregation.registry import register_aggregator
from registry.constraints import POSITIVE, Interval, allowed, check_fields

__all__ = ["CenteredClipping", "distances_to"]


def distances_to(updates: Tensor, center: Tensor) -> Tensor:
    """Euclidean distances ``(n,)`` float64 from every row to ``center`` (d,), computed
    from the differences block by block (exact, no Gram cancellation)."""
    n, d = updates.shape
    dtype = compute_dtype(updates.dtype)
    squared = torch.zeros(n, dtype=torch.float64, device=updates.device)
    block = block_columns(updates, 2 * n * dtype.itemsize)
    for columns in column_blocks(d, block):
        diff = updates[:, columns].to(dtype) - center[columns].to(dtype)
        squared += diff.square().sum(dim=1).to(torch.float64)
    return squared.sqrt()


@register_aggregator("centered_clipping")
@dataclass(frozen=True, kw_only=True)
class CenteredClipping(AggregationRule):
    """Iterative clipping around the previous aggregate."""

    # clipping radius
    tau: float = field(default=10.0, metadata=allowed(POSITIVE))
    n_iter: int = field(default=1, metadata=allowed(Interval(int, 1)))  # iterations per round

    def __post_init__(self) -> None:
        check_fields(self)

    def init_state(self) -> State:
        return {"center": None}

    def advance(
        self, state: State, updates: Tensor, weights: Tensor | None, inputs: RoundInputs
    ) -> tuple[Tensor, State, dict[str, Any]]:
        n, d = updates.shape
        previous = state.get("center")
        if previous is None:
            center = torch.zeros(d, dtype=updates.dtype, device=updates.device)
        elif previous.shape != (d,):
            raise ValueError(
                f"centered_clipping state holds a center of shape {tuple(previous.shape)} "
                f"but the updates have {d} parameters (a state from another model?)"
            )
        else:
            center = previous.to(device=updates.device, dtype=updates.dtype)
        weight = torch.zeros(n, dtype=torch.float64)  # of the clients in the center
        center_weight = 1.0  # of the previous center in the center
        for _ in range(self.n_iter):
            dist = distances_to(updates, center)
            scales = (self.tau / dist).clamp(max=1.0)  # 1 where dist == 0 (tau / 0 = inf)
            # v + (1/n) sum_i s_i (x_i - v) = (1 - mean(s)) v + (s / n) @ x
            coefficients = (scales / n).to(device=updates.device, dtype=updates.dtype)
            keep = 1.0 - float(scales.mean())
            center = keep * center + coefficients @ updates
            weight = keep * weight + (scales / n).cpu()
            center_weight *= keep
        diagnostics = {
            "effective_weight": weight,
            "center_weight": center_weight,
            "columns": {"clip_factor": scales.cpu(), "distance": dist.cpu()},
        }
        return center, {"center": center.clone()}, diagnostics
