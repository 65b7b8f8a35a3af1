"""FLTrust: trust bootstrapped from the server's own update.

Cao, Fang, Liu, Gong 2021, "FLTrust: Byzantine-robust Federated Learning via Trust
Bootstrapping" (NDSS, https://arxiv.org/abs/2012.13995), Algorithm 1 / Eq. (2)-(4). The
server trains on a small clean root dataset of its own and obtains its update g_0 each
round; then for every client update g_i:

- trust score ``TS_i = ReLU(cos(g_i, g_0))`` (a client pointing away from the server's
  direction gets no trust);
- magnitude normalisation ``g_i' = (||g_0|| / ||g_i||) g_i`` (no client can weigh in by
  sheer size);
- aggregate ``sum_i TS_i g_i' / sum_i TS_i``; when every trust score is 0 the update is
  zero (the paper's formula is undefined there; nothing is trusted).

The seam with the server loop. ``requires_reference = True``: the server passes
``step(state, updates, weights, reference=g_0)`` where ``g_0`` ``(d,)`` is its update from
the root data, made exactly as a client makes its update (same starting model, local
optimiser, epochs and sign convention: model delta ``w_local - w_global``). The root data
is a small seeded slice held by the server (the paper uses 100 examples), stated in the
run's params and excluded from every client's data. A zero or non-finite reference
raises. Client weights (sample counts) are ignored, as in the paper.

Shapes: ``(n, d), (n,) | None -> (d,)``. Diagnostics: ``columns["trust_score"]`` TS_i,
``columns["norm_scale"]`` ``||g_0|| / ||g_i||`` (0 for a zero update), and
``effective_weight`` ``TS_i ||g_0|| / (||g_i|| sum_j TS_j)``, the coefficients of the
updates in the result (exact: ``effective_weight @ updates``; they do not sum to 1, since
every update is rescaled).

Example: reference ``g_0 = [1, 0]``; updates ``[[2, 0], [1, 1], [-3, 0]]``. Cosines 1,
0.7071, -1, so trust scores ``[1, 0.7071, 0]``; rescaled to norm 1: ``[1, 0]``,
``[0.7071, 0.7071]``, ``[-1, 0]``. The result is ``([1, 0] + 0.7071 [0.7071, 0.7071]) /
1.7071 = [0.8787, 0.2929]``; effective weights ``[0.2929, 0.2929, 0]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from aggregation.base import AggregationRule, RoundInputs, State, required
from aggregation.ops import row_products
from aggregation.registry import register_aggregator

__all__ = ["FLTrust"]


@register_aggregator("fltrust")
@dataclass(frozen=True, kw_only=True)
class FLTrust(AggregationRule):
    """Trust-weighted mean of the updates rescaled to the server update's norm."""

    requires_reference: ClassVar[bool] = True

    def advance(
        self, state: State, updates: Tensor, weights: Tensor | None, inputs: RoundInputs
    ) -> tuple[Tensor, State, dict[str, Any]]:
        meaning = "the server's own update from its root data, shape (d,)"
        reference = required(inputs.reference, "fltrust", "reference", meaning)
        dots, squares = row_products(updates, reference)
        _, reference_square = row_products(reference[None, :])
        if float(reference_square) == 0.0:
            raise ValueError(
                "fltrust's reference (the server's update) is zero: no direction to trust "
                "(did the server train on its root data this round?)"
            )
        norms, reference_norm = squares.sqrt(), float(reference_square.sqrt())
        cosine = (dots / (norms * reference_norm)).nan_to_num(nan=0.0)
        trust = cosine.clamp_min(0.0)
        scale = (reference_norm / norms).nan_to_num(nan=0.0, posinf=0.0)
        total = float(trust.sum())
        weight = trust * scale / total if total > 0 else torch.zeros_like(trust)
        diagnostics = {
            "effective_weight": weight,
            "columns": {"trust_score": trust, "norm_scale": scale},
        }
        return weight.to(updates) @ updates, state, diagnostics
