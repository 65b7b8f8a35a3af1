"""Algorithms 3–4: client losses, coefficient of variation, verdict, z-score exclusion."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from federated.stats import (
    client_losses,
    coefficient_of_variation,
    loss_zscores,
    noniid_exclusions,
    noniid_verdict,
)


def test_cv_hand_computed() -> None:
    # μ = 2.5, population σ = sqrt((2.25 + 0.25 + 0.25 + 2.25)/4) = sqrt(1.25)
    assert coefficient_of_variation([1.0, 2.0, 3.0, 4.0]) == pytest.approx(math.sqrt(1.25) / 2.5)
    assert coefficient_of_variation(torch.tensor([2.0, 2.0, 2.0])) == 0.0
    assert coefficient_of_variation([0.0, 0.0]) == 0.0


def test_cv_is_scale_invariant() -> None:
    losses = np.array([0.3, 0.9, 0.4, 1.7])
    assert coefficient_of_variation(7.0 * losses) == pytest.approx(coefficient_of_variation(losses))


def test_verdict_is_strict_at_the_threshold() -> None:
    # μ = 1, σ = 0.25 exactly: CV = 0.25 is not > 0.25
    at = noniid_verdict([0.75, 1.25], threshold=0.25)
    above = noniid_verdict([1.0, 2.0, 3.0, 4.0])

    assert (at.cv, at.verdict) == (0.25, "iid")
    assert above.verdict == "non_iid" and above.threshold == 0.25
    summary = above.to_dict()
    assert summary["verdict"] == "non_iid" and summary["losses"] == [1.0, 2.0, 3.0, 4.0]
    assert summary["mean"] == 2.5 and summary["std"] == pytest.approx(math.sqrt(1.25))


def test_zscore_exclusion_hand_computed() -> None:
    # μ = 1.8, σ = sqrt((4 * 0.64 + 10.24)/5) = 1.6: z = [-0.5, -0.5, -0.5, -0.5, 2.0]
    losses = [1.0, 1.0, 1.0, 1.0, 5.0]

    z = loss_zscores(losses)

    np.testing.assert_allclose(z, [-0.5, -0.5, -0.5, -0.5, 2.0], rtol=1e-12)
    np.testing.assert_array_equal(noniid_exclusions(losses, 1.5), [True] * 4 + [False])
    np.testing.assert_array_equal(noniid_exclusions(losses, 2.5), [True] * 5)
    # one-sided: a client the model fits unusually well (z = -2) is kept
    np.testing.assert_array_equal(noniid_exclusions([5.0, 5.0, 5.0, 5.0, 1.0], 1.5), [True] * 5)


def test_zero_spread_keeps_everyone() -> None:
    np.testing.assert_array_equal(noniid_exclusions([0.4, 0.4, 0.4], 0.0), [True] * 3)


@pytest.mark.parametrize("bad", [[], [1.0, -0.1], [1.0, float("nan")]])
def test_invalid_losses_are_errors(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="losses"):
        noniid_verdict(bad)


# ------------------------------------------------------------------------- client_losses


def _model() -> nn.Module:
    """logits = first three pixels of a (1, 2, 2) image: W = [I_3 | 0], b = 0."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    with torch.no_grad():
        model[1].weight.copy_(torch.cat([torch.eye(3), torch.zeros(3, 1)], dim=1))
        model[1].bias.zero_()
    return model


def _images(logits: list[list[float]]) -> torch.Tensor:
    x = torch.zeros(len(logits), 1, 2, 2)
    x.view(len(logits), 4)[:, :3] = torch.tensor(logits)
    return x


LN2, LN3 = math.log(2.0), math.log(3.0)
# softmax([0, ln2, 0]) = [1/4, 1/2, 1/4]; softmax([ln3, 0, 0]) = [3/5, 1/5, 1/5]
CLIENT_A = (_images([[0.0, LN2, 0.0], [0.0, LN2, 0.0]]), torch.tensor([1, 0]))
CLIENT_B = (_images([[LN3, 0.0, 0.0], [0.0, LN2, 0.0], [LN3, 0.0, 0.0]]), torch.tensor([0, 2, 1]))


def test_client_losses_mse_hand_computed() -> None:
    sq = {  # squared error summed over the 3 classes
        ("a", 1): 1 / 16 + 1 / 4 + 1 / 16,
        ("a", 0): 9 / 16 + 1 / 4 + 1 / 16,
        ("b", 0): 4 / 25 + 1 / 25 + 1 / 25,
        ("b", 2): 1 / 16 + 1 / 4 + 9 / 16,
        ("b", 1): 9 / 25 + 16 / 25 + 1 / 25,
    }
    expected_a = (sq["a", 1] + sq["a", 0]) / (2 * 3)
    expected_b = (sq["b", 0] + sq["b", 2] + sq["b", 1]) / (3 * 3)

    losses = client_losses(_model(), [CLIENT_A, CLIENT_B], loss="mse", batch_size=2)

    np.testing.assert_allclose(losses, [expected_a, expected_b], rtol=1e-6)


def test_client_losses_cross_entropy_hand_computed() -> None:
    expected_a = (math.log(2) + math.log(4)) / 2
    expected_b = (-math.log(3 / 5) - math.log(1 / 4) - math.log(1 / 5)) / 3

    losses = client_losses(_model(), [CLIENT_A, CLIENT_B], loss="cross_entropy", batch_size=1)

    np.testing.assert_allclose(losses, [expected_a, expected_b], rtol=1e-6)


def test_client_losses_batching_labels_and_mode() -> None:
    model = _model().train()
    x, y = CLIENT_B

    one = client_losses(model, [(x, y)], batch_size=1)
    big = client_losses(model, [(x, y[:, None])], batch_size=256)

    np.testing.assert_allclose(one, big, rtol=1e-6)  # float32 sums, batch order
    assert model.training


def test_client_losses_errors() -> None:
    model = _model()
    with pytest.raises(ValueError, match="no samples"):
        client_losses(model, [(torch.zeros(0, 1, 2, 2), torch.zeros(0, dtype=torch.long))])
    with pytest.raises(ValueError, match="loss must be"):
        client_losses(model, [CLIENT_A], loss="l1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="client 0"):
        client_losses(model, [(CLIENT_A[0], torch.tensor([1, 0, 2]))])
