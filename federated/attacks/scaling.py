"""Scaling (boosting): a malicious client sends ``factor * Δ``.

Model-replacement style boosting (Bagdasaryan et al. 2020, "How To Backdoor Federated
Learning", https://arxiv.org/abs/1807.00459; Bhagoji et al. 2019, "Analyzing Federated
Learning through an Adversarial Lens", https://arxiv.org/abs/1811.12470), here untargeted:
the honest update is boosted.

Parameters (defaults): ``factor=10.0`` (> 0). Shapes ``(n, d), (n,) -> (n, d)``.
Example: row ``[1, -2]`` with ``factor=10`` -> ``[10, -20]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from federated.attacks.base import ModelAttack
from federated.attacks.registry import register_attack
from registry.constraints import POSITIVE, allowed, check_fields

__all__ = ["Scaling"]


@register_attack("scaling")
@dataclass(frozen=True, kw_only=True)
class Scaling(ModelAttack):
    """Malicious rows become ``factor * Δ``."""

    factor: float = field(default=10.0, metadata=allowed(POSITIVE))

    def __post_init__(self) -> None:
        check_fields(self, "scaling")

    def _attack(self, out: Tensor, mask: Tensor, generator: torch.Generator | None) -> None:
        out[mask] = self.factor * out[mask]
