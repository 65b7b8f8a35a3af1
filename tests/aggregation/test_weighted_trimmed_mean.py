"""Size-weighted trimmed mean: the docstring example, a loop reference with fractional
cuts, scipy's trimmed mean for equal weights, and FedAvg at beta = 0."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from aggregation import build_aggregator


def reference(values: np.ndarray, weights: np.ndarray, beta: float) -> np.ndarray:
    """Per column: lay the sorted values' weights on [0, W], keep [beta W, (1 - beta) W]."""
    total = weights.sum()
    low, high = beta * total, (1 - beta) * total
    out = []
    for column in values.T:
        order = np.argsort(column, kind="stable")
        start, acc = 0.0, 0.0
        for i in order:
            kept = max(0.0, min(start + weights[i], high) - max(start, low))
            acc += kept * column[i]
            start += weights[i]
        out.append(acc / (high - low))
    return np.array(out)


def test_docstring_example() -> None:
    values = torch.tensor([[0.0], [1.0], [2.0], [100.0]], dtype=torch.float64)
    weights = torch.tensor([2.0, 1.0, 3.0, 2.0], dtype=torch.float64)

    out, _, diagnostics = build_aggregator("weighted_trimmed_mean", beta=0.25).step(
        {}, values, weights
    )

    assert out.tolist() == [1.75]
    assert diagnostics["effective_weight"].tolist() == [0.0, 0.25, 0.75, 0.0]


@pytest.mark.parametrize(
    ("n", "beta", "seed"), [(5, 0.1, 0), (12, 0.3, 1), (40, 0.2, 2), (3, 0.45, 3)]
)
def test_matches_loops_with_fractional_cuts(n: int, beta: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((n, 50))
    weights = rng.integers(1, 100, n).astype(float)

    out = build_aggregator("weighted_trimmed_mean", beta=beta)(
        torch.from_numpy(values), torch.from_numpy(weights)
    )

    np.testing.assert_allclose(out.numpy(), reference(values, weights, beta), rtol=1e-10)


@pytest.mark.parametrize(("n", "f"), [(10, 2), (11, 3), (30, 7)])
def test_equal_weights_are_the_trimmed_mean(n: int, f: int) -> None:
    values = np.random.default_rng(n).standard_normal((n, 40))

    out = build_aggregator("weighted_trimmed_mean", beta=f / n)(torch.from_numpy(values))

    np.testing.assert_allclose(out.numpy(), stats.trim_mean(values, f / n, axis=0), rtol=1e-10)


def test_beta_zero_is_fedavg() -> None:
    gen = torch.Generator().manual_seed(0)
    updates = torch.randn(7, 9, generator=gen, dtype=torch.float64)
    weights = torch.randint(1, 20, (7,), generator=gen).double()

    out = build_aggregator("weighted_trimmed_mean", beta=0.0)(updates, weights)

    torch.testing.assert_close(out, build_aggregator("fedavg")(updates, weights))


def test_f_trims_the_share_the_f_heaviest_clients_hold() -> None:
    """``beta = f/n`` leaks when the f attackers hold more than f/n of the weight; ``f``
    trims what the f heaviest clients hold, so the two heaviest (attacking) clients'
    huge values are gone where beta = 2/10 keeps part of them."""
    values = torch.tensor([[1e6]] * 2 + [[float(i)] for i in range(8)], dtype=torch.float64)
    weights = torch.tensor([30.0, 30.0] + [10.0] * 8, dtype=torch.float64)  # 60 of 140

    by_count = build_aggregator("weighted_trimmed_mean", beta=2 / 10)(values, weights)
    by_weight = build_aggregator("weighted_trimmed_mean", f=2)(values, weights)
    share = 60 / 140
    expected = build_aggregator("weighted_trimmed_mean", beta=share)(values, weights)

    assert by_count.item() > 1e5  # the attackers' values leak through
    assert by_weight.item() == pytest.approx(expected.item()) and by_weight.item() < 8


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"beta": 0.1, "f": 1}, "exactly one of beta"),
        ({}, "exactly one of beta"),
        ({"f": -1}, r"f must be an integer >= 0 or None, got -1"),
        ({"beta": 0.5}, r"beta must be a number in \[0, 0\.5\) or None, got 0\.5"),
    ],
)
def test_beta_or_f_is_required_and_checked(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_aggregator("weighted_trimmed_mean", **settings)


def test_f_whose_clients_hold_half_the_weight_is_refused() -> None:
    weights = torch.tensor([50.0, 20.0, 20.0, 10.0])
    with pytest.raises(ValueError, match=r"hold 0\.500 of the weight"):
        build_aggregator("weighted_trimmed_mean", f=1)(torch.zeros(4, 3), weights)
