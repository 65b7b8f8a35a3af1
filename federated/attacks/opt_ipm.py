"""Opt-IPM, ByzFL's optimised inner-product manipulation: ``−τ·mean`` with τ searched per round.

Xie, Koyejo & Gupta 2020, "Fall of Empires: Breaking Byzantine-tolerant SGD by Inner Product
Manipulation" (UAI 2019, https://arxiv.org/abs/1903.03936), as optimised by ByzFL
(``Optimal_InnerProductManipulation``, https://github.com/LPD-EPFL/byzfl). Every malicious row
becomes ``−τ·μ``, μ the mean of the round's benign rows, with τ the factor found by the line
search of :mod:`federated.attacks.line_search` that maximises
``‖aggregate(round with the malicious rows set) − μ‖₂`` for the defence the server runs.
Omniscient (benign rows and defence known).

Parameters (ByzFL's defaults): ``evals=20``, ``start=0.0``, ``delta=10.0``, ``ratio=0.8``.
Needs ``aggregate`` (the server's defence closure); without it :meth:`step` refuses with a
one-line error. Shapes ``(n, d), (n,) -> (n, d)``; diagnostics ``{"factor": τ, "distance":
the objective at τ}``.

Example: benign rows ``[2, 0]`` and ``[0, 4]`` (μ = ``[1, 2]``), one malicious row, defence =
plain mean, ``evals=2``: τ = 0 gives distance ``‖[2/3, 4/3] − μ‖``, τ = 10 a larger one, so the
malicious row is ``−10·μ = [−10, −20]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from federated.attacks.line_search import LineSearchAttack
from federated.attacks.registry import register_attack

__all__ = ["OptimalIPM"]


@register_attack("opt_ipm")
@dataclass(frozen=True, kw_only=True)
class OptimalIPM(LineSearchAttack):
    """Malicious rows become ``−τ·mean`` of the benign rows, τ maximising the damage."""

    def _candidate(self, honest: Tensor, factor: float) -> Tensor:
        return -factor * honest.mean(dim=0)
