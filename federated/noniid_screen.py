"""EMA's non-IID check in the round (Algorithms 3-4): the round's clients' losses at the
current global model, the CV verdict and, when the check excludes, the ids whose loss
z-score is too high, left out before they train. At remote sites the losses are asked
with the previous round's scoring, so the screen needs no exchange of its own."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from torch import Tensor

from federated.execution import NextRound
from federated.parts import NonIIDCheck
from federated.scoring import RoundScorer
from federated.stats.noniid import noniid_exclusions, noniid_verdict

__all__ = ["NonIIDScreen", "Screen"]


@dataclass(frozen=True)
class Screen:
    """The non-IID screen of one round: client losses and the ids it left out."""

    losses: dict[int, float] = field(default_factory=dict)
    excluded: set[int] = field(default_factory=set)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class NonIIDScreen:
    """The check (None: no screen), and the scorer that gives it the clients' losses;
    ``all_held_here``: every client's data is in this process (no remote site)."""

    check: NonIIDCheck | None
    scorer: RoundScorer
    all_held_here: bool

    def due(self, round_number: int) -> bool:
        """Whether the round's clients are screened (due by ``every``, or every round
        when the check excludes)."""
        check = self.check
        if check is None:
            return False
        return check.exclude or (check.every > 0 and round_number % check.every == 0)

    def trains_with_scoring(self) -> bool:
        """Whether remote sites may train in the exchange that scores the model they train
        on: not when the check excludes, which must screen a site before it trains (an
        excluded site's work would be wasted and, under local DP, its update would count
        towards its ε)."""
        return self.check is None or not self.check.exclude

    def losses_ahead(self, next_round: NextRound | None) -> str:
        """The check's loss when the next round screens clients at remote sites: asked
        with this round's scoring (``""``: not needed)."""
        if self.check is None or next_round is None or self.all_held_here:
            return ""
        return self.check.loss if self.due(next_round.round) else ""

    def screen(
        self, vector: Tensor, round_number: int, positions: list[int],
        control: Tensor | None = None,
    ) -> Screen:  # fmt: skip
        """The round's clients (at ``positions``) judged at the global model ``vector``
        (remote sites may train on it in the same exchange: with SCAFFOLD's ``control``)."""
        check = self.check
        if check is None or not self.due(round_number) or len(positions) < 2:
            return Screen()
        ids = [self.scorer.clients[p].client_id for p in positions]
        then_train = (
            NextRound(round_number, tuple(ids), control) if self.trains_with_scoring() else None
        )
        by_id = self.scorer.data_losses(vector, positions, check.loss, then_train)
        ids = [i for i in ids if i in by_id]  # a site that did not answer is not screened
        if len(ids) < 2:
            return Screen()
        losses = np.array([by_id[i] for i in ids])
        verdict = noniid_verdict(losses, threshold=check.threshold)
        excluded: set[int] = set()
        if check.exclude:
            keep = noniid_exclusions(losses, check.z)
            excluded = {i for i, kept in zip(ids, keep.tolist(), strict=True) if not kept}
        metrics = {"noniid_cv": verdict.cv, "noniid_non_iid": float(verdict.verdict == "non_iid")}
        return Screen(dict(zip(ids, losses.tolist(), strict=True)), excluded, metrics)
