"""Scaling (boosting): a malicious client sends ``factor * Δ``.

Model-replacement style boosting (Bagdasaryan et al. 2020, "How To Backdoor Federated
Learning", https://arxiv.org/abs/1807.00459; Bhagoji et al. 2019, "Analyzing Federated
Learning through an Adversarial Lens", https://arxiv.org/abs/1811.12470), here untargeted:
the honest update is boosted.

Parameters (defaults): ``factor=10.0`` (> 0). Shapes ``(n, d), (n,) -> (n, d)``.
Example: row ``[1, -2]`` with ``factor=10`` -> ``[10, -20]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from federated.attacks.base import ModelAttack
from federated.attacks.registry import register_attack

__all__ = ["Scaling"]


@register_attack("scaling")
@dataclass(frozen=True, kw_only=True)
class Scaling(ModelAttack):
    """Malicious rows become ``factor * Δ``."""

    factor: float = 10.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"scaling factor must be finite and > 0, got {self.factor}")

    def _attack(self, out: Tensor, mask: Tensor, generator: torch.Generator | None) -> None:
        out[mask] = self.factor * out[mask]
