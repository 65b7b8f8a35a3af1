"""AFL (Mohri et al. 2019): the docstring example, the simplex projection against an
independent solver and its optimality conditions, γ_λ = 0 with uniform λ equal to the
plain mean, and λ's ascent round after round written out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from aggregation import build_aggregator
from aggregation.afl import project_to_simplex


def test_docstring_example() -> None:
    afl = build_aggregator("afl", step_size=0.25)
    updates = torch.tensor([[0.0], [4.0]], dtype=torch.float64)

    out, state, diagnostics = afl.step(
        afl.init_state(), updates, client_ids=[0, 1], losses=torch.tensor([1.0, 3.0])
    )

    assert out.tolist() == [2.0]
    assert state["lambda"].tolist() == [0.25, 0.75]
    assert diagnostics["columns"]["afl_lambda"].tolist() == [0.25, 0.75]


@pytest.mark.parametrize(
    ("point", "projection"),
    [
        ([0.2, 0.3, 0.5], [0.2, 0.3, 0.5]),  # on the simplex: itself
        ([0.5, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]),
        ([2.0, 0.0, 0.0], [1.0, 0.0, 0.0]),
        ([0.6, 0.3, -0.1], [0.65, 0.35, 0.0]),
        ([-1.0, -2.0], [1.0, 0.0]),
    ],
)
def test_known_projections(point: list[float], projection: list[float]) -> None:
    out = project_to_simplex(torch.tensor(point, dtype=torch.float64))

    np.testing.assert_allclose(out.numpy(), projection, rtol=0, atol=1e-15)


@pytest.mark.parametrize("seed", range(6))
def test_the_projection_is_the_closest_point_of_the_simplex(seed: int) -> None:
    """Against SLSQP on min ‖λ − v‖² s.t. λ ≥ 0, Σλ = 1, and the KKT conditions: λ = max(v −
    θ, 0) for one θ, which the active coordinates share."""
    rng = np.random.default_rng(seed)
    point = rng.normal(scale=2.0, size=7)

    out = project_to_simplex(torch.from_numpy(point)).numpy()

    solved = minimize(
        lambda x: ((x - point) ** 2).sum(), np.full(7, 1 / 7), jac=lambda x: 2 * (x - point),
        bounds=[(0, None)] * 7, constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1}],
        method="SLSQP", options={"ftol": 1e-14, "maxiter": 500},
    )  # fmt: skip
    np.testing.assert_allclose(out, solved.x, atol=1e-6)
    assert out.min() >= 0 and out.sum() == pytest.approx(1.0, abs=1e-12)
    active = out > 0
    thetas = point[active] - out[active]
    np.testing.assert_allclose(thetas, thetas[0], atol=1e-12)
    assert (point[~active] <= thetas[0] + 1e-12).all()


def test_without_ascent_and_uniform_lambda_afl_is_the_plain_mean() -> None:
    generator = torch.Generator().manual_seed(2)
    updates = torch.randn(5, 30, generator=generator, dtype=torch.float64)
    afl = build_aggregator("afl", step_size=0.0)
    state = afl.init_state()

    for round_losses in ([1.0, 2.0, 3.0, 4.0, 5.0], [9.0, 0.1, 0.1, 0.1, 0.1]):
        out, state, _ = afl.step(
            state, updates, client_ids=range(5), losses=torch.tensor(round_losses)
        )
        torch.testing.assert_close(out, build_aggregator("fedavg")(updates), rtol=0, atol=1e-15)
    assert state["lambda"].tolist() == [0.2] * 5


def test_lambda_ascends_along_the_losses_and_weights_the_next_round() -> None:
    """Two rounds written out: λ₁ = Π(λ₀ + γL₁), the second aggregate mixes by λ₁."""
    updates = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    losses = [torch.tensor([0.5, 2.0, 1.0]), torch.tensor([0.1, 0.1, 3.0])]
    afl = build_aggregator("afl", step_size=0.1)
    state = afl.init_state()
    expected = torch.full((3,), 1 / 3, dtype=torch.float64)

    for round_losses in losses:
        out, state, diagnostics = afl.step(
            state, updates, client_ids=[4, 7, 9], losses=round_losses
        )
        torch.testing.assert_close(out, expected @ updates)
        torch.testing.assert_close(diagnostics["effective_weight"], expected)
        expected = project_to_simplex(expected + 0.1 * round_losses.double())
        torch.testing.assert_close(state["lambda"], expected)
    assert state["ids"] == [4, 7, 9] and float(expected[2]) > 1 / 3  # the worst client gained


def test_a_client_absent_from_a_round_keeps_its_weight_out_of_the_mixture() -> None:
    afl = build_aggregator("afl", step_size=0.0)
    three = torch.tensor([[0.0], [3.0], [6.0]], dtype=torch.float64)
    _, state, _ = afl.step(afl.init_state(), three, client_ids=[0, 1, 2], losses=torch.ones(3))

    out, state, diagnostics = afl.step(state, three[1:], client_ids=[1, 2], losses=torch.ones(2))

    assert out.tolist() == [4.5] and diagnostics["effective_weight"].tolist() == [0.5, 0.5]
    assert state["lambda"].tolist() == pytest.approx([1 / 3] * 3)
