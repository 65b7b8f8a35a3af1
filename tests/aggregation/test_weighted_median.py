"""Size-weighted median: the docstring examples, numpy's weighted quantile as the
reference, and the attribution of equal values by weight."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aggregation import build_aggregator

VALUES = torch.tensor([[1.0], [2.0], [3.0], [10.0]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("weights", "expected", "effective"),
    [([1.0, 1.0, 1.0, 5.0], 10.0, [0, 0, 0, 1]), ([3.0, 1.0, 1.0, 3.0], 2.5, [0, 0.5, 0.5, 0])],
)
def test_docstring_examples(weights: list[float], expected: float, effective: list[float]) -> None:
    out, _, diagnostics = build_aggregator("weighted_median").step(
        {}, VALUES, torch.tensor(weights, dtype=torch.float64)
    )

    assert out.tolist() == [expected]
    assert diagnostics["effective_weight"].tolist() == effective


@pytest.mark.parametrize("seed", range(6))
def test_matches_numpy_weighted_quantile(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 30))
    values = rng.integers(-4, 5, (n, 64)).astype(float)  # many equal values
    weights = rng.integers(1, 40, n).astype(float)
    weights[0] += weights.sum() % 2 == 0  # an odd total: no cumulative weight is W/2
    expected = [
        np.quantile(column, 0.5, weights=weights, method="inverted_cdf") for column in values.T
    ]

    out = build_aggregator("weighted_median")(torch.from_numpy(values), torch.from_numpy(weights))

    np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize("n", [2, 7, 20])
def test_equal_weights_give_the_median(n: int) -> None:
    values = np.random.default_rng(n).standard_normal((n, 33))

    out = build_aggregator("weighted_median")(torch.from_numpy(values), torch.full((n,), 3.0))

    np.testing.assert_allclose(out.numpy(), np.median(values, axis=0), rtol=1e-15)


def test_clients_of_weight_zero_have_no_say() -> None:
    values = torch.tensor([[0.0], [1.0], [2.0], [100.0], [200.0]])

    out = build_aggregator("weighted_median")(values, torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0]))

    assert out.tolist() == [1.0]


def test_equal_values_share_their_coefficient_by_weight() -> None:
    values = torch.tensor([[1.0], [2.0], [2.0], [10.0]], dtype=torch.float64)

    _, _, diagnostics = build_aggregator("weighted_median").step(
        {}, values, torch.tensor([1.0, 3.0, 1.0, 1.0], dtype=torch.float64)
    )

    assert diagnostics["effective_weight"].tolist() == [0.0, 0.75, 0.25, 0.0]
    assert diagnostics["columns"]["trimmed_share"].tolist() == [1.0, 0.0, 0.0, 1.0]
