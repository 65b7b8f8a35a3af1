"""Bulyan: the docstring example and an independent numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aggregation import build_aggregator
from aggregation.bulyan import closest_to_median_mean


def reference_bulyan(points: np.ndarray, f: int) -> tuple[np.ndarray, list[int]]:
    """El Mhamdi et al. by plain loops: iterated Krum (ties: smaller total distance, then
    lower index), then per coordinate the beta values nearest the median, averaged."""
    n = len(points)
    theta, beta = n - 2 * f, n - 4 * f
    remaining, chosen = list(range(n)), []
    for _ in range(theta):
        keys = []
        for i in remaining:
            dists = sorted(float(np.sum((points[i] - points[j]) ** 2)) for j in remaining if j != i)
            keys.append((sum(dists[: max(len(remaining) - f - 2, 0)]), sum(dists), i))
        chosen.append(min(keys)[2])
        remaining.remove(chosen[-1])
    selected = points[sorted(chosen)]
    out = []
    for column in selected.T:
        median = np.median(column)
        nearest = np.argsort(np.abs(column - median), kind="stable")[:beta]
        out.append(column[nearest].mean())
    return np.array(out), sorted(chosen)


def test_docstring_example() -> None:
    updates = torch.tensor(
        [
            [0.0, 5.0],
            [10.0, 0.0],
            [20.0, 1.0],
            [30.0, 2.0],
            [40.0, 10.0],
            [50.0, 11.0],
            [1000.0, -500.0],
        ]
    )

    out, _, diagnostics = build_aggregator("bulyan", f=1).step({}, updates)

    assert out.tolist() == [30.0, 1.0]
    assert diagnostics["selected"].tolist() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("n", "f", "seed"), [(7, 1, 0), (11, 2, 1), (15, 3, 2), (20, 4, 3), (5, 0, 4)]
)
def test_matches_loops_on_random_inputs(n: int, f: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    points = rng.standard_normal((n, 30))
    points[:f] += 8.0 * rng.standard_normal((f, 30))  # f outliers
    reference, chosen = reference_bulyan(points, f)

    out, _, diagnostics = build_aggregator("bulyan", f=f).step({}, torch.from_numpy(points))

    assert diagnostics["selected"].tolist() == chosen
    np.testing.assert_allclose(out.numpy(), reference, rtol=1e-12)


@pytest.mark.parametrize(("theta", "beta"), [(5, 3), (7, 3), (8, 4), (9, 1), (6, 6)])
def test_window_is_the_beta_values_nearest_the_median(theta: int, beta: int) -> None:
    rng = np.random.default_rng(theta * 10 + beta)
    values = np.sort(rng.standard_exponential((theta, 500)) ** 3, axis=0)  # skewed columns
    median = np.median(values, axis=0)
    nearest = np.argsort(np.abs(values - median), axis=0, kind="stable")[:beta]
    reference = np.take_along_axis(values, nearest, axis=0).mean(axis=0)

    out = closest_to_median_mean(torch.from_numpy(values), beta)

    np.testing.assert_allclose(out.numpy(), reference, rtol=1e-12)


def test_too_few_clients_names_f() -> None:
    with pytest.raises(
        ValueError, match=r"bulyan with f=2 needs n_clients >= 4f \+ 3 = 11, got 10"
    ):
        build_aggregator("bulyan", f=2)(torch.zeros(10, 3))
