"""ByzFL's optimised attacks: one attack factor per round, chosen against the server's defence.

ByzFL (EPFL, https://github.com/LPD-EPFL/byzfl, ``Optimal_ALittleIsEnough`` and
``Optimal_InnerProductManipulation``; used in Allouah et al. 2023, "Fixing by Mixing",
https://arxiv.org/abs/2302.01772) turns a one-parameter attack ``v(τ)`` into an adaptive one:
every round the attackers try factors ``τ``, put ``v(τ)`` in every malicious row, run the
server's defence (pre-aggregators and rule) on the round and keep the ``τ`` that moves the
aggregate furthest (L2) from the mean of the honest updates. Omniscient: the attackers read
the honest rows and know the defence.

The search is ByzFL's bounded line search (:func:`line_maximize`), ``evals`` evaluations of
the objective: from ``start``, step up by ``delta`` and double the step while the objective
strictly improves (expansion); at the first failure multiply the step by ``ratio`` and from
then on probe ``best + step`` with the step shrinking by ``ratio`` after every probe
(contraction). As in ByzFL, the contraction only probes above the best factor; a negative
``delta`` searches downwards. Ties keep the earlier factor.

Parameters (ByzFL's defaults): ``evals=20`` (>= 1), ``start=0.0``, ``delta=10.0`` (finite,
non-zero), ``ratio=0.8`` (in (0.5, 1)). Each evaluation runs the server's defence once, so a
round costs ``evals`` aggregations.

Example: objective ``min(τ, 25)`` (an aggregate that saturates, as the median does), ``evals=4``:
``τ = 0 -> 0``; ``10 -> 10`` (better, step doubles to 20); ``30 -> 25`` (better, step 40);
``70 -> 25`` (not better): ``τ = 30``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from federated.attacks.base import AttackRound, AttackState, ModelAttack
from registry.constraints import Interval, allowed, check_fields

__all__ = ["LineSearchAttack", "line_maximize"]


def line_maximize(
    objective: Callable[[float], float], *, evals: int, start: float, delta: float, ratio: float
) -> tuple[float, float]:
    """ByzFL's bounded line search: ``(best factor, its objective)`` after ``evals`` calls."""
    best_x, best_y = start, objective(start)
    step, expanding = delta, True
    for _ in range(evals - 1):
        x = best_x + step
        y = objective(x)
        improved = y > best_y
        if improved:
            best_x, best_y = x, y
        expanding = expanding and improved
        step *= 2.0 if expanding else ratio
    return best_x, best_y


@dataclass(frozen=True, kw_only=True)
class LineSearchAttack(ModelAttack):
    """Base of the optimised attacks: subclasses give the malicious row ``_candidate``."""

    requires_aggregate = True

    evals: int = field(default=20, metadata=allowed(Interval(int, 1)))
    start: float = field(default=0.0, metadata=allowed(Interval(float)))
    delta: float = 10.0  # finite and non-zero: checked below
    ratio: float = field(default=0.8, metadata=allowed(Interval(float, 0.5, 1, closed="neither")))

    def __post_init__(self) -> None:
        check_fields(self)
        if not math.isfinite(self.delta) or self.delta == 0:
            raise ValueError(f"delta must be finite and non-zero, got {self.delta}")

    def _candidate(self, honest: Tensor, factor: float) -> Tensor:
        """The malicious row ``(d,)`` for attack factor ``factor`` from the honest rows."""
        raise NotImplementedError

    def _attack_round(
        self, state: AttackState, rnd: AttackRound
    ) -> tuple[AttackState, dict[str, float]]:
        aggregate = rnd.aggregate
        assert aggregate is not None  # ModelAttack.step refuses None for requires_aggregate
        honest = rnd.benign(type(self).__name__)
        honest_mean = honest.mean(dim=0)
        trial = rnd.out.clone()

        def distance(factor: float) -> float:
            trial[rnd.mask] = self._candidate(honest, factor)
            moved = aggregate(trial).to(honest_mean.dtype) - honest_mean
            return float(torch.linalg.vector_norm(moved))

        factor, moved = line_maximize(
            distance, evals=self.evals, start=self.start, delta=self.delta, ratio=self.ratio
        )
        rnd.out[rnd.mask] = self._candidate(honest, factor)
        return state, {"factor": factor, "distance": moved}
