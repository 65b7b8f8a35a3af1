"""MoNNA: the docstring examples and a numpy reference for both anchors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aggregation import build_aggregator

EXAMPLE = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [5.0, 5.0]], dtype=torch.float64)


def reference_monna(points: np.ndarray, f: int, anchor: np.ndarray) -> np.ndarray:
    """Mean of the n - f points nearest to ``anchor`` (continuous data: no ties)."""
    nearest = np.argsort(np.linalg.norm(points - anchor, axis=1))[: len(points) - f]
    return points[nearest].mean(axis=0)


def test_docstring_example_median_anchor() -> None:
    out, _, diagnostics = build_aggregator("monna", f=1).step({}, EXAMPLE)

    torch.testing.assert_close(out, torch.tensor([1 / 3, 1 / 3], dtype=torch.float64))
    assert diagnostics["selected"].tolist() == [0, 1, 2]
    np.testing.assert_allclose(
        diagnostics["columns"]["anchor_distance"].numpy(), [0.5**0.5] * 3 + [40.5**0.5]
    )


def test_docstring_example_reference_anchor() -> None:
    rule = build_aggregator("monna", f=1, anchor="reference")

    out, _, diagnostics = rule.step({}, EXAMPLE, reference=torch.tensor([4.0, 4.0]))

    assert rule.requires_reference and not build_aggregator("monna", f=1).requires_reference
    np.testing.assert_allclose(out.numpy(), [2.0, 2.0], rtol=1e-12)
    assert diagnostics["selected"].tolist() == [1, 2, 3]


@pytest.mark.parametrize(("n", "f", "seed"), [(7, 3, 0), (20, 4, 1), (31, 10, 2)])
def test_matches_numpy_with_both_anchors(n: int, f: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    points = rng.standard_normal((n, 6))
    points[:f] += 8.0
    server = rng.standard_normal(6)

    by_median = build_aggregator("monna", f=f)(torch.from_numpy(points))
    by_reference = build_aggregator("monna", f=f, anchor="reference")(
        torch.from_numpy(points), reference=torch.from_numpy(server)
    )

    median = np.median(points, axis=0)
    np.testing.assert_allclose(by_median.numpy(), reference_monna(points, f, median), rtol=1e-12)
    np.testing.assert_allclose(by_reference.numpy(), reference_monna(points, f, server), rtol=1e-12)


def test_reference_anchor_without_a_reference_says_how_to_pass_it() -> None:
    with pytest.raises(TypeError, match=r"monna \(anchor=reference\) needs reference"):
        build_aggregator("monna", f=1, anchor="reference")(EXAMPLE)
