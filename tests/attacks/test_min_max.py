"""Min-Max and Min-Sum: Algorithm 1's search, the three perturbations and both budgets."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from federated.attacks import build_attack, halving_search

ONE_D = torch.tensor([[9.0], [0.0], [1.0], [5.0]])  # row 0 malicious; benign 0, 1, 5
ONE_D_MASK = torch.tensor([True, False, False, False])


@pytest.mark.parametrize(
    ("name", "params", "gamma"),
    [("min_max", {}, 2.0), ("min_sum", {}, 3.0), ("min_sum", {"bound": "min"}, 1.0)],
)
def test_one_dimensional_reference(name: str, params: dict, gamma: float) -> None:
    # mean 2, unit vector 1: m = 2 - gamma. min_max: 3 + gamma <= 5. min_sum: 14 + 3 gamma^2
    # <= 41 (max of the benign sums 26, 17, 41) or <= 17 (their min)
    out, _, diagnostics = build_attack(name, **params).step({}, ONE_D, ONE_D_MASK)

    assert diagnostics["gamma"] == pytest.approx(gamma, abs=1e-4)
    assert float(out[0, 0]) == pytest.approx(2.0 - gamma, abs=1e-4)
    assert torch.equal(out[1:], ONE_D[1:])


@pytest.mark.parametrize(
    ("perturbation", "gamma", "row"),
    [
        # sign [1, -1]: (1 + g)^2 + (2 + g)^2 <= 20 -> g = (-3 + sqrt 39) / 2
        ("sign", (-3 + math.sqrt(39)) / 2, None),
        # unit [1, -2]/sqrt 5: the row of [2, -4] is farthest; |[1, -2] (1 + g/sqrt 5)| <= sqrt 20
        ("unit_vec", math.sqrt(5), [0.0, 0.0]),
        # std sqrt 2 [1, 2]: [0, 0] is farthest, 5 + 10 g^2 + 6 sqrt 2 g <= 20
        ("std", (-6 * math.sqrt(2) + math.sqrt(672)) / 20, None),
    ],
)
def test_min_max_with_each_perturbation_stays_within_the_benign_diameter(
    perturbation: str, gamma: float | None, row: list[float] | None
) -> None:
    updates = torch.tensor([[7.0, 7.0], [0.0, 0.0], [2.0, -4.0]], dtype=torch.float64)
    mask = torch.tensor([True, False, False])

    out, _, diagnostics = build_attack("min_max", perturbation=perturbation).step({}, updates, mask)

    farthest = float(torch.linalg.vector_norm(updates[1:] - out[0], dim=1).max())
    assert farthest == pytest.approx(math.sqrt(20), abs=1e-4)  # the budget is reached
    if gamma is not None:
        assert diagnostics["gamma"] == pytest.approx(gamma, abs=1e-4)
    if row is not None:
        assert out[0].tolist() == pytest.approx(row, abs=1e-4)


def test_halving_search_finds_the_boundary_and_stays_below_twice_the_start() -> None:
    assert halving_search(lambda g: g <= 12.3, gamma_init=10.0, tolerance=1e-6) == pytest.approx(
        12.3, abs=1e-5
    )
    assert 19.99 < halving_search(lambda g: True, gamma_init=10.0, tolerance=1e-6) < 20.0
    assert halving_search(lambda g: g <= 0, gamma_init=10.0, tolerance=1e-6) == 0.0


def test_the_attack_reads_only_the_benign_rows() -> None:
    other = ONE_D.clone()
    other[0] = -100.0

    assert torch.equal(
        build_attack("min_max").apply(ONE_D, ONE_D_MASK)[0],
        build_attack("min_max").apply(other, ONE_D_MASK)[0],
    )


def test_a_zero_benign_mean_leaves_nothing_to_push_along() -> None:
    updates = torch.tensor([[5.0, 5.0], [1.0, -1.0], [-1.0, 1.0]])

    out = build_attack("min_sum").apply(updates, torch.tensor([True, False, False]))

    assert out[0].tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("name", "mask", "match"),
    [
        ("min_max", [True, True, True, True], "benign"),
        ("min_sum", [True, True, True, False], "perturbation='std' needs at least two benign"),
    ],
)
def test_impossible_rounds_are_refused(name: str, mask: list[bool], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_attack(name, perturbation="std").apply(ONE_D, torch.tensor(mask))


@settings(max_examples=40, deadline=None)
@given(
    benign=st.integers(2, 8),
    d=st.integers(1, 6),
    seed=st.integers(0, 2**31),
    name=st.sampled_from(["min_max", "min_sum"]),
    perturbation=st.sampled_from(["unit_vec", "std", "sign"]),
)
def test_property_gamma_is_feasible_and_maximal(
    benign: int, d: int, seed: int, name: str, perturbation: str
) -> None:
    generator = torch.Generator().manual_seed(seed)
    updates = torch.randn(benign + 2, d, generator=generator, dtype=torch.float64)
    mask = torch.zeros(benign + 2, dtype=torch.bool)
    mask[:2] = True
    honest = updates[~mask]
    attack = build_attack(name, perturbation=perturbation)

    out, _, diagnostics = attack.step({}, updates, mask)

    gamma = diagnostics["gamma"]
    direction = (honest.mean(dim=0) - out[0]) / gamma if gamma > 0 else None
    distances = torch.linalg.vector_norm(honest - out[0], dim=1)
    pairwise = torch.cdist(honest, honest)
    if name == "min_max":
        assert float(distances.max()) <= float(pairwise.max()) + 1e-9
    else:
        assert float(distances.square().sum()) <= float(pairwise.square().sum(dim=1).max()) + 1e-9
    if direction is not None and gamma < 19.0:  # not capped by 2 * gamma_init
        beyond = honest.mean(dim=0) - (gamma + 1e-3) * direction
        far = torch.linalg.vector_norm(honest - beyond, dim=1)
        if name == "min_max":
            assert float(far.max()) > float(pairwise.max())
        else:
            assert float(far.square().sum()) > float(pairwise.square().sum(dim=1).max())
