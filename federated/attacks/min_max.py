"""Min-Max and Min-Sum: the benign mean pushed as far as a distance budget allows.

Shejwalkar & Houmansadr 2021, "Manipulating the Byzantine: Optimizing Model Poisoning
Attacks and Defenses for Federated Learning" (NDSS, https://doi.org/10.14722/ndss.2021.24498),
the two AGR-agnostic attacks of Section IV with Algorithm 1. Omniscient: the attackers read
the round's benign rows ``x_1..x_m`` (rows where ``malicious_mask`` is False) but need not
know the defence. Every malicious row becomes ``m(γ) = x̄ − γ·p`` with ``x̄`` the benign mean
and the perturbation ``p`` (``perturbation``): ``"unit_vec"`` ``x̄/‖x̄‖`` (zero if ``x̄ = 0``),
``"std"`` the per-coordinate sample standard deviation (needs two benign rows), or
``"sign"`` ``sign(x̄)``; γ is the largest value the halving search finds for which

- ``min_max``: ``max_i ‖m − x_i‖ ≤ max_{i,j} ‖x_i − x_j‖`` (no farther from any benign row
  than the two farthest benign rows are from each other);
- ``min_sum``: ``Σ_i ‖m − x_i‖² ≤ max_i Σ_j ‖x_i − x_j‖²`` (``bound="max"``, the paper's
  equation) or ``≤ min_i Σ_j ‖x_i − x_j‖²`` (``bound="min"``, the authors' released code).

γ = 0 (the benign mean) always satisfies both. Halving search (Algorithm 1, as released):
``γ = gamma_init``, ``step = gamma_init``, ``γ_ok = 0``; while ``|γ_ok − γ| > tolerance``:
``step /= 2``; if ``m(γ)`` satisfies the bound then ``γ_ok = γ, γ += step`` else
``γ −= step``. The result is ``γ_ok`` (so γ < 2·gamma_init).

Parameters (the authors' defaults): ``perturbation="unit_vec"``, ``gamma_init=10.0`` (> 0),
``tolerance=1e-5`` (> 0); ``min_sum`` also ``bound="max"``. Shapes ``(n, d), (n,) ->
(n, d)``; diagnostics ``{"gamma": γ}``.

Example (1-D, benign rows 0, 1, 5: mean 2, ``unit_vec`` p = 1, so m = 2 − γ): min_max's
budget is 5 and the farthest row is 5, at distance 3 + γ: γ = 2, m = 0. min_sum: the sums
over benign rows are 26, 17, 41 and ``Σ_i (m − x_i)² = 14 + 3γ²``: γ = 3 (m = −1) with
``bound="max"``, γ = 1 (m = 1) with ``bound="min"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from federated.attacks.base import AttackRound, AttackState, ModelAttack
from federated.attacks.registry import register_attack
from registry.constraints import POSITIVE, Options, allowed, check_fields

__all__ = ["MinMax", "MinSum", "halving_search", "perturbation_direction"]

_PERTURBATIONS = ("unit_vec", "std", "sign")
_BOUNDS = ("max", "min")


def halving_search(
    feasible: Callable[[float], bool], *, gamma_init: float, tolerance: float
) -> float:
    """Algorithm 1 of Shejwalkar & Houmansadr: the largest feasible γ it finds (0 if none)."""
    gamma, step, succeeded = gamma_init, gamma_init, 0.0
    while abs(succeeded - gamma) > tolerance and step > 0:
        step /= 2
        if feasible(gamma):
            succeeded, gamma = gamma, gamma + step
        else:
            gamma -= step
    return succeeded


def perturbation_direction(honest: Tensor, kind: str) -> Tensor:
    """The direction ``p`` ``(d,)`` subtracted from the benign mean (``m = x̄ − γ·p``)."""
    mean = honest.mean(dim=0)
    if kind == "unit_vec":
        norm = torch.linalg.vector_norm(mean)
        return mean / norm if float(norm) > 0 else torch.zeros_like(mean)
    if kind == "sign":
        return torch.sign(mean)
    if honest.shape[0] < 2:
        raise ValueError(
            "perturbation='std' needs at least two benign updates in the round; use unit_vec or sign"
        )
    return honest.std(dim=0, correction=1)


def _pairwise(honest: Tensor) -> Tensor:
    """Exact pairwise L2 distances ``(m, m)`` between benign rows."""
    return torch.cdist(honest, honest, compute_mode="donot_use_mm_for_euclid_dist")


@dataclass(frozen=True, kw_only=True)
class DistanceBudgetAttack(ModelAttack):
    """Shared search of min_max and min_sum; subclasses define the budget and the score."""

    perturbation: str = field(default="unit_vec", metadata=allowed(Options(_PERTURBATIONS)))
    gamma_init: float = field(default=10.0, metadata=allowed(POSITIVE))
    tolerance: float = field(default=1e-5, metadata=allowed(POSITIVE))

    def __post_init__(self) -> None:
        check_fields(self)  # a subclass's declared fields too (min_sum's bound)

    def _budget(self, honest: Tensor) -> float:
        raise NotImplementedError

    def _score(self, candidate: Tensor, honest: Tensor) -> float:
        raise NotImplementedError

    def _attack_round(
        self, state: AttackState, rnd: AttackRound
    ) -> tuple[AttackState, dict[str, float]]:
        honest = rnd.benign(type(self).__name__)
        mean, direction = honest.mean(dim=0), perturbation_direction(honest, self.perturbation)
        budget = self._budget(honest)
        gamma = halving_search(
            lambda g: self._score(mean - g * direction, honest) <= budget,
            gamma_init=self.gamma_init,
            tolerance=self.tolerance,
        )
        rnd.out[rnd.mask] = mean - gamma * direction
        return state, {"gamma": gamma}


@register_attack("min_max")
@dataclass(frozen=True, kw_only=True)
class MinMax(DistanceBudgetAttack):
    """Farthest distance to a benign row within the benign rows' diameter."""

    def _budget(self, honest: Tensor) -> float:
        return float(_pairwise(honest).max())

    def _score(self, candidate: Tensor, honest: Tensor) -> float:
        return float(torch.linalg.vector_norm(honest - candidate, dim=1).max())


@register_attack("min_sum")
@dataclass(frozen=True, kw_only=True)
class MinSum(DistanceBudgetAttack):
    """Sum of squared distances to the benign rows within a benign row's own sum."""

    bound: str = field(default="max", metadata=allowed(Options(_BOUNDS)))

    def _budget(self, honest: Tensor) -> float:
        sums = _pairwise(honest).square().sum(dim=1)
        return float(sums.max() if self.bound == "max" else sums.min())

    def _score(self, candidate: Tensor, honest: Tensor) -> float:
        return float((honest - candidate).square().sum())
