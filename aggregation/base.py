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

A filter runs in front of any aggregator and decides which clients to keep:
``step(state, updates, client_ids, weights) -> (FilterDecision, new_state)``. Client
history is keyed by ``client_ids`` (stable ids), never by the row order of ``updates``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "AggregationRule",
    "Filter",
    "FilterDecision",
    "check_updates",
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


class AggregationRule:
    """Base for rules. Stateless rules implement :meth:`aggregate`; stateful ones override
    :meth:`init_state` and :meth:`step`. Subclasses are frozen dataclasses holding only
    hyperparameters, validated in ``__post_init__``."""

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
