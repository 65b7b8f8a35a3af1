"""A faulty client that sends NaN: every entry of its update is ``nan``.

Not an attack from a paper but the commonest real fault (a diverged local run, a broken
serialiser). It checks that the server's non-finite guard and every filter cope.
Shapes ``(n, d), (n,) -> (n, d)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from federated.attacks.base import ModelAttack
from federated.attacks.registry import register_attack

__all__ = ["NaNUpdate"]


@register_attack("nan")
@dataclass(frozen=True, kw_only=True)
class NaNUpdate(ModelAttack):
    """Malicious rows become all ``nan``."""

    def _attack(self, out: Tensor, mask: Tensor, generator: torch.Generator | None) -> None:
        out[mask] = math.nan
