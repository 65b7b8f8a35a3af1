"""Model attacks on the update rows: each formula on tiny hand-computed inputs."""

from __future__ import annotations

import math

import pytest
import torch

from aggregation import build_aggregator
from federated.attacks import ModelAttack, alie_z, build_attack, list_attacks

UPDATES = torch.tensor([[1.0, -2.0], [0.0, 4.0], [2.0, 0.0]])
MASK = torch.tensor([True, False, False])


def test_sign_flip_negates_and_scales_malicious_rows_only() -> None:
    out = build_attack("sign_flip", scale=2.0).apply(UPDATES, MASK)

    assert out.tolist() == [[-2.0, 4.0], [0.0, 4.0], [2.0, 0.0]]
    assert UPDATES[0].tolist() == [1.0, -2.0]  # input untouched


def test_scaling_boosts_malicious_rows() -> None:
    out = build_attack("scaling", factor=10.0).apply(UPDATES, MASK)

    assert out.tolist() == [[10.0, -20.0], [0.0, 4.0], [2.0, 0.0]]


def test_gaussian_replace_draws_n0_sigma2_from_the_generator() -> None:
    updates = torch.ones(3, 200_000)
    mask = torch.tensor([False, True, False])
    attack = build_attack("gaussian", sigma=2.0)

    out = attack.apply(updates, mask, torch.Generator().manual_seed(0))
    again = attack.apply(updates, mask, torch.Generator().manual_seed(0))

    assert torch.equal(out, again)
    assert torch.equal(out[[0, 2]], updates[[0, 2]])
    assert abs(float(out[1].mean())) < 0.02
    assert float(out[1].std()) == pytest.approx(2.0, rel=0.01)


def test_gaussian_add_is_update_plus_the_same_noise() -> None:
    updates = torch.arange(6.0).reshape(2, 3)
    mask = torch.tensor([True, False])

    replaced = build_attack("gaussian").apply(updates, mask, torch.Generator().manual_seed(5))
    added = build_attack("gaussian", mode="add").apply(
        updates, mask, torch.Generator().manual_seed(5)
    )

    torch.testing.assert_close(added[0], updates[0] + replaced[0])


def test_gaussian_without_generator_is_refused() -> None:
    with pytest.raises(ValueError, match="generator"):
        build_attack("gaussian").apply(UPDATES, MASK)


@pytest.mark.parametrize(
    ("n", "f", "z"),
    [(50, 24, 1.7506860712521695), (5, 1, 0.2533471031357997), (20, 10, 1.6448536269514722)],
)
def test_alie_z_follows_baruch_et_al(n: int, f: int, z: float) -> None:
    # s = floor(n/2 + 1) - f; z = Phi^-1((n - s)/n): (50,24)->0.96, (5,1)->0.6, (20,10)->0.95
    assert alie_z(n, f) == pytest.approx(z, abs=1e-12)


def test_alie_z_needs_an_honest_majority_to_sway() -> None:
    with pytest.raises(ValueError, match=r"f < floor\(n/2 \+ 1\)"):
        alie_z(10, 6)


def test_alie_sends_mean_minus_z_std_of_the_benign_rows() -> None:
    updates = torch.tensor([[9.0, 9.0], [0.0, 0.0], [2.0, 4.0], [4.0, 8.0]])
    mask = torch.tensor([True, False, False, False])

    explicit = build_attack("alie", z=1.0).apply(updates, mask)
    # n=4, f=1: s = 3 - 1 = 2, z = Phi^-1(2/4) = 0 -> the benign mean
    formula = build_attack("alie").apply(updates, mask)

    # benign mean [2, 4], sample std [2, 4]
    assert explicit[0].tolist() == [0.0, 0.0]
    assert formula[0].tolist() == pytest.approx([2.0, 4.0])
    assert torch.equal(explicit[1:], updates[1:])


def test_alie_reference_all_uses_every_row() -> None:
    updates = torch.tensor([[6.0], [0.0], [3.0]])  # mean 3, sample std 3
    mask = torch.tensor([True, True, False])

    out = build_attack("alie", z=0.5, reference="all").apply(updates, mask)

    assert out[:, 0].tolist() == [1.5, 1.5, 3.0]


def test_ipm_sends_minus_epsilon_times_the_benign_mean() -> None:
    updates = torch.tensor([[7.0, 7.0], [2.0, 0.0], [0.0, 4.0]])
    mask = torch.tensor([True, False, False])

    out = build_attack("ipm", epsilon=0.5).apply(updates, mask)

    assert out[0].tolist() == [-0.5, -1.0]
    benign_mean = updates[1:].mean(dim=0)
    assert float(out[0] @ benign_mean) < 0
    assert float(out.mean(dim=0) @ benign_mean) < float(benign_mean @ benign_mean)


def test_omniscient_attacks_need_a_benign_row() -> None:
    all_bad = torch.ones(3, dtype=torch.bool)
    with pytest.raises(ValueError, match="benign"):
        build_attack("ipm").apply(UPDATES, all_bad)
    with pytest.raises(ValueError, match="benign"):
        build_attack("alie", z=1.0).apply(UPDATES, all_bad)


def test_inf_client_sends_plus_inf() -> None:
    out = build_attack("inf").apply(UPDATES, MASK)

    assert out[0].tolist() == [math.inf, math.inf]
    assert torch.equal(out[1:], UPDATES[1:])


def test_nan_client_sends_nan() -> None:
    out = build_attack("nan").apply(UPDATES, MASK)

    assert all(math.isnan(x) for x in out[0].tolist())
    assert torch.equal(out[1:], UPDATES[1:])


def test_no_malicious_row_returns_an_equal_copy() -> None:
    out = build_attack("ipm").apply(UPDATES, torch.zeros(3, dtype=torch.bool))

    assert torch.equal(out, UPDATES)
    assert out.data_ptr() != UPDATES.data_ptr()


def test_mask_must_be_bool_and_match_rows() -> None:
    with pytest.raises(ValueError, match="malicious_mask"):
        build_attack("sign_flip").apply(UPDATES, torch.tensor([1, 0, 0]))
    with pytest.raises(ValueError, match="malicious_mask"):
        build_attack("sign_flip").apply(UPDATES, torch.tensor([True, False]))


MODEL_ATTACKS = [name for name in list_attacks() if isinstance(build_attack(name), ModelAttack)]
# the backdoor's update side acts only with model replacement
CONTRACT_PARAMS = {"backdoor": {"model_replacement": True}}


@pytest.mark.parametrize("name", MODEL_ATTACKS)
def test_contract_every_model_attack(name: str) -> None:
    """Shape and dtype kept, benign rows untouched, input and state not modified, seeded."""
    updates = torch.randn(6, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    before = updates.clone()
    mask = torch.tensor([False, True, False, False, True, False])
    attack = build_attack(name, **CONTRACT_PARAMS.get(name, {}))
    median = build_aggregator("median")
    state = attack.init_state()
    state_before = dict(state)

    out, new_state, diagnostics = attack.step(
        state, updates, mask, torch.Generator().manual_seed(1), aggregate=median
    )
    again = attack.apply(updates, mask, torch.Generator().manual_seed(1), aggregate=median)

    assert out.shape == updates.shape and out.dtype == updates.dtype
    assert torch.equal(out[~mask], updates[~mask])
    assert not torch.equal(out[mask], updates[mask])
    assert torch.equal(updates, before)
    assert state == state_before  # the old state is never modified in place
    assert set(new_state) == set(state)
    assert all(isinstance(v, float) for v in diagnostics.values())
    assert torch.equal(out, again) or name == "nan"  # nan != nan


@pytest.mark.parametrize("name", MODEL_ATTACKS)
def test_a_round_without_malicious_rows_changes_nothing(name: str) -> None:
    attack = build_attack(name, **CONTRACT_PARAMS.get(name, {}))
    state = attack.init_state()

    out, new_state, diagnostics = attack.step(
        state, UPDATES, torch.zeros(3, dtype=torch.bool), aggregate=build_aggregator("median")
    )

    assert torch.equal(out, UPDATES) and out.data_ptr() != UPDATES.data_ptr()
    assert new_state is state and diagnostics == {}
