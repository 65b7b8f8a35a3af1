"""Centered clipping: the docstring example, the open state, and a loop reference."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from aggregation import build_aggregator


def reference_cc(points: np.ndarray, center: np.ndarray, tau: float, n_iter: int) -> np.ndarray:
    """Karimireddy et al. 2021 by plain loops."""
    v = center.copy()
    for _ in range(n_iter):
        step = np.zeros_like(v)
        for x in points:
            diff = x - v
            norm = np.linalg.norm(diff)
            step += diff * (min(1.0, tau / norm) if norm > 0 else 1.0)
        v = v + step / len(points)
    return v


def test_docstring_example() -> None:
    updates = torch.tensor([[0.5, 0.0], [0.0, 0.5], [4.0, 3.0]], dtype=torch.float64)

    out, state, diagnostics = build_aggregator("centered_clipping", tau=1.0).step(
        {"center": None}, updates
    )

    torch.testing.assert_close(out, torch.tensor([1.3 / 3, 1.1 / 3], dtype=torch.float64))
    torch.testing.assert_close(state["center"], out)
    assert diagnostics["columns"]["clip_factor"].tolist() == [1.0, 1.0, 0.2]
    torch.testing.assert_close(
        diagnostics["effective_weight"], torch.tensor([1 / 3, 1 / 3, 0.2 / 3], dtype=torch.float64)
    )
    assert diagnostics["center_weight"] == pytest.approx(1 - 2.2 / 3)


@pytest.mark.parametrize(("tau", "n_iter"), [(0.5, 1), (2.0, 3), (100.0, 2)])
def test_matches_loops_over_two_rounds(tau: float, n_iter: int) -> None:
    rng = np.random.default_rng(int(tau * 10) + n_iter)
    rounds = [rng.standard_normal((9, 12)) + 1.0 for _ in range(2)]
    rule = build_aggregator("centered_clipping", tau=tau, n_iter=n_iter)
    state = rule.init_state()
    center = np.zeros(12)

    for points in rounds:
        previous = center
        out, state, diagnostics = rule.step(state, torch.from_numpy(points))
        center = reference_cc(points, center, tau, n_iter)

        np.testing.assert_allclose(out.numpy(), center, rtol=1e-12, atol=1e-12)
        # the effective weights and the center's share reproduce the result
        combined = diagnostics["center_weight"] * previous
        combined += diagnostics["effective_weight"].numpy() @ points
        np.testing.assert_allclose(combined, center, rtol=1e-10, atol=1e-12)


def test_state_survives_a_checkpoint_round_trip() -> None:
    rule = build_aggregator("centered_clipping", tau=1.0)
    updates = torch.randn(6, 4, dtype=torch.float64)
    _, state, _ = rule.step(rule.init_state(), updates)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)

    restored = torch.load(buffer, weights_only=True)

    torch.testing.assert_close(rule.step(restored, updates)[0], rule.step(state, updates)[0])


def test_step_does_not_mutate_the_state() -> None:
    rule = build_aggregator("centered_clipping", tau=1.0)
    state = {"center": torch.ones(3, dtype=torch.float64)}

    rule.step(state, torch.zeros(4, 3, dtype=torch.float64))

    assert state["center"].tolist() == [1.0, 1.0, 1.0]


def test_center_of_another_size_is_refused() -> None:
    rule = build_aggregator("centered_clipping")

    with pytest.raises(ValueError, match="center of shape"):
        rule.step({"center": torch.zeros(5)}, torch.zeros(3, 4))
