"""Gaussian noise: a malicious client sends random noise instead of (or on top of) Δ.

The "Gaussian attack" of the Byzantine literature (e.g. Li et al. 2019, RSA,
https://arxiv.org/abs/1811.03761; ByzFL's ``Gaussian``), which *replaces* the update by
``N(0, σ²)`` noise per coordinate. ``mode="add"`` instead sends ``Δ + N(0, σ²)``.

Parameters (defaults): ``sigma=1.0`` (> 0), ``mode="replace"`` (``replace`` | ``add``).
Randomness comes only from the ``generator`` passed to :meth:`apply` (required); noise is
drawn on the generator's device and moved to the updates' device, so the same generator
state gives the same noise. Shapes ``(n, d), (n,) -> (n, d)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from federated.attacks.base import ModelAttack
from federated.attacks.registry import register_attack
from registry.constraints import POSITIVE, Options, allowed, check_fields

__all__ = ["GaussianNoise"]

_MODES = ("replace", "add")


@register_attack("gaussian")
@dataclass(frozen=True, kw_only=True)
class GaussianNoise(ModelAttack):
    """Malicious rows become ``N(0, σ²)`` (``replace``) or ``Δ + N(0, σ²)`` (``add``)."""

    sigma: float = field(default=1.0, metadata=allowed(POSITIVE))
    mode: str = field(default="replace", metadata=allowed(Options(_MODES)))

    def __post_init__(self) -> None:
        check_fields(self, "gaussian")

    def _attack(self, out: Tensor, mask: Tensor, generator: torch.Generator | None) -> None:
        if generator is None:
            raise ValueError("the gaussian attack needs a torch.Generator (generator=None given)")
        shape = (int(mask.sum()), out.shape[1])
        noise = torch.randn(shape, generator=generator, device=generator.device, dtype=out.dtype)
        noise = self.sigma * noise.to(out.device)
        out[mask] = noise if self.mode == "replace" else out[mask] + noise
