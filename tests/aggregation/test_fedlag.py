"""FedLag: the docstring example, a loop reference, and the paper's stated properties
(consensus, no overshoot, an isolated outlier does not move the result)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import aggregation.fedlag as fedlag_module
from aggregation import build_aggregator


def reference_fedlag(values: np.ndarray, weights: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Algorithm 1 by plain loops over parameters, candidates and clients (float64)."""
    n = values.shape[0]
    w = weights / weights.sum()
    out = []
    for column in values.T:
        var = float(np.mean((column - column.mean()) ** 2)) + eps
        scored = []
        for i in range(n):
            for j in range(i + 1, n):
                candidate = (column[i] + column[j]) / 2
                score = sum(
                    w[k] * math.exp(-((candidate - column[k]) ** 2) / (2 * var)) for k in range(n)
                )
                scored.append((score, candidate))
        best = max(score for score, _ in scored)
        out.append(min(candidate for score, candidate in scored if score >= best * (1 - 1e-12)))
    return np.array(out)


def test_docstring_example() -> None:
    out = build_aggregator("fedlag")(torch.tensor([[0.0], [1.0], [1.0], [10.0]]))

    assert out.tolist() == [1.0]


@pytest.mark.parametrize(("n", "seed"), [(2, 0), (3, 1), (5, 2), (8, 3), (13, 4)])
def test_matches_loops_with_weights(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((n, 20)) * rng.uniform(0.01, 100.0, 20)
    weights = rng.integers(1, 100, n).astype(float)

    out = build_aggregator("fedlag")(torch.from_numpy(values), torch.from_numpy(weights))

    np.testing.assert_array_equal(out.numpy(), reference_fedlag(values, weights))


def test_float32_input_selects_the_same_midpoints() -> None:
    rng = np.random.default_rng(7)
    values = rng.standard_normal((30, 200)).astype(np.float32)

    out = build_aggregator("fedlag")(torch.from_numpy(values))

    reference = reference_fedlag(values.astype(np.float64), np.ones(30))
    np.testing.assert_array_equal(out.numpy(), reference.astype(np.float32))


def test_a_tie_goes_to_the_smaller_candidate_in_any_client_order() -> None:
    # Weight only on the two outer clients: 0.5 and 9.5 score exactly alike.
    values = torch.tensor([[0.0], [1.0], [9.0], [10.0]], dtype=torch.float64)
    weights = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    rule = build_aggregator("fedlag")

    assert rule(values, weights).tolist() == [0.5]
    assert rule(values.flip(0), weights.flip(0)).tolist() == [0.5]


def test_one_client_returns_its_update() -> None:
    update = torch.tensor([[3.0, -1.0]])

    assert build_aggregator("fedlag")(update).tolist() == [3.0, -1.0]


@settings(max_examples=30, deadline=None)
@given(value=st.floats(-1e6, 1e6, allow_nan=False), n=st.integers(1, 12), seed=st.integers(0, 999))
def test_consensus(value: float, n: int, seed: int) -> None:
    weights = (
        torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.1
    )
    updates = torch.full((n, 3), value, dtype=torch.float64)

    out = build_aggregator("fedlag")(updates, weights)

    assert out.tolist() == [value] * 3


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 12), seed=st.integers(0, 10_000), scale=st.floats(1e-3, 1e3))
def test_no_overshoot(n: int, seed: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    updates = scale * torch.randn(n, 6, generator=gen, dtype=torch.float64).round(decimals=1)
    weights = torch.rand(n, generator=gen, dtype=torch.float64)

    out = build_aggregator("fedlag")(updates, weights)

    assert bool(
        (out >= updates.min(dim=0).values).all() and (out <= updates.max(dim=0).values).all()
    )


@pytest.mark.parametrize("distance", [10.0, 100.0, 1000.0])
def test_an_isolated_outlier_does_not_move_the_result(distance: float) -> None:
    # Eight clients agree on 1, two disagree mildly; the eleventh is far away.
    inliers = torch.tensor([[1.0]] * 8 + [[0.0], [2.0]], dtype=torch.float64)
    with_outlier = torch.cat([inliers, torch.tensor([[distance]], dtype=torch.float64)])
    rule = build_aggregator("fedlag")

    assert rule(inliers).tolist() == [1.0]
    assert rule(with_outlier).tolist() == [1.0]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(3, 12), seed=st.integers(0, 10_000), exponent=st.floats(1.0, 8.0))
def test_an_outlier_at_any_distance_leaves_the_result_among_the_inliers(
    n: int, seed: int, exponent: float
) -> None:
    # sigma includes the outlier, so far away it flattens every inlier's Gaussian and the
    # choice may drift among the inliers' midpoints, but never beyond them.
    inliers = torch.randn(
        n - 1, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    spread = float(inliers.max() - inliers.min()) + 1.0
    outlier = inliers.max(dim=0).values + spread * 10.0**exponent
    updates = torch.cat([inliers, outlier[None]])

    out = build_aggregator("fedlag")(updates)

    assert bool(
        (out >= inliers.min(dim=0).values).all() and (out <= inliers.max(dim=0).values).all()
    )


def test_every_screening_path_gives_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    updates = torch.from_numpy(rng.standard_normal((12, 300)))
    weights = torch.from_numpy(rng.integers(1, 9, 12).astype(float))
    rule = build_aggregator("fedlag")
    screened32 = rule(updates, weights)

    monkeypatch.setattr(fedlag_module, "_SCREEN32_MAX_N", 0)
    screened64 = rule(updates, weights)
    monkeypatch.setattr(fedlag_module, "_FACTOR64_MAX_N", 0)
    direct = rule(updates, weights)

    assert torch.equal(screened32, direct)
    assert torch.equal(screened64, direct)


def test_reduced_matmul_precision_falls_back_to_float64_screening() -> None:
    updates = torch.randn(10, 100, generator=torch.Generator().manual_seed(5))
    rule = build_aggregator("fedlag")
    exact = rule(updates)
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert fedlag_module._screen_dtype(10, updates.device) == torch.float64
        reduced = rule(updates)
    finally:
        torch.set_float32_matmul_precision(previous)

    assert torch.equal(reduced, exact)


def test_sampled_candidates_are_seeded_by_seed_and_round() -> None:
    updates = torch.randn(20, 50, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    rule = build_aggregator("fedlag", max_candidates=15, seed=3)
    state = rule.init_state()

    first, state, _ = rule.step(state, updates)
    second, state, _ = rule.step(state, updates)
    again, _, _ = rule.step({"round": 0}, updates)

    assert state == {"round": 2}
    assert torch.equal(again, first)
    assert not torch.equal(second, first)  # another round draws other pairs


def test_sampled_candidates_do_not_depend_on_client_order() -> None:
    gen = torch.Generator().manual_seed(8)
    updates = torch.randn(15, 40, generator=gen, dtype=torch.float64)
    weights = torch.rand(15, generator=gen, dtype=torch.float64)
    perm = torch.randperm(15, generator=gen)
    rule = build_aggregator("fedlag", max_candidates=20)

    torch.testing.assert_close(
        rule(updates[perm], weights[perm]), rule(updates, weights), rtol=0, atol=0
    )


def test_enough_candidates_is_the_exact_rule() -> None:
    updates = torch.randn(6, 30, generator=torch.Generator().manual_seed(9), dtype=torch.float64)

    sampled = build_aggregator("fedlag", max_candidates=15)(updates)  # 6 * 5 / 2 = 15 pairs

    assert torch.equal(sampled, build_aggregator("fedlag")(updates))
