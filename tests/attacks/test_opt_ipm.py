"""Opt-IPM: the hand-computed search and more damage than IPM against a robust rule."""

from __future__ import annotations

import pytest
import torch

from aggregation import build_aggregator
from federated.attacks import build_attack


def test_against_the_mean_the_larger_factor_wins() -> None:
    updates = torch.tensor([[7.0, 7.0], [2.0, 0.0], [0.0, 4.0]])
    mask = torch.tensor([True, False, False])

    out, _, diagnostics = build_attack("opt_ipm", evals=2).step(
        {}, updates, mask, aggregate=lambda rows: rows.mean(dim=0)
    )

    # mu = [1, 2]: tau = 0 moves the mean by |[2/3, 4/3] - mu|, tau = 10 by more
    assert diagnostics == {
        "factor": 10.0,
        "distance": pytest.approx(float(torch.tensor([11.0, 22.0]).norm()) / 3),
    }
    assert out[0].tolist() == [-10.0, -20.0]


def test_without_the_defence_closure_it_refuses() -> None:
    with pytest.raises(ValueError, match="pass aggregate"):
        build_attack("opt_ipm").apply(torch.ones(3, 2), torch.tensor([True, False, False]))


@pytest.mark.parametrize("seed", range(3))
def test_more_damage_than_plain_ipm_against_trimmed_mean(
    seed: int, synthetic_round, damage
) -> None:
    updates, mask = synthetic_round(seed)
    defence = build_aggregator("trimmed_mean", f=4)

    plain = build_attack("ipm").apply(updates, mask)
    optimised = build_attack("opt_ipm").apply(updates, mask, aggregate=defence)

    assert damage(defence, optimised, mask) > 1.05 * damage(defence, plain, mask)


@pytest.mark.parametrize("seed", range(3))
def test_never_less_damage_than_plain_ipm_against_the_median(
    seed: int, synthetic_round, damage
) -> None:
    updates, mask = synthetic_round(seed)
    defence = build_aggregator("median")

    plain = build_attack("ipm").apply(updates, mask)
    optimised = build_attack("opt_ipm").apply(updates, mask, aggregate=defence)

    assert damage(defence, optimised, mask) >= damage(defence, plain, mask) - 1e-9
