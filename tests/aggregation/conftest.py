"""Fixtures shared by the aggregation-rule tests (no global settings: fixtures only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from aggregation import AggregationRule

Oracle = Callable[[Tensor], Tensor]


def quadratic_oracle(target: Tensor) -> Oracle:
    """Synthetic Zeno oracle: the loss ``0.5 * ||w0 + g - target||²`` with ``w0 = 0``, i.e.
    the server-batch loss after applying each candidate update ``g`` (rows)."""

    def oracle(candidates: Tensor) -> Tensor:
        return 0.5 * (candidates - target.to(candidates)).square().sum(dim=1)

    return oracle


def round_inputs(rule: AggregationRule, updates: Tensor, target: Tensor | None) -> dict[str, Any]:
    """What the server would pass ``rule`` besides the updates: the synthetic oracle
    (target 0 unless given), a reference update (``target``, else a fixed honest-scale
    direction), the rows' client ids (their indices), equal local norms and losses."""
    n, d = updates.shape
    inputs: dict[str, Any] = {}
    if rule.requires_oracle:
        goal = torch.zeros(d, dtype=torch.float64) if target is None else target
        inputs["oracle"] = quadratic_oracle(goal)
    if rule.requires_reference:
        direction = torch.randn(d, generator=torch.Generator().manual_seed(99), dtype=torch.float64)
        inputs["reference"] = (direction if target is None else target).to(updates)
    if rule.requires_client_ids:
        inputs["client_ids"] = list(range(n))
    if rule.requires_local_norms:  # equal work: FedNova is FedAvg (its own tests vary it)
        inputs["local_norms"] = torch.full((n,), 3.0, dtype=torch.float64)
    if rule.requires_losses:  # AFL's first round mixes uniformly whatever the losses
        inputs["losses"] = torch.ones(n, dtype=torch.float64)
    return inputs


@pytest.fixture
def make_oracle() -> Callable[[Tensor], Oracle]:
    return quadratic_oracle


@pytest.fixture(scope="session")
def inputs_for() -> Callable[..., dict[str, Any]]:
    return round_inputs


def step_fresh(
    rule: AggregationRule,
    updates: Tensor,
    weights: Tensor | None = None,
    target: Tensor | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """``(result, diagnostics)`` of ``rule`` from a fresh state, called the way the server
    calls it, with the round inputs it needs."""
    inputs = round_inputs(rule, updates, target)
    result, _, diagnostics = rule.step(rule.init_state(), updates, weights, **inputs)
    return result, diagnostics


@pytest.fixture(scope="session")
def diagnose() -> Callable[..., tuple[Tensor, dict[str, Any]]]:
    return step_fresh


@pytest.fixture
def aggregate() -> Callable[..., Tensor]:
    """Call any rule the way the server does, with the round inputs it needs."""

    def run(
        rule: AggregationRule,
        updates: Tensor,
        weights: Tensor | None = None,
        target: Tensor | None = None,
    ) -> Tensor:
        return step_fresh(rule, updates, weights, target)[0]

    return run
