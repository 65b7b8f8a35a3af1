"""Geometric median (RFA): the closed-form docstring example and scipy as the reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import optimize

from aggregation import build_aggregator


def test_docstring_example() -> None:
    updates = torch.tensor(
        [[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 2.0], [100.0, 100.0]], dtype=torch.float64
    )

    out = build_aggregator("geometric_median", tol=1e-12, max_iter=1000)(updates)

    t = 1.0 + 1.0 / math.sqrt(3.0)
    torch.testing.assert_close(out, torch.tensor([t, t], dtype=torch.float64), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("n", "d", "seed"), [(5, 3, 0), (10, 4, 1), (25, 6, 2)])
def test_matches_scipy_minimisation_with_weights(n: int, d: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    points = rng.standard_normal((n, d)) + 10.0
    points[0] += 50.0  # an outlier
    alpha = rng.integers(1, 20, n).astype(float)
    alpha /= alpha.sum()

    def objective(z: np.ndarray) -> float:
        return float(np.sum(alpha * np.linalg.norm(points - z, axis=1)))

    reference = optimize.minimize(
        objective,
        np.median(points, axis=0),
        method="Nelder-Mead",
        options={"xatol": 1e-11, "fatol": 1e-14, "maxiter": 200_000, "maxfev": 200_000},
    ).x

    rule = build_aggregator("geometric_median", tol=1e-12, max_iter=5000)
    out, _, diagnostics = rule.step({}, torch.from_numpy(points), torch.from_numpy(alpha))

    np.testing.assert_allclose(out.numpy(), reference, atol=1e-6)
    assert objective(out.numpy()) <= objective(reference) + 1e-9
    weight = diagnostics["effective_weight"]
    assert weight.sum().item() == pytest.approx(1.0)
    np.testing.assert_allclose(weight.numpy() @ points, out.numpy(), rtol=1e-12)
    np.testing.assert_allclose(
        diagnostics["columns"]["distance"].numpy(),
        np.linalg.norm(points - out.numpy(), axis=1),
        rtol=1e-6,
    )
    assert diagnostics["iterations"] >= 1


def test_stops_after_max_iter() -> None:
    updates = torch.randn(8, 5, dtype=torch.float64)

    _, _, diagnostics = build_aggregator("geometric_median", tol=0.0, max_iter=3).step({}, updates)

    assert diagnostics["iterations"] == 3
