"""ALIE, "A Little Is Enough": malicious clients send ``mean - z · std`` per coordinate.

Baruch, Baruch & Goldberg 2019, "A Little Is Enough: Circumventing Defenses For
Distributed Learning" (NeurIPS, https://arxiv.org/abs/1902.06156). The attackers estimate
the per-coordinate mean μ_j and standard deviation σ_j of the updates and all send
``μ - z·σ``, a small shift that stays inside the benign spread. With ``n`` clients in the
round and ``f`` of them malicious, the paper's ``z_max`` is
``s = ⌊n/2 + 1⌋ - f`` (benign supporters needed for a majority) and
``z = Φ⁻¹((n - s) / n)``; e.g. ``n=50, f=24 -> s=2, z = Φ⁻¹(0.96) ≈ 1.7507``.

Parameters (defaults): ``z=None`` (None: the formula above, from the round's ``n`` and
``f = malicious_mask.sum()``; a float: used as is), ``reference="benign"``: μ, σ over the
benign rows (omniscient), or ``"all"``: over all rows before the attack (the malicious
clients' own honest updates included). σ is the sample standard deviation (Bessel's
correction, as in ByzFL and the authors' code); 0 when the reference has one row.
Shapes ``(n, d), (n,) -> (n, d)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import torch
from torch import Tensor

from federated.attacks.base import ModelAttack
from federated.attacks.registry import register_attack
from registry.constraints import Interval, Options, allowed, check_fields

__all__ = ["ALittleIsEnough", "alie_z"]

_REFERENCES = ("benign", "all")


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s ``z_max`` for ``n`` clients of which ``f`` are malicious."""
    if not 0 <= f <= n or n < 1:
        raise ValueError(f"ALIE needs 0 <= f <= n and n >= 1, got n={n}, f={f}")
    s = math.floor(n / 2 + 1) - f
    if s < 1:
        raise ValueError(
            f"ALIE's z formula needs f < floor(n/2 + 1) (an honest majority to sway); got "
            f"n={n}, f={f}; pass z explicitly"
        )
    return NormalDist().inv_cdf((n - s) / n)


@register_attack("alie")
@dataclass(frozen=True, kw_only=True)
class ALittleIsEnough(ModelAttack):
    """Malicious rows become ``mean - z * std`` of the reference rows, per coordinate."""

    # None: the paper's formula from the round's n and f
    z: float | None = field(default=None, metadata=allowed(Interval(float), None))
    reference: str = field(default="benign", metadata=allowed(Options(_REFERENCES)))

    def __post_init__(self) -> None:
        check_fields(self, "alie")

    def _attack(self, out: Tensor, mask: Tensor, generator: torch.Generator | None) -> None:
        n, f = out.shape[0], int(mask.sum())
        z = alie_z(n, f) if self.z is None else self.z
        rows = out[~mask] if self.reference == "benign" else out
        if rows.shape[0] == 0:
            raise ValueError("alie with reference='benign' needs a benign update in the round")
        mean = rows.mean(dim=0)
        std = rows.std(dim=0, correction=1 if rows.shape[0] > 1 else 0)
        out[mask] = mean - z * std
