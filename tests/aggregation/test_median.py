"""Coordinate-wise median: the docstring example and numpy as the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aggregation import build_aggregator


def test_docstring_example() -> None:
    updates = torch.tensor([[1.0, 10.0], [2.0, 30.0], [9.0, 20.0], [4.0, 40.0]])

    out = build_aggregator("median")(updates)

    assert out.tolist() == [3.0, 25.0]


@pytest.mark.parametrize("n", [1, 2, 3, 8, 15, 50])
def test_matches_numpy_median(n: int) -> None:
    rng = np.random.default_rng(n)
    values = rng.standard_normal((n, 257))

    out = build_aggregator("median")(torch.from_numpy(values))

    np.testing.assert_allclose(out.numpy(), np.median(values, axis=0), rtol=1e-15, atol=0)


def test_weights_are_ignored() -> None:
    updates = torch.tensor([[0.0], [1.0], [5.0]])

    out = build_aggregator("median")(updates, torch.tensor([100.0, 1.0, 1.0]))

    assert out.tolist() == [1.0]
