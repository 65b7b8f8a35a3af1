"""IPM, inner-product manipulation: every malicious client sends ``-ε · mean(benign Δ)``.

Xie, Koyejo & Gupta 2020, "Fall of Empires: Breaking Byzantine-tolerant SGD by Inner
Product Manipulation" (UAI 2019, https://arxiv.org/abs/1903.03936). Omniscient: the
attackers see the benign updates of the round (rows where ``malicious_mask`` is False).
With a small ε (the paper's 0.1) the aggregate keeps a small norm but a negative inner
product with the true gradient; with a large ε (the paper's 100) it reverses it.

Parameters (defaults): ``epsilon=0.5`` (> 0). Shapes ``(n, d), (n,) -> (n, d)``.
Example: benign rows ``[2, 0]`` and ``[0, 4]``, ``epsilon=0.5`` -> malicious ``[-0.5, -1]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from federated.attacks.base import ModelAttack
from federated.attacks.registry import register_attack
from registry.constraints import POSITIVE, allowed, check_fields

__all__ = ["InnerProductManipulation"]


@register_attack("ipm")
@dataclass(frozen=True, kw_only=True)
class InnerProductManipulation(ModelAttack):
    """Malicious rows become ``-epsilon * mean of the benign rows``."""

    epsilon: float = field(default=0.5, metadata=allowed(POSITIVE))

    def __post_init__(self) -> None:
        check_fields(self, "ipm")

    def _attack(self, out: Tensor, mask: Tensor, generator: torch.Generator | None) -> None:
        benign = ~mask
        if not bool(benign.any()):
            raise ValueError("ipm needs at least one benign update in the round (all malicious)")
        out[mask] = -self.epsilon * out[benign].mean(dim=0)
