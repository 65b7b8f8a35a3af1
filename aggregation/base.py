"""Contracts shared by every aggregation rule and every filter.

An aggregation rule maps stacked client updates ``(n_clients, n_params)`` and optional
client weights ``(n_clients,)`` to one update ``(n_params,)``. Every rule exposes the
same three calls, so the server loop never needs to know which kind it holds:

- ``init_state() -> dict``: the rule's memory (empty for stateless rules). Holds only
  tensors and plain Python values so it can be checkpointed with
  ``torch.save``/``torch.load(weights_only=True)``.
- ``step(state, updates, weights) -> (result, new_state, diagnostics)``: one round. Never
  mutates ``state`` in place. ``diagnostics`` is a plain dict (e.g. ``{"selected":
  LongTensor}`` for selection rules such as Krum) for the exclusion trail.
- ``__call__(updates, weights=None) -> result``: stateless convenience, a ``step`` from a
  fresh state.

Rules whose class sets ``requires_oracle = True`` (Zeno) also need the model and a loss:
their ``step`` takes a keyword-only ``oracle`` (see ``aggregation.zeno``) that the server
loop supplies. Updates holding NaN or Inf never reach a rule: the server drops them first
with :func:`drop_non_finite`.

A filter runs in front of any aggregator and decides which clients to keep:
``step(state, updates, client_ids, weights) -> (FilterDecision, new_state)``. Client
history is keyed by ``client_ids`` (stable ids), never by the row order of ``updates``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

__all__ = [
    "AggregationRule",
    "Filter",
    "FilterDecision",
    "check_updates",
    "drop_non_finite",
    "normalised_weights",
]

State = dict[str, Any]


def check_updates(updates: Tensor, weights: Tensor | None) -> None:
    """Validate shapes of a rule's inputs (a programming error, not a data condition)."""
    if updates.ndim != 2:
        raise ValueError(
            f"updates must be 2-D (n_clients, n_params), got shape {tuple(updates.shape)}"
        )
    if updates.shape[0] == 0:
        raise ValueError("updates holds no clients (n_clients = 0)")
    if weights is not None and weights.shape != (updates.shape[0],):
        raise ValueError(
            f"weights must have shape ({updates.shape[0]},) to match updates, got {tuple(weights.shape)}"
        )


def normalised_weights(updates: Tensor, weights: Tensor | None) -> Tensor:
    """Client weights as a probability vector on the updates' device and dtype (equal when None)."""
    n = updates.shape[0]
    if weights is None:
        return torch.full((n,), 1.0 / n, device=updates.device, dtype=updates.dtype)
    w = weights.to(device=updates.device, dtype=updates.dtype)
    if bool((w < 0).any()) or not bool(torch.isfinite(w).all()):
        raise ValueError("weights must be finite and non-negative")
    total = w.sum()
    if float(total) <= 0:
        raise ValueError("weights sum to zero")
    return w / total


def drop_non_finite(
    updates: Tensor, weights: Tensor | None
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Remove the clients whose update (or weight) holds a NaN or an Inf.

    Returns ``(updates, weights, keep)`` with ``keep`` a bool ``(n_clients,)`` mask on the
    updates' device (True = kept; record the others with reason ``non_finite``). When every
    client is kept the inputs are returned as they are (no copy). The check walks the
    parameters in blocks, so it needs O(n·block) scratch memory, not O(n·d).
    """
    check_updates(updates, weights)
    n, d = updates.shape
    keep = torch.ones(n, dtype=torch.bool, device=updates.device)
    block = max(1, (1 << 24) // n)
    for start in range(0, d, block):
        keep &= torch.isfinite(updates[:, start : start + block]).all(dim=1)
    if weights is not None:
        keep &= torch.isfinite(weights).to(updates.device)
    if bool(keep.all()):
        return updates, weights, keep
    kept_weights = None if weights is None else weights[keep.to(weights.device)]
    return updates[keep], kept_weights, keep


class AggregationRule:
    """Base for rules. Stateless rules implement :meth:`aggregate`; stateful ones override
    :meth:`init_state` and :meth:`step`. Subclasses are frozen dataclasses holding only
    hyperparameters, validated in ``__post_init__``."""

    # True for rules that score updates with the model and a loss (Zeno): their ``step``
    # takes a keyword-only ``oracle`` that only the server loop can provide.
    requires_oracle: ClassVar[bool] = False

    def init_state(self) -> State:
        return {}

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        """Return ``(result, diagnostics)`` for one round. Override in stateless rules."""
        raise NotImplementedError

    def step(
        self, state: State, updates: Tensor, weights: Tensor | None = None
    ) -> tuple[Tensor, State, dict[str, Any]]:
        check_updates(updates, weights)
        result, diagnostics = self.aggregate(updates, weights)
        return result, state, diagnostics

    def __call__(self, updates: Tensor, weights: Tensor | None = None) -> Tensor:
        result, _, _ = self.step(self.init_state(), updates, weights)
        return result


@dataclass
class FilterDecision:
    """What a filter decided this round, per submitted client (rows of ``updates``).

    ``keep``: bool ``(n_clients,)``; ``scores``: the statistic compared to ``threshold``
    (None when the filter has no scalar score); ``reason``: the exclusion reason recorded
    in the trail for dropped clients; ``columns``: further per-client values for the trail
    (e.g. PID-MADE's distance and P/I/D terms), each a tensor ``(n_clients,)``.
    """

    keep: Tensor
    reason: str
    scores: Tensor | None = None
    threshold: float | None = None
    columns: dict[str, Tensor] = field(default_factory=dict)


class Filter:
    """Base for filters (exclusion steps in front of an aggregator)."""

    def init_state(self) -> State:
        return {}

    def step(
        self,
        state: State,
        updates: Tensor,
        client_ids: Sequence[int],
        weights: Tensor | None = None,
    ) -> tuple[FilterDecision, State]:
        raise NotImplementedError
