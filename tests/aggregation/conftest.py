"""Fixtures shared by the aggregation-rule tests (no global settings: fixtures only)."""

from __future__ import annotations

from collections.abc import Callable

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


@pytest.fixture
def make_oracle() -> Callable[[Tensor], Oracle]:
    return quadratic_oracle


@pytest.fixture
def aggregate() -> Callable[..., Tensor]:
    """Call any rule the way the server does: rules that need an oracle get the
    synthetic quadratic one (target 0 unless given)."""

    def run(
        rule: AggregationRule,
        updates: Tensor,
        weights: Tensor | None = None,
        target: Tensor | None = None,
    ) -> Tensor:
        if rule.requires_oracle:
            goal = torch.zeros(updates.shape[1], dtype=torch.float64) if target is None else target
            result, _, _ = rule.step(
                rule.init_state(), updates, weights, oracle=quadratic_oracle(goal)
            )
            return result
        return rule(updates, weights)

    return run
