"""Trimmed mean: the docstring example, scipy/numpy references, parameter errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from aggregation import build_aggregator
from registry import RegistryError


def test_docstring_example() -> None:
    updates = torch.tensor([[1.0, 0.0], [2.0, 10.0], [3.0, 20.0], [100.0, 30.0], [-50.0, 40.0]])

    out = build_aggregator("trimmed_mean", f=1)(updates)

    assert out.tolist() == [2.0, 20.0]


@pytest.mark.parametrize(("n", "beta"), [(10, 0.1), (10, 0.25), (23, 0.2), (7, 0.0), (50, 0.45)])
def test_beta_matches_scipy_trim_mean(n: int, beta: float) -> None:
    values = np.random.default_rng(n).standard_normal((n, 129))

    out = build_aggregator("trimmed_mean", beta=beta)(torch.from_numpy(values))

    np.testing.assert_allclose(out.numpy(), stats.trim_mean(values, beta, axis=0), rtol=1e-12)


@pytest.mark.parametrize(("n", "f"), [(3, 1), (10, 2), (50, 10), (51, 25)])
def test_f_matches_sorted_slice(n: int, f: int) -> None:
    values = np.random.default_rng(f).standard_normal((n, 65))
    reference = np.array([np.mean(sorted(column)[f : n - f]) for column in values.T])

    out = build_aggregator("trimmed_mean", f=f)(torch.from_numpy(values))

    np.testing.assert_allclose(out.numpy(), reference, rtol=1e-12)


@pytest.mark.parametrize("params", [{}, {"f": 1, "beta": 0.1}])
def test_exactly_one_of_f_and_beta(params: dict[str, float]) -> None:
    with pytest.raises(RegistryError, match=r"exactly one of f .* or beta"):
        build_aggregator("trimmed_mean", **params)


def test_too_few_clients_names_f() -> None:
    rule = build_aggregator("trimmed_mean", f=2)

    with pytest.raises(ValueError, match=r"f=2 .* needs n_clients > 2f"):
        rule(torch.zeros(4, 3))
