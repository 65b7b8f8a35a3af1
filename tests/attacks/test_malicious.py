"""The malicious set, per-client seeds, masks and the attack registry."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from federated.attacks import (
    build_attack,
    choose_malicious,
    client_seed,
    list_attacks,
    malicious_mask,
)
from registry import RegistryError


@pytest.mark.parametrize(("n", "fraction", "size"), [(20, 0.2, 4), (10, 0.25, 3), (7, 0.0, 0)])
def test_fraction_gives_a_seeded_set_of_the_right_size(n: int, fraction: float, size: int) -> None:
    first = choose_malicious(n, fraction=fraction, seed=3)
    again = choose_malicious(n, fraction=fraction, seed=3)

    assert isinstance(first, frozenset)
    assert len(first) == size
    assert first == again
    assert all(0 <= i < n for i in first)


def test_different_seeds_give_different_sets() -> None:
    sets = {choose_malicious(100, fraction=0.2, seed=s) for s in range(5)}

    assert len(sets) == 5


def test_explicit_ids_are_taken_as_given() -> None:
    assert choose_malicious(10, ids=[7, 3], seed=0) == frozenset({3, 7})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fraction": 0.2, "ids": [1]}, "exactly one"),
        ({}, "exactly one"),
        ({"fraction": 1.5}, "fraction"),
        ({"ids": [1, 1]}, "duplicates"),
        ({"ids": [10]}, "outside"),
    ],
)
def test_bad_malicious_sets_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        choose_malicious(10, seed=0, **kwargs)


def test_client_seed_is_stable_and_distinct_per_client() -> None:
    seeds = [client_seed(42, i) for i in range(50)]

    assert seeds == [client_seed(42, i) for i in range(50)]
    assert len(set(seeds)) == 50
    assert client_seed(43, 0) != seeds[0]


def test_malicious_mask_follows_client_ids_not_positions() -> None:
    mask = malicious_mask([5, 2, 9], frozenset({9, 5}))

    assert mask.tolist() == [True, False, True]
    assert mask.dtype == torch.bool


def test_registry_lists_every_attack_with_its_kind() -> None:
    kinds = {name: build_attack(name).kind for name in list_attacks()}

    assert kinds == {
        "alie": "model",
        "backdoor": "both",
        "gaussian": "model",
        "inf": "model",
        "ipm": "model",
        "label_flip": "data",
        "mimic": "model",
        "min_max": "model",
        "min_sum": "model",
        "nan": "model",
        "none": "none",
        "opt_alie": "model",
        "opt_ipm": "model",
        "scaling": "model",
        "sign_flip": "model",
    }


def test_unknown_attack_and_unknown_parameter_list_what_exists() -> None:
    with pytest.raises(RegistryError, match=r"available: .*label_flip"):
        build_attack("flip")
    with pytest.raises(RegistryError, match="accepted: scale"):
        build_attack("sign_flip", factor=2.0)


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("label_flip", {"rate": 1.5}, r"label_flip rate must be a number in \[0, 1\], got 1.5"),
        (
            "label_flip",
            {"mapping": "shift"},
            "mapping must be one of 'reverse', 'random', got 'shift'",
        ),
        ("sign_flip", {"scale": 0.0}, "sign_flip scale must be a finite number > 0, got 0.0"),
        ("scaling", {"factor": -1.0}, "scaling factor must be a finite number > 0, got -1.0"),
        ("gaussian", {"sigma": 0.0}, "gaussian sigma must be a finite number > 0, got 0.0"),
        ("gaussian", {"mode": "mul"}, "mode must be one of 'replace', 'add', got 'mul'"),
        ("alie", {"z": float("inf")}, "alie z must be a finite number or None, got inf"),
        ("alie", {"reference": "mine"}, "reference must be one of 'benign', 'all', got 'mine'"),
        ("ipm", {"epsilon": -0.1}, "ipm epsilon must be a finite number > 0, got -0.1"),
        ("opt_alie", {"evals": 0}, "evals must be an integer >= 1, got 0"),
        ("opt_alie", {"delta": 0.0}, "delta must be finite and non-zero"),
        ("opt_ipm", {"ratio": 0.5}, r"ratio must be a number in \(0.5, 1\), got 0.5"),
        ("opt_ipm", {"start": float("nan")}, "start must be a finite number, got nan"),
        ("mimic", {"warmup": 0}, "mimic warmup must be an integer >= 1 or None, got 0"),
        (
            "min_max",
            {"perturbation": "uv"},
            "perturbation must be one of 'unit_vec', 'std', 'sign', got 'uv'",
        ),
        ("min_max", {"gamma_init": 0.0}, "gamma_init must be a finite number > 0, got 0.0"),
        ("min_sum", {"tolerance": -1.0}, "tolerance must be a finite number > 0, got -1.0"),
        ("min_sum", {"bound": "mean"}, "bound must be one of 'max', 'min', got 'mean'"),
        (
            "backdoor",
            {"poison_fraction": 0.0},
            r"poison_fraction must be a number in \(0, 1\], got 0.0",
        ),
        ("backdoor", {"size": 0}, "backdoor size must be an integer >= 1, got 0"),
        ("backdoor", {"size": 2.5}, "size must be an integer >= 1, got 2.5"),
        (
            "backdoor",
            {"position": "centre"},
            "position must be one of 'top_left', 'top_right', 'bottom_left', 'bottom_right', got 'centre'",
        ),
        ("backdoor", {"boost": 5.0}, "boost only applies with model_replacement=True"),
        (
            "backdoor",
            {"model_replacement": True, "boost": -1.0},
            "boost must be a finite number > 0 or None, got -1.0",
        ),
        ("backdoor", {"eta": 0.0}, "eta must be a finite number > 0, got 0.0"),
        # NaN, infinities and bools are refused where a number is declared
        ("label_flip", {"rate": float("nan")}, r"rate must be a number in \[0, 1\], got nan"),
        ("sign_flip", {"scale": float("inf")}, "scale must be a finite number > 0, got inf"),
        ("backdoor", {"margin": True}, "margin must be an integer >= 0, got True"),
        ("mimic", {"warmup": 2.0}, "warmup must be an integer >= 1 or None, got 2.0"),
    ],
)
def test_bad_attack_parameters_name_the_parameter(name: str, params: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_attack(name, **params)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 500), fraction=st.floats(0.0, 1.0), seed=st.integers(0, 2**31))
def test_property_size_is_the_rounded_share(n: int, fraction: float, seed: int) -> None:
    chosen = choose_malicious(n, fraction=fraction, seed=seed)

    assert abs(len(chosen) - fraction * n) <= 0.5 + 1e-9
    assert all(0 <= i < n for i in chosen)
