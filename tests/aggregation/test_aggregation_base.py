"""drop_non_finite: the helper the server calls before every rule."""

from __future__ import annotations

import torch

from aggregation import drop_non_finite


def test_rows_with_nan_or_inf_are_dropped_with_their_weights() -> None:
    updates = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    updates[1, 2] = float("nan")
    updates[3, 0] = float("-inf")
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0])

    kept, kept_weights, keep = drop_non_finite(updates, weights)

    assert keep.tolist() == [True, False, True, False]
    assert kept.tolist() == [[0.0, 1.0, 2.0], [6.0, 7.0, 8.0]]
    assert kept_weights is not None and kept_weights.tolist() == [1.0, 3.0]


def test_a_non_finite_weight_drops_the_client() -> None:
    updates = torch.zeros(3, 2)
    weights = torch.tensor([1.0, float("nan"), 2.0])

    kept, kept_weights, keep = drop_non_finite(updates, weights)

    assert keep.tolist() == [True, False, True]
    assert kept.shape == (2, 2)
    assert kept_weights is not None and kept_weights.tolist() == [1.0, 2.0]


def test_all_finite_returns_the_inputs_without_a_copy() -> None:
    updates = torch.randn(5, 7)

    kept, kept_weights, keep = drop_non_finite(updates, None)

    assert kept is updates
    assert kept_weights is None
    assert bool(keep.all())


def test_huge_finite_values_are_kept() -> None:
    updates = torch.full((2, 4), 3e38)  # the row sums overflow, the values do not

    _, _, keep = drop_non_finite(updates, None)

    assert keep.tolist() == [True, True]


def test_every_client_dropped_leaves_an_empty_batch() -> None:
    updates = torch.full((2, 3), float("nan"))

    kept, _, keep = drop_non_finite(updates, None)

    assert kept.shape == (0, 3)
    assert not bool(keep.any())
