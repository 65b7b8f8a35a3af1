"""The server's defence on one round's updates, each step written once: the filters in
order (:func:`run_filters`), then the pre-aggregators and the rule (:func:`run_rule`).

The round (``federated.server``), the optimising attacker's model of the defence
(Opt-ALIE, Opt-IPM) and the preflight probe call these, so what a rule is given (the
pre-aggregated rows, their client ids, the oracle or reference it needs) cannot drift
apart between them. Pure functions: states in, states out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aggregation.base import (
    AggregationRule,
    Filter,
    FilterDecision,
    PreAggregator,
    State,
    Validate,
)
from aggregation.preaggregators import client_columns, preaggregate

__all__ = ["FilterStep", "Rows", "RuleOutcome", "run_filters", "run_rule"]


@dataclass(frozen=True)
class Rows:
    """A round's rows as the rule receives them: updates ``(n, d)``, weights ``(n,)``, the
    client id of each row and, for FedNova, each row's ‖a_i‖₁ ``(n,)`` (its local work),
    for AFL each row's client's loss of the global model ``(n,)``."""

    updates: Tensor
    weights: Tensor
    ids: Sequence[int]
    local_norms: Tensor | None = None
    losses: Tensor | None = None


@dataclass(frozen=True)
class FilterStep:
    """One filter's decision on the round's rows at ``positions`` (those still kept)."""

    positions: Tensor
    decision: FilterDecision


def run_filters(
    filters: Sequence[Filter],
    states: Sequence[State],
    updates: Tensor,
    weights: Tensor,
    ids: Sequence[int],
    keep: Tensor,
    *,
    validate: Validate | None = None,
) -> tuple[list[FilterStep], list[State]]:
    """Each filter in order on the rows still kept (``keep``, bool ``(n,)``, is updated in
    place): what each decided, and the filters' new states. A filter left no row to judge
    is not stepped; its state is kept. ``validate``: the sites' held-out losses of
    candidate updates, for a filter that ``requires_validation``."""
    steps: list[FilterStep] = []
    new_states = list(states)
    for index, flt in enumerate(filters):
        positions = keep.nonzero().flatten()
        if len(positions) == 0:
            break
        extra = {"validate": validate} if flt.requires_validation else {}
        decision, new_states[index] = flt.step(
            new_states[index], updates[positions], [ids[p] for p in positions.tolist()],
            weights[positions], **extra,
        )  # fmt: skip
        keep[positions[~decision.keep.to(keep.device)]] = False
        steps.append(FilterStep(positions, decision))
    return steps, new_states


@dataclass(frozen=True)
class RuleOutcome:
    """The aggregate, the rule's and the pre-aggregators' new states, and per-client
    values for the trail (effective weight, the rule's and every pre-aggregator's
    columns)."""

    aggregate: Tensor
    rule_state: State
    preaggregator_states: list[State]
    columns: dict[str, Tensor]


def run_rule(
    rule: AggregationRule,
    rule_state: State,
    preaggregators: Sequence[PreAggregator],
    preaggregator_states: Sequence[State],
    rows: Rows,
    *,
    generator: torch.Generator | None,
    oracle: Callable[[], Callable[[Tensor], Tensor]] | None = None,
    reference: Callable[[], Tensor] | None = None,
) -> RuleOutcome:
    """The pre-aggregators in order, then the rule, on the rows that passed the filters.
    ``oracle`` and ``reference`` make Zeno's oracle and FLTrust's reference update; each
    is called only when the rule needs it (a reference costs a training run)."""
    chain, new_preaggregator_states = preaggregate(
        preaggregators, preaggregator_states, rows.updates, rows.weights, client_ids=rows.ids,
        generator=generator,
    )  # fmt: skip
    inputs: dict[str, Any] = {}
    if rule.requires_oracle:
        inputs["oracle"] = _needed(oracle, "oracle", rule)()
    if rule.requires_reference:
        inputs["reference"] = _needed(reference, "reference", rule)()
    if rows.local_norms is not None:  # FedNova's; the rule says when they are missing
        inputs["local_norms"] = rows.local_norms
    if rows.losses is not None:  # AFL's
        inputs["losses"] = rows.losses
    if chain.row_ids is not None:
        inputs["client_ids"] = chain.row_ids
    aggregate, new_rule_state, diagnostics = rule.step(
        rule_state, chain.rows, chain.weights, **inputs
    )
    return RuleOutcome(
        aggregate,
        new_rule_state,
        new_preaggregator_states,
        chain.columns | client_columns(diagnostics, chain.mixing),
    )


def _needed(make: Callable[[], Any] | None, what: str, rule: AggregationRule) -> Callable[[], Any]:
    if make is None:
        raise ValueError(f"aggregator {type(rule).__name__} needs an {what}; none was given")
    return make
