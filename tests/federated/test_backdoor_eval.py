"""The triggered test set and the attack success rate on hand-made models."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from federated.attacks import build_attack
from federated.backdoor_eval import attack_success_rate, triggered_test_set


class CornerDetector(nn.Module):
    """Predicts class 0 when the bottom-right pixel is bright, class 1 otherwise."""

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, 2)
        bright = (x[:, 0, -2, -2] > 0.5).float()
        return torch.stack([bright, 1 - bright], dim=1)


def test_triggered_set_keeps_non_target_images_and_stamps_them() -> None:
    images = torch.zeros(4, 1, 6, 6)
    labels = torch.tensor([[0], [1], [1], [0]])  # MedMNIST layout
    backdoor = build_attack("backdoor", target_label=0, size=2)

    triggered = triggered_test_set(images, labels, backdoor)

    assert triggered.shape == (2, 1, 6, 6)
    assert torch.equal(triggered, backdoor.stamp(images[1:3]))
    assert int(images.count_nonzero()) == 0


def test_asr_is_the_share_classified_as_the_target() -> None:
    backdoor = build_attack("backdoor", target_label=0, size=2)
    stamped = triggered_test_set(torch.zeros(5, 1, 6, 6), torch.ones(5), backdoor)
    half = torch.cat([stamped[:2], torch.zeros(3, 1, 6, 6)])

    assert attack_success_rate(CornerDetector(), stamped, 0) == 1.0
    assert attack_success_rate(CornerDetector(), stamped, 1) == 0.0
    assert attack_success_rate(CornerDetector(), half, 0, batch_size=2) == pytest.approx(0.4)


def test_asr_needs_a_triggered_image() -> None:
    with pytest.raises(ValueError, match="every test label is the target"):
        attack_success_rate(CornerDetector(), torch.zeros(0, 1, 6, 6), 0)
