"""Mimic: every malicious client sends a copy of one honest client's update.

Karimireddy, He & Jaggi 2022, "Byzantine-Robust Learning on Heterogeneous Datasets via
Bucketing" (ICLR, https://arxiv.org/abs/2006.09365), with ByzFL's definition
(``Mimic`` + the ``WorkerWithMaxVariance`` heuristic, https://github.com/LPD-EPFL/byzfl).
Copies of a real update pass every filter, yet over-weighting one client of a heterogeneous
federation biases the aggregate towards that client's data. Omniscient: the attackers read
the round's benign rows.

Which honest row is copied (ByzFL's heuristic): the attackers learn, over their first
``warmup`` rounds, the direction ``z`` of largest variance of the honest updates by an
averaged power iteration. In learning round ``t`` (0-based) with benign rows ``x_i`` and their
mean ``x̄``: ``μ ← (t·μ + x̄)/(t + 1)`` (running mean), ``c = Σ_i ⟨x_i − μ, z⟩ (x_i − μ)``,
``z ← (t·z + c/‖c‖)/(t + 1)``, normalised (``z`` starts as a random Gaussian direction from the
round's generator; a zero ``c`` leaves ``z`` as it is). While learning they copy the first benign
row; afterwards the benign row with the largest ``|⟨x_i, z⟩|``. ``warmup=None`` always copies
the first benign row (ByzFL's ``Mimic(epsilon=0)`` without the heuristic). The original code
of Karimireddy et al. instead copies the argmax of ``⟨x_i, z⟩`` while learning and then keeps
that client; ByzFL's variant suits sampled clients, whose row positions change every round.

Parameters (defaults): ``warmup=20`` (ByzFL's ``steps_to_learn`` example; >= 1, or None).
State (``init_state()``): ``{"round": rounds attacked so far, "mean": μ or None, "direction":
z or None}``; it advances only in rounds with a malicious row. Shapes ``(n, d), (n,) ->
(n, d)``; diagnostics ``{"mimicked_row": the copied row's index in the round}``.

Example (after learning, ``z = [1, 0]``): benign rows ``[0.5, 3]``, ``[-2, 0]``, ``[1, 1]`` ->
``|⟨x_i, z⟩| = 0.5, 2, 1``: every malicious row becomes ``[-2, 0]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from federated.attacks.base import AttackRound, AttackState, ModelAttack
from federated.attacks.registry import register_attack
from registry.constraints import Interval, allowed, check_fields

__all__ = ["Mimic", "learn_direction"]


def learn_direction(
    honest: Tensor, mean: Tensor, direction: Tensor, learned_rounds: int
) -> tuple[Tensor, Tensor]:
    """One learning round of the heuristic: the new running mean and unit direction."""
    t = learned_rounds
    mean = (t * mean + honest.mean(dim=0)) / (t + 1)
    deviations = honest - mean  # (m, d)
    pull = (deviations @ direction) @ deviations  # Σ_i ⟨x_i − μ, z⟩ (x_i − μ)
    norm = torch.linalg.vector_norm(pull)
    if float(norm) == 0.0:
        return mean, direction
    blended = (t * direction + pull / norm) / (t + 1)
    return mean, blended / torch.linalg.vector_norm(blended)


@register_attack("mimic")
@dataclass(frozen=True, kw_only=True)
class Mimic(ModelAttack):
    """Malicious rows copy the honest row of largest variance along a learned direction."""

    # rounds spent learning the direction (None: always copy the first benign row)
    warmup: int | None = field(default=20, metadata=allowed(Interval(int, 1), None))

    def __post_init__(self) -> None:
        check_fields(self, "mimic")

    def init_state(self) -> AttackState:
        return {"round": 0, "mean": None, "direction": None}

    def _attack_round(
        self, state: AttackState, rnd: AttackRound
    ) -> tuple[AttackState, dict[str, float]]:
        honest = rnd.benign("mimic")
        benign_rows = (~rnd.mask).nonzero().flatten()
        t = int(state["round"])
        new_state = {**state, "round": t + 1}
        pick = 0
        if self.warmup is not None and t < self.warmup:
            mean, direction = self._learned(state, honest, rnd.generator)
            new_state |= {"mean": mean, "direction": direction}
        elif self.warmup is not None:
            direction = state["direction"].to(device=honest.device, dtype=honest.dtype)
            pick = int((honest @ direction).abs().argmax())
        row = int(benign_rows[pick])
        rnd.out[rnd.mask] = rnd.out[row].clone()
        return new_state, {"mimicked_row": float(row)}

    def _learned(
        self, state: AttackState, honest: Tensor, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        direction, mean = state["direction"], state["mean"]
        if direction is None:
            if generator is None:
                raise ValueError(
                    "mimic needs a torch.Generator for its first learning round (generator=None given)"
                )
            draw = torch.randn(honest.shape[1], generator=generator, device=generator.device)
            direction = draw.to(device=honest.device, dtype=honest.dtype)
            mean = torch.zeros_like(direction)
        mean = mean.to(device=honest.device, dtype=honest.dtype)
        direction = direction.to(device=honest.device, dtype=honest.dtype)
        return learn_direction(honest, mean, direction, int(state["round"]))
