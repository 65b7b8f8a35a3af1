"""The distance CUSUM (not PID-MADE) by hand, against the robust threshold, the round cut
on both filters, and the PID score's CUSUM, in which the gains decide."""

from __future__ import annotations

import math

import pytest
import torch

from aggregation import build_filter, list_filters
from aggregation.filters import PIDMADE, DistanceCUSUM
from tests.aggregation.filters.test_pid_made import honest_round, run


def test_registered_as_distance_cusum_with_no_round_cut() -> None:
    filt = build_filter("distance_cusum")

    assert "distance_cusum" in list_filters()
    assert (filt.drift, filt.h, filt.round_cut, filt.exclusion) == (3.0, 8.0, None, "permanent")
    assert not hasattr(filt, "kp")  # no PID term enters its decision


def test_cusum_by_hand_needs_more_than_one_round_of_evidence() -> None:
    # 10 clients, 1-D: nine at 0 and one at 5 -> D = [0.5 x 9, 4.5], median 0.5, MAD 0, so
    # the mean absolute deviation 0.4 is the scale and the outlier's z is 10: it adds
    # min(10, 3 + 8) - 3 = 7 <= h = 8 (kept), then 7 more in round 2 (14 > 8: excluded)
    filt = DistanceCUSUM()
    ids = list(range(10))

    (r1, r2), state = run(filt, [[0.0] * 9 + [5.0]] * 2, ids=ids)

    assert r1.columns["z"].tolist() == pytest.approx([0.0] * 9 + [10.0])
    assert r1.scores.tolist() == pytest.approx([0.0] * 9 + [7.0])
    assert r1.threshold == 8.0 and r1.keep.all()
    assert "cusum" in r1.note and "drift 3" in r1.note
    assert r2.scores.tolist() == pytest.approx([0.0] * 9 + [14.0])
    assert r2.keep.tolist() == [True] * 9 + [False]
    assert state["banned"] == [9] and state["history"][9]["cusum"] == pytest.approx(14.0)


def test_cusum_forgives_one_bad_round_that_the_per_round_threshold_bans_for_good() -> None:
    # an honest client far out in round 1 only (a small site's first update), and an
    # attacker far out in every round
    gen = torch.Generator().manual_seed(3)
    ids = list(range(20))
    spiked = honest_round(gen)
    spiked[5] += 0.8 * torch.randn(spiked.shape[1], generator=gen) / math.sqrt(spiked.shape[1])
    rounds = [spiked] + [honest_round(gen) for _ in range(5)]
    outcomes = {}
    for name, filt in {"robust": PIDMADE(threshold="robust"), "cusum": DistanceCUSUM()}.items():
        state = filt.init_state()
        for updates in rounds:
            updates = updates.clone()
            updates[0] = -3.0 * updates[1:].mean(0)  # the attacker, every round
            _, state = filt.step(state, updates, ids)
        outcomes[name] = state["banned"]

    assert outcomes["robust"] == [0, 5]
    assert outcomes["cusum"] == [0]


@pytest.mark.parametrize(
    "filt", [DistanceCUSUM(round_cut=11.0), PIDMADE(threshold="cusum", round_cut=11.0)]
)
def test_the_round_cut_leaves_a_wild_update_out_of_its_round_without_banning_its_client(
    filt: DistanceCUSUM | PIDMADE,
) -> None:
    # client 9's first update is hundreds of robust deviations out: left out of round 1
    # (it would wreck the mean) by the round cut, not banned; back in line, it is kept
    honest = [0.0, 0.1, -0.1, 0.2, -0.2, 0.05, -0.05, 0.15, -0.15]

    [r1], state = run(filt, [[*honest, 50.0]], ids=list(range(10)))

    assert r1.columns["z"][9] > 100 and r1.scores[9] == pytest.approx(8.0)
    assert r1.keep.tolist() == [True] * 9 + [False] and state["banned"] == []
    assert "round cut" in r1.note and "left out of its round" in r1.note
    if isinstance(filt, DistanceCUSUM):  # the distance forgets; back in line, it is kept
        [r2], state = run(filt, [[*honest, 0.0]], ids=list(range(10)), state=state)
        assert r2.keep.all() and state["banned"] == []


def test_without_the_round_cut_the_wild_update_counts_in_its_round() -> None:
    honest = [0.0, 0.1, -0.1, 0.2, -0.2, 0.05, -0.05, 0.15, -0.15]

    [r1], _ = run(DistanceCUSUM(), [[*honest, 50.0]], ids=list(range(10)))

    assert r1.keep.all() and "round cut" not in r1.note


def test_the_pid_scores_cusum_depends_on_the_gains() -> None:
    # a client far out in round 1 only: its integral keeps its PID score high afterwards
    # (Ki 0.5), so the PID CUSUM keeps adding evidence and bans it; with Ki = 0 and Kd = 0
    # the score is the distance, back in line after round 1, and the client stays
    gen = torch.Generator().manual_seed(4)
    ids = list(range(20))
    rounds = [honest_round(gen) for _ in range(6)]
    rounds[0][5] += 2.0 * torch.randn(rounds[0].shape[1], generator=gen) / math.sqrt(1_000)
    outcomes = {}
    for ki in (0.5, 0.0):
        filt = PIDMADE(threshold="cusum", ki=ki, kd=0.0)
        state = filt.init_state()
        for updates in rounds:
            decision, state = filt.step(state, updates, ids)
        outcomes[ki] = state["banned"]
        assert "cusum of the robust z of the PID score" in decision.note

    assert outcomes == {0.5: [5], 0.0: []}


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"drift": -1.0}, "distance_cusum drift must be a finite number >= 0"),
        ({"h": 0.0}, "distance_cusum h must be a finite number > 0"),
        (
            {"round_cut": math.inf},
            "distance_cusum round_cut must be a finite number > 0 or None, got inf",
        ),
        ({"exclusion": "forever"}, "distance_cusum exclusion must be one of 'permanent', 'round'"),
        ({"kp": 1.0}, "kp"),
    ],
)
def test_bad_parameters_name_the_filter_and_what_is_allowed(params: dict, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        build_filter("distance_cusum", **params)
