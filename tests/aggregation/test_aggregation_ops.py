"""The column-wise building blocks: the sorting network and the Gram-matrix distances."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aggregation.ops import centered_gram, ranking, sort_columns, squared_distances


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
