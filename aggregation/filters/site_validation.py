"""Validation at the sites: a site is excluded when the other sites' own held-out data
say the round is better without it (a filter).

Each round the filter makes ``1 + m`` candidate updates from the ``m`` rows it judges (the
finite rows of clients it has not banned): the round's aggregate ``A``, the weighted mean
of the rows (client weights: sample counts), and for each judged client ``i`` the
leave-one-out aggregate ``A₋ᵢ``, the same mean without row ``i``. Every judged site scores
the model each candidate makes (``global + server_lr · candidate``) on its own held-out
split and sends back one mean loss per candidate and its held-out count: nothing else
leaves a site. With ``L_j(·)`` site ``j``'s loss:

- a **voter** on ``i`` is a judged site ``j ≠ i`` that answered with a held-out count
  above 0 (and no NaN loss); ``j`` votes against ``i`` when
  ``L_j(A) − L_j(A₋ᵢ) > margin · L_j(A)`` (the round without ``i`` lowers ``j``'s loss by
  more than the ``margin`` share of it; a model whose outputs are not finite at ``j``
  has an infinite loss there, and ``j`` votes against ``i`` when ``L_j(A₋ᵢ) < L_j(A)``);
- ``i`` is **excluded** when it has at least ``min_voters`` voters and a strict majority
  of them vote against it (``votes > voters / 2``); with ``exclusion="permanent"`` it is
  banned for good (its later updates are never kept, nor judged, nor asked to validate);
- its **contribution** is ``Σ_j n_j (L_j(A₋ᵢ) − L_j(A)) / Σ_j n_j`` over its voters: how
  much the others' held-out loss rises without it (positive: its data helps the others;
  infinite losses are left out of it).

Why leave-one-out aggregates and not each update alone (Zeno, FLTrust): the model a round
releases is an aggregate, and what a consortium asks is whether that model is better with
a site or without it; on non-IID sites one site's update applied alone is judged on how
far its local data differ, not on whether it harms the aggregate. The leave-one-out
difference is also the site's contribution (a leave-one-out data value), at the same cost
(``m + 1`` candidates against ``m``). A site cannot vote on itself, and ``min_voters=2``
keeps two sites from excluding each other: at three sites a site is excluded only when
both others find the round better without it (each site also prefers candidates that
weight its own update more, which ``margin`` absorbs).

The score in the trail is the share of voters against the client, the threshold ``0.5``;
columns: ``votes``, ``voters``, ``contribution``, ``val_n`` (the client's held-out count),
``val_loss`` (its loss of ``A``), ``val_loss_without_<id>`` (its loss of ``A₋id``, one per
judged id) and ``banned``. Fewer than two judged rows: nothing is asked or judged.

Anchors: Zeno (Xie et al. 2019, https://arxiv.org/abs/1805.10032) and FLTrust (Cao et al.
2021, https://arxiv.org/abs/2012.13995) score updates on data the server holds; BaFFLe
(Andreina et al. 2021, https://arxiv.org/abs/2011.02167) has clients vote on the global
model with their own data. Here the hub holds no data (as in BaFFLe), but the sites score
leave-one-out candidates, so the vote says which site to exclude, not only whether to
reject the round.

Parameters: ``margin=0.02`` (≥ 0, a share of the voter's loss), ``min_voters=2`` (≥ 1),
``exclusion="permanent"`` (or ``"round"``: left out of that round only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from aggregation.base import Filter, FilterDecision, SiteLosses, Validate, check_updates
from aggregation.registry import register_filter
from registry.constraints import Interval, Options, allowed, check_fields

__all__ = ["SiteValidation", "ValidationVerdict", "leave_one_out", "validation_verdict"]

State = dict[str, Any]
_EXCLUSIONS = ("permanent", "round")


@dataclass(frozen=True)
class ValidationVerdict:
    """The rule's verdict on the judged clients (in ``judged`` order): votes against each,
    its voters, its contribution and whether it is excluded."""

    votes: Tensor  # float64 (m,)
    voters: Tensor  # float64 (m,)
    contribution: Tensor  # float64 (m,), nan without a voter
    exclude: Tensor  # bool (m,)


def validation_verdict(
    losses: SiteLosses, judged: Sequence[int], *, margin: float, min_voters: int
) -> ValidationVerdict:
    """The rule on the sites' losses: candidate 0 is the round's aggregate, candidate
    ``c + 1`` the aggregate without ``judged[c]`` (see the module's docstring)."""
    m = len(judged)
    votes = torch.zeros(m, dtype=torch.float64)
    voters = torch.zeros(m, dtype=torch.float64)
    contribution = torch.full((m,), math.nan, dtype=torch.float64)
    table = losses.losses.to(torch.float64)
    counts = losses.counts.to(torch.float64)
    if table.shape != (len(losses.sites), m + 1):
        raise ValueError(
            f"site losses of shape {tuple(table.shape)}: expected one row per site and "
            f"{m + 1} candidates (the round's and one without each of {m} clients)"
        )
    for c, client in enumerate(judged):
        weighted = total = 0.0
        for row, site in enumerate(losses.sites):
            with_all, without = float(table[row, 0]), float(table[row, c + 1])
            if site == client or not counts[row] > 0 or math.isnan(with_all + without):
                continue
            voters[c] += 1
            if math.isinf(with_all) or math.isinf(without):  # a model that diverged there
                votes[c] += float(without < with_all)
                continue
            votes[c] += float(with_all - without > margin * with_all)
            weighted += float(counts[row]) * (without - with_all)
            total += float(counts[row])
        if total > 0:
            contribution[c] = weighted / total
    exclude = (voters >= min_voters) & (2 * votes > voters)
    return ValidationVerdict(votes, voters, contribution, exclude)


def leave_one_out(updates: Tensor, weights: Tensor) -> Tensor:
    """The candidates ``(m + 1, d)``: the weighted mean of the rows, then the weighted mean
    without each row in turn (rows and weights of the judged clients, ``m >= 2``)."""
    w = weights.to(device=updates.device, dtype=updates.dtype)
    total_weight = w.sum()
    weighted_sum = w @ updates
    rest = (weighted_sum.unsqueeze(0) - w.unsqueeze(1) * updates) / (total_weight - w).unsqueeze(1)
    return torch.cat([(weighted_sum / total_weight).unsqueeze(0), rest])


@register_filter("site_validation")
@dataclass(frozen=True, kw_only=True)
class SiteValidation(Filter):
    """Leave-one-out candidates scored by the sites on their own held-out splits; a site
    is excluded when a strict majority of the others find the round better without it."""

    # the share of a voter's loss the round without a site must save for a vote against it
    margin: float = field(default=0.02, metadata=allowed(Interval(float, 0)))
    # a site is judged only when at least this many other sites vote on it
    min_voters: int = field(default=2, metadata=allowed(Interval(int, 1)))
    exclusion: str = field(default="permanent", metadata=allowed(Options(_EXCLUSIONS)))

    requires_validation: ClassVar[bool] = True
    name = "site_validation"

    def __post_init__(self) -> None:
        check_fields(self, self.name)

    def init_state(self) -> State:
        """``round``: rounds seen; ``banned``: sorted ids excluded for good."""
        return {"round": 0, "banned": []}

    def cannot_exclude(self, clients: int) -> str | None:
        if clients - 1 >= self.min_voters:
            return None
        return (
            f"site_validation judges a site only when at least min_voters = "
            f"{self.min_voters} other sites vote on it; {clients} a round leave "
            f"{max(clients - 1, 0)}"
        )

    @staticmethod
    def banned_ids(state: State) -> frozenset[int]:
        """Ids excluded permanently so far."""
        return frozenset(state["banned"])

    def step(
        self,
        state: State,
        updates: Tensor,
        client_ids: Sequence[int],
        weights: Tensor | None = None,
        *,
        validate: Validate | None = None,
    ) -> tuple[FilterDecision, State]:
        check_updates(updates, weights)
        ids = [int(i) for i in client_ids]
        if len(ids) != updates.shape[0] or len(set(ids)) != len(ids):
            raise ValueError(f"client_ids must be one distinct id per update row, got {ids}")
        if validate is None:
            raise ValueError(
                "site_validation needs the sites' held-out losses (validate=): each site "
                "scores the round's candidates on its own held-out split"
            )
        n = len(ids)
        banned = torch.tensor([i in set(state["banned"]) for i in ids], dtype=torch.bool)
        finite = torch.isfinite(updates).all(dim=1).cpu()
        active = finite & ~banned
        positions = active.nonzero().flatten().tolist()
        judged = [ids[p] for p in positions]
        nan = torch.full((n,), math.nan, dtype=torch.float64)
        columns: dict[str, Tensor] = {"banned": banned.to(torch.float64)}
        exclude = torch.zeros(n, dtype=torch.bool)
        scores = nan.clone()
        note = self._note()
        if len(judged) < 2:
            note += f"; {len(judged)} client(s) to judge: nothing asked"
        else:
            w = torch.ones(n) if weights is None else weights.detach().to("cpu", torch.float64)
            candidates = leave_one_out(updates[positions], w[positions].to(updates))
            losses = validate(candidates, judged)
            verdict = validation_verdict(
                losses, judged, margin=self.margin, min_voters=self.min_voters
            )
            columns |= self._columns(n, positions, judged, losses, verdict)
            share = torch.where(verdict.voters >= self.min_voters,
                                verdict.votes / verdict.voters.clamp(min=1), math.nan)  # fmt: skip
            scores[positions] = share
            exclude[positions] = verdict.exclude
        keep = active & ~exclude
        new_banned = set(state["banned"])
        if self.exclusion == "permanent":
            new_banned.update(i for i, x in zip(ids, exclude.tolist(), strict=True) if x)
        decision = FilterDecision(
            keep=keep.to(updates.device), reason=self.name, scores=scores, threshold=0.5,
            columns=columns, note=note,
        )  # fmt: skip
        return decision, {"round": int(state["round"]) + 1, "banned": sorted(new_banned)}

    def _note(self) -> str:
        return (
            f"validation at the sites: excluded when a strict majority of at least "
            f"{self.min_voters} other sites find the round's aggregate without it better on "
            f"their held-out splits by more than {self.margin:g} of their loss"
        )

    @staticmethod
    def _columns(
        n: int, positions: list[int], judged: list[int], losses: SiteLosses,
        verdict: ValidationVerdict,
    ) -> dict[str, Tensor]:  # fmt: skip
        """Every number in the trail: each judged row's verdict, and as a site, its count
        and its loss of every candidate (nan where it did not answer)."""
        columns = {
            name: torch.full((n,), math.nan, dtype=torch.float64)
            for name in ("votes", "voters", "contribution", "val_n", "val_loss")
        }
        for client in judged:
            columns[f"val_loss_without_{client}"] = torch.full((n,), math.nan, dtype=torch.float64)
        columns["votes"][positions] = verdict.votes
        columns["voters"][positions] = verdict.voters
        columns["contribution"][positions] = verdict.contribution
        row_of = dict(zip(judged, positions, strict=True))
        for row, site in enumerate(losses.sites):
            if site not in row_of:
                continue
            p = row_of[site]
            columns["val_n"][p] = float(losses.counts[row])
            columns["val_loss"][p] = float(losses.losses[row, 0])
            for c, client in enumerate(judged):
                columns[f"val_loss_without_{client}"][p] = float(losses.losses[row, c + 1])
        return columns
