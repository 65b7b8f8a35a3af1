"""Validation at the sites: the rule on hand-made losses, the leave-one-out candidates, and
the filter's bans, columns and refusals."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch
from torch import Tensor

from aggregation import build_filter, list_filters
from aggregation.base import SiteLosses
from aggregation.filters import SiteValidation, validation_verdict
from aggregation.filters.site_validation import leave_one_out


def losses(
    table: list[list[float]], counts: Sequence[float] = (), sites: Sequence[int] = ()
) -> SiteLosses:
    rows = len(table)
    return SiteLosses(
        sites=tuple(sites) or tuple(range(rows)),
        counts=torch.tensor(list(counts) or [10.0] * rows, dtype=torch.float64),
        losses=torch.tensor(table, dtype=torch.float64),
    )


def test_registered_with_documented_defaults() -> None:
    filt = build_filter("site_validation")

    assert "site_validation" in list_filters()
    assert (filt.margin, filt.min_voters, filt.exclusion) == (0.02, 2, "permanent")
    assert filt.requires_validation


def test_rule_by_hand_three_sites_one_harmful() -> None:
    # columns: the round's aggregate, then without site 0, 1, 2. Sites 0 and 1 lose 0.5 -> 0.3
    # without site 2 (gain 0.2 > 0.02 x 0.5): two of its two voters against it. Site 2's
    # own loss falls without site 0 (0.9 -> 0.8), but site 1's rises: one vote of two.
    table = [
        [0.50, 0.55, 0.60, 0.30],  # site 0
        [0.50, 0.60, 0.52, 0.30],  # site 1
        [0.90, 0.80, 0.85, 1.20],  # site 2
    ]

    verdict = validation_verdict(losses(table), [0, 1, 2], margin=0.02, min_voters=2)

    assert verdict.votes.tolist() == [1.0, 1.0, 2.0]
    assert verdict.voters.tolist() == [2.0, 2.0, 2.0]
    assert verdict.exclude.tolist() == [False, False, True]
    # contribution: the others' loss without it minus with it, weighted by their counts
    assert verdict.contribution.tolist() == pytest.approx(
        [(0.10 - 0.10) / 2, (0.10 - 0.05) / 2, -0.20]
    )


def test_rule_margin_is_a_share_of_the_voters_loss() -> None:
    # gains of 0.009 on a loss of 0.5: below 0.02 x 0.5 = 0.01, no vote; at margin 0.01, votes
    table = [[0.5, 0.5, 0.5, 0.491], [0.5, 0.5, 0.5, 0.491], [0.5, 0.5, 0.5, 0.5]]

    strict = validation_verdict(losses(table), [0, 1, 2], margin=0.02, min_voters=2)
    loose = validation_verdict(losses(table), [0, 1, 2], margin=0.01, min_voters=2)

    assert strict.votes.tolist() == [0.0, 0.0, 0.0] and not strict.exclude.any()
    assert loose.votes.tolist() == [0.0, 0.0, 2.0] and loose.exclude.tolist() == [
        False,
        False,
        True,
    ]


def test_rule_needs_a_strict_majority_of_enough_voters() -> None:
    # four sites: site 3 has three voters; two against is a majority, so it is out. With
    # only site 0 against, one of three is not.
    table = [
        [1.0, 1.0, 1.0, 1.0, 0.5],
        [1.0, 1.0, 1.0, 1.0, 0.5],
        [1.0, 1.0, 1.0, 1.0, 1.0],
        [1.0, 1.0, 1.0, 1.0, 1.0],
    ]
    assert validation_verdict(losses(table), [0, 1, 2, 3], margin=0.0, min_voters=2).exclude.tolist() == [
        False, False, False, True,
    ]  # fmt: skip
    table[1][4] = 1.0
    verdict = validation_verdict(losses(table), [0, 1, 2, 3], margin=0.0, min_voters=2)
    assert verdict.votes.tolist()[3] == 1.0 and not verdict.exclude.any()


def test_rule_two_sites_judge_nobody_and_silent_sites_do_not_vote() -> None:
    # two sites: one voter each, below min_voters = 2, whatever the losses say
    two = validation_verdict(
        losses([[1.0, 0.1, 0.1], [1.0, 0.1, 0.1]]), [0, 1], margin=0.0, min_voters=2
    )
    assert two.voters.tolist() == [1.0, 1.0] and not two.exclude.any()
    # three sites, site 1 holds no held-out images (n = 0) and site 0's losses are NaN:
    # site 2 has no voter left
    table = [[math.nan] * 4, [1.0, 1.0, 1.0, 0.1], [1.0, 1.0, 1.0, 1.0]]
    silent = validation_verdict(
        losses(table, counts=[5, 0, 5]), [0, 1, 2], margin=0.0, min_voters=1
    )
    assert silent.voters.tolist() == [1.0, 1.0, 0.0]
    assert math.isnan(float(silent.contribution[2])) and not silent.exclude[2]


def test_rule_a_model_that_diverges_at_the_voters_counts_against_the_site() -> None:
    table = [[math.inf, 1.0, 1.0, 0.4], [math.inf, 1.0, 1.0, 0.5], [math.inf, 1.0, 1.0, 9.0]]

    verdict = validation_verdict(losses(table), [0, 1, 2], margin=0.02, min_voters=2)

    assert verdict.exclude.tolist() == [True, True, True]  # every candidate beats the inf


def test_rule_refuses_a_table_of_the_wrong_shape() -> None:
    with pytest.raises(ValueError, match="expected one row per site and 4 candidates"):
        validation_verdict(losses([[1.0, 1.0, 1.0]]), [0, 1, 2], margin=0.0, min_voters=2)


def test_leave_one_out_candidates_by_hand() -> None:
    updates = torch.tensor([[1.0, 0.0], [0.0, 3.0], [2.0, 3.0]])
    weights = torch.tensor([1.0, 1.0, 2.0])

    candidates = leave_one_out(updates, weights)

    # the weighted mean, then the weighted mean of the other two
    expected = [[5 / 4, 9 / 4], [4 / 3, 3.0], [5 / 3, 2.0], [0.5, 1.5]]
    assert candidates.tolist() == [pytest.approx(row) for row in expected]


class Sites:
    """Sites that score a candidate by its distance from ``target``, and remember what
    they were asked (a stand-in for held-out data: the rule sees losses only)."""

    def __init__(self, target: Tensor, counts: dict[int, int]) -> None:
        self.target, self.counts, self.asked = target, counts, []

    def __call__(self, candidates: Tensor, client_ids: Sequence[int]) -> SiteLosses:
        self.asked.append((candidates.clone(), list(client_ids)))
        distance = (candidates - self.target).norm(dim=1).double()
        return SiteLosses(
            sites=tuple(client_ids),
            counts=torch.tensor([float(self.counts[i]) for i in client_ids], dtype=torch.float64),
            losses=distance.repeat(len(client_ids), 1),
        )


def test_filter_bans_the_site_the_others_reject_and_records_every_number() -> None:
    # three honest updates near (1, 1) and one at (-5, -5): without it every candidate is
    # nearer the sites' target; site 3 is out for good and never asked again
    updates = torch.tensor([[1.0, 1.0], [1.2, 0.8], [0.8, 1.2], [-5.0, -5.0]])
    sites = Sites(torch.tensor([1.0, 1.0]), {10: 4, 11: 5, 12: 6, 13: 7})
    filt = SiteValidation()

    decision, state = filt.step(filt.init_state(), updates, [10, 11, 12, 13], validate=sites)
    again, _ = filt.step(state, updates, [10, 11, 12, 13], validate=sites)

    assert decision.keep.tolist() == [True, True, True, False]
    assert state["banned"] == [13]
    assert decision.scores.tolist() == [0.0, 0.0, 0.0, 1.0] and decision.threshold == 0.5
    assert decision.columns["votes"].tolist() == [0.0, 0.0, 0.0, 3.0]
    assert decision.columns["val_n"].tolist() == [4.0, 5.0, 6.0, 7.0]
    assert decision.columns["contribution"][3] < 0 < decision.columns["contribution"][0]
    assert set(decision.columns) >= {f"val_loss_without_{i}" for i in (10, 11, 12, 13)}
    assert decision.reason == "site_validation" and "strict majority" in decision.note
    assert again.keep.tolist() == [True, True, True, False]
    assert sites.asked[1][1] == [10, 11, 12]  # a banned site is not asked to validate
    assert sites.asked[1][0].shape == (4, 2)


def test_filter_per_round_exclusion_does_not_ban() -> None:
    updates = torch.tensor([[1.0, 1.0], [1.2, 0.8], [0.8, 1.2], [-5.0, -5.0]])
    sites = Sites(torch.tensor([1.0, 1.0]), dict.fromkeys(range(4), 3))
    filt = SiteValidation(exclusion="round")

    decision, state = filt.step(filt.init_state(), updates, range(4), validate=sites)

    assert decision.keep.tolist() == [True, True, True, False] and state["banned"] == []


def test_filter_with_one_site_left_asks_nothing() -> None:
    sites = Sites(torch.zeros(2), {0: 3})
    filt = SiteValidation()

    decision, _ = filt.step(filt.init_state(), torch.ones(1, 2), [0], validate=sites)

    assert decision.keep.tolist() == [True] and sites.asked == []


def test_filter_without_sites_that_validate_says_what_it_needs() -> None:
    filt = SiteValidation()
    with pytest.raises(ValueError, match="needs the sites' held-out losses"):
        filt.step(filt.init_state(), torch.ones(3, 2), [0, 1, 2])


def test_cannot_exclude_below_min_voters_plus_one() -> None:
    assert SiteValidation().cannot_exclude(3) is None
    assert "min_voters = 2" in SiteValidation().cannot_exclude(2)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"margin": -0.1}, "margin"),
        ({"min_voters": 0}, "min_voters"),
        ({"exclusion": "forever"}, "exclusion"),
    ],
)
def test_bad_parameters_name_the_field(params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_filter("site_validation", **params)
