"""Opt-ALIE, ByzFL's optimised "A Little Is Enough": ``mean + τ·std`` with τ searched per round.

Baruch, Baruch & Goldberg 2019, "A Little Is Enough: Circumventing Defenses For Distributed
Learning" (NeurIPS, https://arxiv.org/abs/1902.06156), as optimised by ByzFL
(``Optimal_ALittleIsEnough``, https://github.com/LPD-EPFL/byzfl). Every malicious row becomes
``μ + τ·σ``, with μ and σ the per-coordinate mean and sample standard deviation (Bessel's
correction; 0 with a single row) of the round's benign rows, and τ the factor found by the
line search of :mod:`federated.attacks.line_search` that maximises
``‖aggregate(round with the malicious rows set) − μ‖₂`` for the defence the server runs.
Omniscient (benign rows and defence known). ByzFL's sign: ``+τ·σ`` with τ searched upwards
from ``start``; the plain ``alie`` attack sends ``μ − z·σ`` (a negative ``delta`` searches that
side).

Parameters (ByzFL's defaults): ``evals=20``, ``start=0.0``, ``delta=10.0``, ``ratio=0.8``.
Needs ``aggregate`` (the server's defence closure); without it :meth:`step` refuses with a
one-line error rather than optimise against a defence the server does not run. Shapes
``(n, d), (n,) -> (n, d)``; diagnostics ``{"factor": τ, "distance": the objective at τ}``.

Example: benign rows ``[0, 0]`` and ``[2, 4]`` (μ = ``[1, 2]``, σ = ``[√2, 2√2]``), one
malicious row, defence = plain mean, ``evals=3``: the distance grows with τ, so the search
tries 0, 10, 30 and the malicious row is ``μ + 30·σ ≈ [43.43, 86.85]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from federated.attacks.line_search import LineSearchAttack
from federated.attacks.registry import register_attack

__all__ = ["OptimalALIE"]


@register_attack("opt_alie")
@dataclass(frozen=True, kw_only=True)
class OptimalALIE(LineSearchAttack):
    """Malicious rows become ``mean + τ·std`` of the benign rows, τ maximising the damage."""

    def _candidate(self, honest: Tensor, factor: float) -> Tensor:
        std = honest.std(dim=0, correction=1 if honest.shape[0] > 1 else 0)
        return honest.mean(dim=0) + factor * std
