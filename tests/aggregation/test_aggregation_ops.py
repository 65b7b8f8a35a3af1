"""The column-wise building blocks: the sorting network and the Gram-matrix distances."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aggregation.ops import (
    WeightedColumns,
    centered_gram,
    point_shares,
    ranking,
    sort_columns,
    squared_distances,
    window_shares,
)


@pytest.mark.parametrize("n", [*range(1, 20), 31, 32, 33, 50, 64, 100])
def test_sorting_network_sorts_every_column(n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    block = torch.randint(-3, 4, (n, 200), generator=gen).double()  # many ties
    block[:, :100] = torch.randn(n, 100, generator=gen, dtype=torch.float64)
    block[0, 0], block[-1, 1] = float("inf"), -float("inf")

    assert torch.equal(sort_columns(block), torch.sort(block, dim=0).values)


def test_distances_match_direct_differences_despite_a_common_offset() -> None:
    rng = np.random.default_rng(0)
    points = (rng.standard_normal((9, 500)) + 1e4).astype(np.float32)
    direct = ((points[:, None, :].astype(np.float64) - points[None, :, :]) ** 2).sum(axis=2)

    dist = squared_distances(centered_gram(torch.from_numpy(points)))

    np.testing.assert_allclose(dist.numpy(), direct, rtol=1e-5)
    assert torch.equal(dist, dist.T)


def test_an_overflowing_float32_gram_is_recomputed_in_float64() -> None:
    points = torch.zeros(3, 10)
    points[0] = 1e30

    dist = squared_distances(centered_gram(points))

    assert bool(torch.isfinite(dist).all())
    assert dist[0, 1].item() == pytest.approx(10 * 1e60, rel=1e-6)
    assert dist[1, 2].item() == 0.0


def test_ranking_breaks_equal_scores_by_the_second_key() -> None:
    scores = torch.tensor([2.0, 1.0, 1.0, 0.5])
    tiebreak = torch.tensor([0.0, 9.0, 3.0, 7.0])

    assert ranking(scores, tiebreak).tolist() == [3, 2, 1, 0]


def reference_window_shares(values: np.ndarray, start: np.ndarray, count: int) -> np.ndarray:
    """Loops: sort each column, put a share 1 on the window's positions, then give each
    client the mean share of the positions holding its value."""
    n, c = values.shape
    shares = np.zeros((n, c))
    for k in range(c):
        ordered = np.sort(values[:, k])
        inside = np.zeros(n)
        inside[start[k] : start[k] + count] = 1.0
        for i in range(n):
            positions = ordered == values[i, k]
            shares[i, k] = inside[positions].sum() / positions.sum()
    return shares


@pytest.mark.parametrize(("n", "count"), [(1, 1), (5, 2), (9, 4), (16, 16), (30, 7)])
def test_window_shares_split_runs_of_equal_values_at_the_edges(n: int, count: int) -> None:
    rng = np.random.default_rng(n)
    values = rng.integers(-2, 3, (n, 60)).astype(float)  # long runs of equal values
    start = rng.integers(0, n - count + 1, 60)
    block = torch.from_numpy(values)

    shares = window_shares(block, sort_columns(block), torch.from_numpy(start), count)

    np.testing.assert_allclose(
        shares.numpy(), reference_window_shares(values, start, count), atol=1e-12
    )
    np.testing.assert_allclose(shares.sum(dim=0).numpy(), count, atol=1e-12)


def test_point_shares_split_a_value_among_its_holders() -> None:
    values = torch.tensor([[1.0, 5.0], [2.0, 5.0], [2.0, 4.0]])

    shares = point_shares(values, torch.tensor([2.0, 5.0]))

    assert shares.tolist() == [[0.0, 0.5], [0.5, 0.5], [0.5, 0.0]]


def test_weighted_columns_share_a_run_by_weight() -> None:
    values = torch.tensor([[3.0], [1.0], [3.0], [3.0]], dtype=torch.float64)
    block = WeightedColumns(values, torch.tensor([1.0, 5.0, 2.0, 0.0], dtype=torch.float64))
    position = torch.tensor([[0.0], [0.0], [1.0], [0.0]], dtype=torch.float64)  # one 3 of three

    spread = block.spread(position)

    assert block.ordered[:, 0].tolist() == [1.0, 3.0, 3.0, 3.0]
    assert spread[:, 0].tolist() == [1 / 3, 0.0, 2 / 3, 0.0]
