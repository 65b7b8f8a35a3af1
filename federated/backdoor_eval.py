"""Evaluating a backdoor: the triggered test set and the attack success rate (ASR).

The ASR (Bagdasaryan et al. 2020, "How To Backdoor Federated Learning",
https://arxiv.org/abs/1807.00459; "backdoor accuracy") is the share of triggered test images
that the model classifies as the attacker's target. Only images whose true label is not the
target count: a correct prediction of a target-class image is no success. Report it beside
the clean accuracy on the untouched test set.

>>> triggered = triggered_test_set(test_images, test_labels, backdoor)   # (M, C, H, W)
>>> asr = attack_success_rate(model, triggered, backdoor.target_label)  # in [0, 1]
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from federated.attacks.backdoor import Backdoor

__all__ = ["attack_success_rate", "triggered_test_set"]


def triggered_test_set(images: Tensor, labels: Tensor, backdoor: Backdoor) -> Tensor:
    """The test images ``(N, C, H, W)`` whose label ``(N,)`` or ``(N, 1)`` is not the target,
    with the backdoor's trigger stamped: ``(M, C, H, W)``; the inputs are not modified."""
    if labels.ndim not in (1, 2) or (labels.ndim == 2 and labels.shape[1] != 1):
        raise ValueError(
            f"the attack success rate needs single-label class ids, got {tuple(labels.shape)}"
        )
    keep = labels.reshape(-1) != backdoor.target_label
    return backdoor.stamp(images[keep.to(images.device)])


@torch.no_grad()
def attack_success_rate(
    model: nn.Module, triggered_images: Tensor, target_label: int, *, batch_size: int = 512
) -> float:
    """Share of ``triggered_images`` that ``model`` (put in eval mode) assigns ``target_label``."""
    if len(triggered_images) == 0:
        raise ValueError("no triggered images: every test label is the target class")
    model.eval()
    hits = sum(
        int((model(triggered_images[i : i + batch_size]).argmax(dim=1) == target_label).sum())
        for i in range(0, len(triggered_images), batch_size)
    )
    return hits / len(triggered_images)
