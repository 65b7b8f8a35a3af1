"""Chaining pre-aggregators in front of a rule, and tracing every effect to the clients.

:func:`preaggregate` runs a list of pre-aggregators in order (any number, any order) and
composes their mixing matrices, so that the rows handed to the rule are ``mixing @
updates`` with ``mixing`` ``(m, n)`` over the round's clients. :func:`client_columns`
then turns a rule's diagnostics (indexed by those m rows) into per-client values:

- ``effective_weight``: ``rule_weight @ mixing`` (exact for rules that output a weighted
  mean of their rows: ``effective_weight @ updates == result``);
- every column of a rule or pre-aggregator (indexed by the rows it saw): for each client
  the average of the values of the rows it went into, weighted by its coefficient in
  them (exact where each client went into one row: clipping, ARC, Bucketing);
- ``selected``: 1 for clients in a selected row, else 0.

Column names are ``<pre-aggregator>.<column>`` (``clip.clip_factor``), with ``#2``, ``#3``
after the name for a repeated pre-aggregator; the rule's columns keep their names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aggregation.base import Diagnostics, PreAggregator, State, check_updates
from aggregation.registry import preaggregator_name

__all__ = ["Chain", "client_columns", "preaggregate", "through"]


@dataclass
class Chain:
    """The result of a chain of pre-aggregators over the round's ``n`` clients.

    ``rows`` ``(m, d)`` and ``weights`` ``(m,)`` for the rule; ``mixing`` float64 ``(m,
    n)`` on the CPU (``rows == mixing @ updates``); ``row_ids``: the client id (the input
    row when no ids were given) each row stands for where every stage keeps rows, else
    None (rows are buckets; rules needing client ids cannot follow); ``columns``: per-client float64 ``(n,)`` values of every stage;
    ``info``: every stage's scalars (``<name>.<key>``); ``dropped_non_finite``: client rows
    left out for holding NaN or Inf.
    """

    rows: Tensor
    weights: Tensor | None
    mixing: Tensor
    row_ids: tuple[int, ...] | None
    columns: dict[str, Tensor] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    dropped_non_finite: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))


def through(values: Tensor, mixing: Tensor) -> Tensor:
    """Per-client values ``(n,)`` from per-row values ``(m,)`` of rows made by ``mixing``
    ``(m, n)``: each client's average over the rows it went into, weighted by its
    coefficients there (NaN for a client in no row)."""
    coefficients = mixing.abs()
    known = torch.isfinite(values)
    total = coefficients[known].sum(dim=0)
    weighted = values[known].to(torch.float64) @ coefficients[known]
    return torch.where(total > 0, weighted / total.clamp_min(1e-300), torch.nan)


def _labels(preaggregators: Sequence[PreAggregator]) -> list[str]:
    """``name``, ``name#2``, ... for each pre-aggregator of the chain."""
    seen: dict[str, int] = {}
    labels = []
    for preaggregator in preaggregators:
        name = preaggregator_name(preaggregator)
        seen[name] = seen.get(name, 0) + 1
        labels.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return labels


def preaggregate(
    preaggregators: Sequence[PreAggregator],
    states: Sequence[State],
    updates: Tensor,
    weights: Tensor | None = None,
    *,
    client_ids: Sequence[int] | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Chain, list[State]]:
    """Run ``preaggregators`` in order on the round's updates ``(n, d)``; ``states`` are
    theirs (one each); ``generator`` is shared by the stages that draw (in chain order).
    Returns the chain's result and the new states."""
    check_updates(updates, weights)
    n = updates.shape[0]
    if len(states) != len(preaggregators):
        raise ValueError(f"preaggregate got {len(states)} states for {len(preaggregators)} stages")
    ids = tuple(range(n)) if client_ids is None else tuple(int(i) for i in client_ids)
    chain = Chain(updates, weights, torch.eye(n, dtype=torch.float64), ids)
    new_states = []
    for label, stage, state in zip(_labels(preaggregators), preaggregators, states, strict=True):
        done, new_state = stage.step(state, chain.rows, chain.weights, generator=generator)
        new_states.append(new_state)
        for name, values in done.columns.items():
            chain.columns[f"{label}.{name}"] = through(values, chain.mixing)
        chain.info |= {f"{label}.{key}": value for key, value in done.info.items()}
        if not chain.dropped_non_finite.numel():
            chain.dropped_non_finite = done.dropped_non_finite
        rows_ids = chain.row_ids
        chain.row_ids = None
        if rows_ids is not None and done.row_of is not None:
            chain.row_ids = tuple(rows_ids[i] for i in done.row_of.tolist())
        chain.rows, chain.weights = done.rows, done.weights
        chain.mixing = done.mixing @ chain.mixing
    return chain, new_states


def client_columns(diagnostics: Diagnostics, mixing: Tensor | None = None) -> dict[str, Tensor]:
    """A rule's per-row diagnostics as per-client float64 ``(n,)`` values (see the module
    docstring); ``mixing`` ``(m, n)`` from :func:`preaggregate` (identity when None)."""
    weight = torch.as_tensor(diagnostics["effective_weight"]).to(torch.float64)
    if mixing is None:
        mixing = torch.eye(weight.numel(), dtype=torch.float64)
    out = {"effective_weight": weight @ mixing}
    if "selected" in diagnostics:
        chosen = torch.zeros(mixing.shape[0], dtype=torch.float64)
        chosen[torch.as_tensor(diagnostics["selected"]).cpu()] = 1.0
        out["selected"] = ((chosen @ mixing.abs()) > 0).to(torch.float64)
    for name, values in diagnostics.get("columns", {}).items():
        out[name] = through(torch.as_tensor(values).cpu(), mixing)
    return out
