"""Norm-bounded weighted mean: the docstring example and a loop reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aggregation import build_aggregator

UPDATES = torch.tensor([[0.6, 0.0], [0.0, 0.8], [3.0, 4.0]], dtype=torch.float64)
WEIGHTS = torch.tensor([1.0, 2.0, 1.0], dtype=torch.float64)


@pytest.mark.parametrize(
    ("params", "expected", "effective"),
    [({"max_norm": 1.0}, [0.3, 0.6], [0.25, 0.5, 0.05]), ({}, [0.27, 0.56], [0.25, 0.5, 0.04])],
)
def test_docstring_example(
    params: dict[str, float], expected: list[float], effective: list[float]
) -> None:
    out, _, diagnostics = build_aggregator("norm_bounded_mean", **params).step({}, UPDATES, WEIGHTS)

    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(
        diagnostics["effective_weight"], torch.tensor(effective, dtype=torch.float64)
    )


@pytest.mark.parametrize("bound", [None, 0.5, 3.0])
def test_matches_loops(bound: float | None) -> None:
    rng = np.random.default_rng(0)
    points = rng.standard_normal((8, 10)) * rng.uniform(0.1, 3.0, (8, 1))
    weights = rng.integers(1, 30, 8).astype(float)
    norms = np.linalg.norm(points, axis=1)
    radius = np.median(norms) if bound is None else bound
    expected = sum(
        w * min(1.0, radius / r) * x for w, r, x in zip(weights, norms, points, strict=True)
    )

    out = build_aggregator("norm_bounded_mean", max_norm=bound)(
        torch.from_numpy(points), torch.from_numpy(weights)
    )

    np.testing.assert_allclose(out.numpy(), expected / weights.sum(), rtol=1e-12)
