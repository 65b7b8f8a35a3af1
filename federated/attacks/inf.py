"""Inf: every entry of a malicious update is ``+inf``.

ByzFL's ``Inf`` attack (https://github.com/LPD-EPFL/byzfl): the crudest Byzantine update, a
row of positive infinities. Like :mod:`federated.attacks.nan` it tests the server's
non-finite guard (today's server drops such rows as ``non_finite`` before any filter or rule)
and any rule run without that guard. Shapes ``(n, d), (n,) -> (n, d)``.

Example: rows ``[1, -2]`` (malicious), ``[0, 4]`` -> ``[inf, inf]``, ``[0, 4]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from federated.attacks.base import ModelAttack
from federated.attacks.registry import register_attack

__all__ = ["InfUpdate"]


@register_attack("inf")
@dataclass(frozen=True, kw_only=True)
class InfUpdate(ModelAttack):
    """Malicious rows become all ``+inf``."""

    def _attack(self, out: Tensor, mask: Tensor, generator: torch.Generator | None) -> None:
        out[mask] = math.inf
