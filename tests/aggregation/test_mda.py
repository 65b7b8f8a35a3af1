"""MDA: the docstring example, brute-force enumeration as the reference, equal diameters."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from aggregation import build_aggregator


def brute_force(points: np.ndarray, f: int) -> tuple[float, list[tuple[int, ...]]]:
    """The smallest diameter over every subset of n - f points, and every subset with it
    (ByzFL's enumeration)."""
    n = len(points)
    best, subsets = np.inf, []
    for subset in itertools.combinations(range(n), n - f):
        diameter = max(
            (
                float(np.linalg.norm(points[i] - points[j]))
                for i, j in itertools.combinations(subset, 2)
            ),
            default=0.0,
        )
        if diameter < best - 1e-9:
            best, subsets = diameter, [subset]
        elif diameter <= best + 1e-9:
            subsets.append(subset)
    return best, subsets


def test_docstring_example() -> None:
    updates = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [5.0, 5.0]], dtype=torch.float64)

    out, _, diagnostics = build_aggregator("mda", f=1).step({}, updates)

    torch.testing.assert_close(out, torch.tensor([1 / 3, 1 / 3], dtype=torch.float64))
    assert diagnostics["selected"].tolist() == [0, 1, 2]
    assert diagnostics["diameter"] == pytest.approx(2**0.5)


@pytest.mark.parametrize("seed", range(12))
def test_matches_brute_force_enumeration(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 11))
    f = int(rng.integers(0, (n - 1) // 2 + 1))
    points = rng.standard_normal((n, 4))
    points[:f] *= 4.0  # some spread-out points among the f first
    diameter, subsets = brute_force(points, f)

    out, _, diagnostics = build_aggregator("mda", f=f).step({}, torch.from_numpy(points))

    assert len(subsets) == 1  # continuous data: a unique optimum
    assert tuple(diagnostics["selected"].tolist()) == subsets[0]
    assert diagnostics["diameter"] == pytest.approx(diameter, rel=1e-9)
    np.testing.assert_allclose(out.numpy(), points[list(subsets[0])].mean(axis=0), rtol=1e-12)


def test_equal_diameters_give_the_same_choice_in_any_client_order() -> None:
    # f = 2 of 6 on a line: removing 10 with 0 or with 3 both leave diameter 2; the tie
    # goes to the smaller spread: {0, 1, 1.2, 2} (8.12) over {1, 1.2, 2, 3} (9.92).
    line = torch.tensor([[0.0], [1.0], [1.2], [2.0], [3.0], [10.0]], dtype=torch.float64)
    _, subsets = brute_force(line.numpy(), 2)
    rule = build_aggregator("mda", f=2)

    outputs = {
        round(float(rule(line[list(order)])), 12) for order in itertools.permutations(range(6))
    }

    assert len(subsets) == 2
    assert outputs == {1.05}


def test_the_farthest_column_is_the_distance_to_the_selected_set() -> None:
    points = np.random.default_rng(5).standard_normal((9, 3))

    _, _, diagnostics = build_aggregator("mda", f=2).step({}, torch.from_numpy(points))

    chosen = points[diagnostics["selected"].numpy()]
    farthest = np.linalg.norm(points[:, None, :] - chosen[None, :, :], axis=2).max(axis=1)
    np.testing.assert_allclose(diagnostics["columns"]["farthest"].numpy(), farthest, rtol=1e-9)


def test_a_search_past_max_nodes_raises_naming_f() -> None:
    points = torch.randn(12, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    with pytest.raises(ValueError, match=r"max_nodes=2 branches with f=5: lower f"):
        build_aggregator("mda", f=5, max_nodes=2)(points)
