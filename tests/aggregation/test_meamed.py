"""Meamed: the docstring example and a loop reference for the values and attribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aggregation import build_aggregator


def reference_meamed(points: np.ndarray, f: int) -> tuple[np.ndarray, np.ndarray]:
    """Per column the n - f values closest to the column's median (mean of the two middle
    values), averaged, and each client's average coefficient (continuous data: no ties)."""
    n, d = points.shape
    out, weight = np.empty(d), np.zeros(n)
    for k, column in enumerate(points.T):
        closest = np.argsort(np.abs(column - np.median(column)))[: n - f]
        out[k] = column[closest].mean()
        weight[closest] += 1.0 / (n - f) / d
    return out, weight


def test_docstring_example() -> None:
    updates = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 4.0], [10.0, 5.0]], dtype=torch.float64)

    out, _, diagnostics = build_aggregator("meamed", f=1).step({}, updates)

    torch.testing.assert_close(out, torch.tensor([2.0, 4 / 3], dtype=torch.float64))
    torch.testing.assert_close(
        diagnostics["effective_weight"], torch.tensor([1, 1, 1, 0], dtype=torch.float64) / 3
    )
    assert diagnostics["columns"]["trimmed_share"].tolist() == [0.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize(("n", "f"), [(5, 2), (10, 3), (21, 6), (50, 12)])
def test_matches_loops(n: int, f: int) -> None:
    points = np.random.default_rng(n).standard_normal((n, 40))
    points[:f] *= 30.0
    expected, weight = reference_meamed(points, f)

    out, _, diagnostics = build_aggregator("meamed", f=f).step({}, torch.from_numpy(points))

    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(diagnostics["effective_weight"].numpy(), weight, atol=1e-12)


def test_f_zero_is_the_mean() -> None:
    points = torch.randn(6, 9, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    torch.testing.assert_close(build_aggregator("meamed", f=0)(points), points.mean(dim=0))
