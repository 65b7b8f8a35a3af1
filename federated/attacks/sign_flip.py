"""Sign flipping: a malicious client sends ``-scale * Δ`` instead of its update ``Δ``.

A classic Byzantine baseline (e.g. Allen-Zhu et al. 2021, "Byzantine-Resilient Non-Convex
Stochastic Gradient Descent", https://arxiv.org/abs/2012.14368; ByzFL's ``SignFlipping``).

Parameters (defaults): ``scale=1.0`` (> 0). Shapes ``(n, d), (n,) -> (n, d)``.
Example: row ``[1, -2]`` with ``scale=2`` -> ``[-2, 4]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from federated.attacks.base import ModelAttack
from federated.attacks.registry import register_attack
from registry.constraints import POSITIVE, allowed, check_fields

__all__ = ["SignFlip"]


@register_attack("sign_flip")
@dataclass(frozen=True, kw_only=True)
class SignFlip(ModelAttack):
    """Malicious rows become ``-scale * Δ``."""

    scale: float = field(default=1.0, metadata=allowed(POSITIVE))

    def __post_init__(self) -> None:
        check_fields(self, "sign_flip")

    def _attack(self, out: Tensor, mask: Tensor, generator: torch.Generator | None) -> None:
        out[mask] = -self.scale * out[mask]
