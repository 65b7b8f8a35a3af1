"""Scoring rules: hand-computed values and properness (optimum at the true spread)."""

from __future__ import annotations

import pytest
import torch

from federated.fedstnn.losses import build_loss, list_losses
from registry import RegistryError


def _gaussian_samples(scale: float, k: int = 32, b: int = 4000) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return scale * torch.randn(k, b, 1, generator=g)  # (K, B, 1)


def _observations(b: int = 4000) -> torch.Tensor:
    return torch.randn(b, 1, generator=torch.Generator().manual_seed(1))  # N(0, 1)


def test_energy_score_hand_computed():
    samples = torch.tensor([[[0.0]], [[1.0]]])  # K=2, B=1
    target = torch.tensor([[0.0]])

    # mean |X - y| = 0.5; fair spread term = |0 - 1| * 2 / (2 * 2 * 1) = 0.5
    assert build_loss("energy_score")(samples, target) == pytest.approx(0.0)
    assert build_loss("energy_score")(samples, torch.tensor([[2.0]])) == pytest.approx(1.0)


def test_energy_score_multivariate_uses_euclidean_norm():
    samples = torch.tensor([[[0.0, 0.0]], [[3.0, 4.0]]])
    target = torch.tensor([[0.0, 0.0]])

    # (0 + 5) / 2 - 5 * 2 / 4 = 0
    assert build_loss("energy_score")(samples, target) == pytest.approx(0.0)


@pytest.mark.parametrize("name", ["energy_score", "gaussian_nll"])
def test_proper_scores_are_smallest_at_the_true_spread(name):
    loss, y = build_loss(name), _observations()

    scores = {s: float(loss(_gaussian_samples(s), y)) for s in (0.5, 1.0, 2.0)}

    assert scores[1.0] < scores[0.5] and scores[1.0] < scores[2.0]


def test_the_papers_squared_error_prefers_zero_spread_and_takes_one_path():
    y, loss = _observations(), build_loss("squared_error")

    scores = [float(loss(_gaussian_samples(s), y)) for s in (0.0, 0.5, 1.0)]
    one_path = loss(torch.tensor([[[1.0]], [[3.0]]])[:1], torch.tensor([[0.0]]))

    assert scores == sorted(scores)  # grows with the spread: its optimum is no diffusion
    assert float(one_path) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="K >= 2"):
        build_loss("energy_score")(torch.zeros(1, 3, 1), torch.zeros(3, 1))


def test_energy_score_gradient_finite_when_paths_coincide():
    samples = torch.zeros(4, 3, 2, requires_grad=True)

    build_loss("energy_score")(samples, torch.ones(3, 2)).backward()

    assert torch.isfinite(samples.grad).all()


def test_registry_lists_and_rejects():
    assert list_losses() == ["energy_score", "gaussian_nll", "squared_error"]
    with pytest.raises(RegistryError, match="energy_score"):
        build_loss("mse")
    with pytest.raises(RegistryError, match="beta"):
        build_loss("energy_score", beta=2.0)
