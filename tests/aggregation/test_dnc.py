"""Divide-and-Conquer: the docstring example, numpy's SVD as the reference, the seeded
parameter draws and the open state."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from aggregation import build_aggregator


def reference_dnc(points: np.ndarray, f: int, column_sets: list[np.ndarray], c: float) -> list[int]:
    """Shejwalkar & Houmansadr's Algorithm 2 with numpy's SVD: the rows kept in every
    iteration (continuous data: no equal scores)."""
    n = len(points)
    good = set(range(n))
    for columns in column_sets:
        sub = points[:, columns]
        centered = sub - sub.mean(axis=0)
        v = np.linalg.svd(centered, full_matrices=False)[2][0]
        scores = (centered @ v) ** 2
        good &= set(np.argsort(scores)[: n - math.floor(c * f)].tolist())
    return sorted(good)


def test_docstring_example() -> None:
    updates = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 2.0], [9.0, 9.0]])
    rule = build_aggregator("dnc", f=1)

    out, state, diagnostics = rule.step(rule.init_state(), updates.double())

    assert out.tolist() == [1.0, 1.0]
    assert diagnostics["selected"].tolist() == [0, 1, 2, 3]
    assert diagnostics["columns"]["dnc_flagged"].tolist() == [0, 0, 0, 0, 1]
    assert state == {"round": 1}


@pytest.mark.parametrize(("n", "f", "c"), [(10, 2, 1.0), (25, 5, 1.5), (40, 8, 1.0)])
def test_matches_numpy_svd_on_every_parameter(n: int, f: int, c: float) -> None:
    rng = np.random.default_rng(n)
    points = rng.standard_normal((n, 30))
    points[:f] += 3.0 * rng.standard_normal(30)  # a colluding direction
    kept = reference_dnc(points, f, [np.arange(30)], c)

    out, _, diagnostics = build_aggregator("dnc", f=f, filter_frac=c).step(
        {"round": 0}, torch.from_numpy(points)
    )

    assert diagnostics["selected"].tolist() == kept
    np.testing.assert_allclose(out.numpy(), points[kept].mean(axis=0), rtol=1e-12)


def test_subsampled_iterations_match_the_reference_with_the_same_draws() -> None:
    rng = np.random.default_rng(0)
    points = rng.standard_normal((15, 200))
    points[:3] += 2.0 * rng.standard_normal(200)
    rule = build_aggregator("dnc", f=3, n_iters=3, sub_dim=50, seed=7)
    draws = [
        np.sort(np.random.default_rng([7, 4, k]).choice(200, size=50, replace=False))
        for k in range(3)
    ]

    _, state, diagnostics = rule.step({"round": 4}, torch.from_numpy(points))

    assert diagnostics["selected"].tolist() == reference_dnc(points, 3, draws, 1.0)
    assert state == {"round": 5}


def test_same_seed_and_round_draw_the_same_parameters() -> None:
    points = torch.randn(12, 500, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    rule = build_aggregator("dnc", f=2, n_iters=2, sub_dim=20, seed=3)

    first = rule.step({"round": 2}, points)
    second = rule.step({"round": 2}, points)

    torch.testing.assert_close(first[0], second[0], rtol=0, atol=0)
    torch.testing.assert_close(
        first[2]["columns"]["dnc_score"], second[2]["columns"]["dnc_score"], rtol=0, atol=0
    )
    other = rule.step({"round": 3}, points)[2]["columns"]["dnc_score"]
    assert not torch.equal(other, first[2]["columns"]["dnc_score"])


def test_when_no_client_survives_every_iteration_the_least_flagged_are_averaged() -> None:
    # Two far groups in two parameter halves: each iteration flags one of them.
    points = torch.zeros(5, 2, dtype=torch.float64)
    points[:, 0] = torch.tensor([0.0, 0.1, -0.1, 0.05, 9.0])
    points[:, 1] = torch.tensor([9.0, 0.1, -0.1, 0.05, 0.0])
    rule = build_aggregator("dnc", f=1, n_iters=40, sub_dim=1, seed=0)

    _, _, diagnostics = rule.step({"round": 0}, points)

    flagged = diagnostics["columns"]["dnc_flagged"]
    assert (
        diagnostics["selected"].tolist() == (flagged == flagged.min()).nonzero().flatten().tolist()
    )
