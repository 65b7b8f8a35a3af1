"""MoNNA: the mean of the nearest neighbours of a trusted anchor.

Farhadkhani, Guerraoui, Gupta, Hoang, Pinot, Stephan 2023, "Robust Collaborative
Learning with Linear Gradient Overhead" (ICML, https://proceedings.mlr.press/v202/farhadkhani23a.html),
MoNNA: the mean of the ``n - f`` updates nearest (Euclidean) to a vector known to be
correct. Client weights are ignored (unweighted rule).

The anchor. In the paper (peer-to-peer learning) each honest node anchors on its own
vector, and ByzFL's ``MoNNA`` takes a row index ``idx`` of a vector known to be correct.
A federated server has no such row, so the anchor is chosen by ``anchor``:

- ``"median"`` (default): the coordinate-wise median of the round's updates, which lies
  among the honest values per coordinate while the Byzantine clients are a minority;
- ``"reference"``: the server's own update from its root data (as FLTrust's), passed as
  ``step(..., reference=...)``; the rule then has ``requires_reference`` set.

Equal distances to the anchor are ordered by the rows' norms, then by row.

Parameters: ``f: int`` (>= 0, required), ``anchor: str = "median"`` (``median`` |
``reference``). Needs ``n > 2f`` (checked at call time). Shapes: ``(n, d), (n,) | None
-> (d,)``. Diagnostics: ``selected`` (the n - f rows averaged, ascending),
``effective_weight`` 1/(n - f) on them (exact), ``columns["anchor_distance"]``.

Example (f = 1): updates ``[[0, 0], [1, 0], [0, 1], [5, 5]]``. The coordinate-wise
median is ``[0.5, 0.5]``; rows 0-2 are sqrt(0.5) = 0.707 from it and row 3 sqrt(40.5) =
6.364, so MoNNA averages rows 0-2: ``[1/3, 1/3]``. With ``anchor="reference"`` and the
reference ``[4, 4]``, the distances are 5.657, 5, 5 and 1.414: rows 1-3 are averaged,
``[2, 2]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aggregation.base import (
    AggregationRule,
    RoundInputs,
    State,
    check_minority,
    required,
    row_mean,
)
from aggregation.centered_clipping import distances_to
from aggregation.median import coordinate_median
from aggregation.ops import ranking
from aggregation.registry import register_aggregator
from registry.constraints import Interval, Options, allowed, check_fields

__all__ = ["MoNNA"]

_ANCHORS = ("median", "reference")


@register_aggregator("monna")
@dataclass(frozen=True, kw_only=True)
class MoNNA(AggregationRule):
    """Mean of the ``n - f`` updates nearest to the anchor."""

    # Byzantine clients tolerated (updates left out)
    f: int = field(metadata=allowed(Interval(int, 0)))
    # median | reference (the server's own update)
    anchor: str = field(default="median", metadata=allowed(Options(_ANCHORS)))

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def requires_reference(self) -> bool:  # type: ignore[override]
        return self.anchor == "reference"

    def advance(
        self, state: State, updates: Tensor, weights: Tensor | None, inputs: RoundInputs
    ) -> tuple[Tensor, State, dict[str, Any]]:
        n = updates.shape[0]
        check_minority("monna", n, self.f)
        if self.anchor == "reference":
            meaning = "the server's own update from its root data, shape (d,)"
            center = required(inputs.reference, "monna (anchor=reference)", "reference", meaning)
        else:
            center = coordinate_median(updates)
        distance = distances_to(updates, center.to(updates)).cpu()
        norms = torch.linalg.vector_norm(updates, dim=1).to("cpu", torch.float64)
        selected = torch.sort(ranking(distance, norms)[: n - self.f]).values
        result, weight = row_mean(updates, selected)
        diagnostics = {
            "selected": selected,
            "effective_weight": weight,
            "columns": {"anchor_distance": distance},
        }
        return result, state, diagnostics
