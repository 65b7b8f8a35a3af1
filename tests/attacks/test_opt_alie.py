"""Opt-ALIE: the hand-computed search, the closure it needs, and more damage than ALIE."""

from __future__ import annotations

import pytest
import torch

from aggregation import build_aggregator
from federated.attacks import build_attack


def mean_defence(rows: torch.Tensor) -> torch.Tensor:
    return rows.mean(dim=0)


def test_against_the_mean_the_search_keeps_expanding() -> None:
    updates = torch.tensor([[9.0, 9.0], [0.0, 0.0], [2.0, 4.0]])
    mask = torch.tensor([True, False, False])
    attack = build_attack("opt_alie", evals=3)

    out, _, diagnostics = attack.step({}, updates, mask, aggregate=mean_defence)

    # mu = [1, 2], sample std = [sqrt 2, 2 sqrt 2]; tau tried 0, 10, 30 -> 30
    assert diagnostics["factor"] == 30.0
    assert out[0].tolist() == pytest.approx([1 + 30 * 2**0.5, 2 + 60 * 2**0.5])
    assert torch.equal(out[1:], updates[1:])


def test_the_defence_sees_the_benign_rows_and_one_candidate_per_evaluation() -> None:
    updates = torch.tensor([[9.0], [0.0], [2.0], [4.0]])
    mask = torch.tensor([True, False, False, True])
    seen: list[torch.Tensor] = []

    def spy(rows: torch.Tensor) -> torch.Tensor:
        seen.append(rows.clone())
        return rows.median(dim=0).values

    build_attack("opt_alie", evals=5).apply(updates, mask, aggregate=spy)

    assert len(seen) == 5
    for rows in seen:
        assert torch.equal(rows[~mask], updates[~mask])
        assert torch.equal(rows[0], rows[3])  # every malicious row sends the same vector


def test_without_the_defence_closure_it_refuses() -> None:
    with pytest.raises(ValueError, match="pass aggregate"):
        build_attack("opt_alie").apply(torch.ones(3, 2), torch.tensor([True, False, False]))


def test_an_all_malicious_round_is_refused() -> None:
    with pytest.raises(ValueError, match="benign"):
        build_attack("opt_alie").apply(
            torch.ones(2, 2), torch.ones(2, dtype=torch.bool), aggregate=mean_defence
        )


@pytest.mark.parametrize(("rule", "params"), [("median", {}), ("trimmed_mean", {"f": 4})])
@pytest.mark.parametrize("seed", range(3))
def test_more_damage_than_plain_alie_against_a_robust_rule(
    rule: str, params: dict, seed: int, synthetic_round, damage
) -> None:
    updates, mask = synthetic_round(seed)
    defence = build_aggregator(rule, **params)

    plain = build_attack("alie").apply(updates, mask)
    optimised = build_attack("opt_alie").apply(updates, mask, aggregate=defence)

    assert damage(defence, optimised, mask) > 1.1 * damage(defence, plain, mask)
