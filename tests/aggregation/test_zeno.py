"""Zeno with a synthetic quadratic-loss oracle (the seam the server loop uses)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from aggregation import AggregationRule, build_aggregator

Oracle = Callable[[Tensor], Tensor]


def test_the_rule_declares_that_it_needs_an_oracle() -> None:
    assert build_aggregator("zeno", b=1).requires_oracle
    assert not build_aggregator("median").requires_oracle
    assert not AggregationRule.requires_oracle


def test_docstring_example(make_oracle: Callable[[Tensor], Oracle]) -> None:
    updates = torch.tensor([[1.0, 1.0], [0.5, 0.5], [-1.0, 0.0]], dtype=torch.float64)
    # make_oracle gives 0.5 * ||g - target||²; twice that is the example's (x - 1)² sum.
    half = make_oracle(torch.ones(2, dtype=torch.float64))

    def oracle(candidates: Tensor) -> Tensor:
        return 2.0 * half(candidates)

    out, state, diagnostics = build_aggregator("zeno", b=1, rho=0.1).step(
        {}, updates, oracle=oracle
    )

    assert out.tolist() == [0.75, 0.75]
    assert state == {}
    assert diagnostics["selected"].tolist() == [0, 1]
    torch.testing.assert_close(
        diagnostics["columns"]["zeno_score"], torch.tensor([1.8, 1.45, -3.1], dtype=torch.float64)
    )
    assert diagnostics["base_loss"] == 2.0


def test_scores_follow_the_definition(make_oracle: Callable[[Tensor], Oracle]) -> None:
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(8, generator=gen, dtype=torch.float64)
    updates = torch.randn(7, 8, generator=gen, dtype=torch.float64)
    oracle = make_oracle(target)
    rho = 0.3

    _, _, diagnostics = build_aggregator("zeno", b=3, rho=rho).step({}, updates, oracle=oracle)

    base = 0.5 * float(target.square().sum())
    expected = base - oracle(updates) - rho * updates.square().sum(dim=1)
    torch.testing.assert_close(diagnostics["columns"]["zeno_score"], expected)
    assert diagnostics["selected"].tolist() == sorted(
        expected.argsort(descending=True)[:4].tolist()
    )


def test_calling_without_an_oracle_says_how_to_call_it() -> None:
    rule = build_aggregator("zeno", b=1)

    with pytest.raises(TypeError, match=r"oracle=.*server loop"):
        rule(torch.zeros(3, 2))


def test_callable_with_an_oracle() -> None:
    rule = build_aggregator("zeno", b=1)

    out = rule(torch.tensor([[0.0], [1.0], [9.0]]), oracle=lambda c: (c - 1.0).square().sum(dim=1))

    assert out.tolist() == [0.5]


def test_a_diverging_loss_counts_as_the_worst_score() -> None:
    def oracle(candidates: Tensor) -> Tensor:
        losses = candidates.sum(dim=1)
        losses[candidates[:, 0] == 5.0] = float("nan")
        return losses

    rule = build_aggregator("zeno", b=1, rho=0.0)
    out, _, diagnostics = rule.step({}, torch.tensor([[5.0], [1.0], [2.0]]), oracle=oracle)

    assert diagnostics["selected"].tolist() == [1, 2]
    assert out.tolist() == [1.5]


def test_an_oracle_of_the_wrong_shape_is_refused() -> None:
    rule = build_aggregator("zeno", b=1)

    with pytest.raises(ValueError, match="must return one loss per update"):
        rule.step({}, torch.zeros(3, 2), oracle=lambda c: c.sum())
