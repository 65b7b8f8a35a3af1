"""The statistics behind the robustness tables: a worst case per seed, paired tests
blocked by seed with Holm's correction, exact McNemar tests and exact rate intervals."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.statistics import (
    exact_mcnemar,
    rate_interval,
    seed_blocked_differences,
    smallest_p,
    worst_per_seed,
)


def test_the_worst_case_is_taken_per_seed_before_averaging():
    """Two attacks each bad in a different seed: the minimum of their means (0.7) hides
    that every seed met an attack that took it to 0.4."""
    scores = {"alie": {0: 0.4, 1: 1.0}, "ipm": {0: 1.0, 1: 0.4}, "noise": {0: 0.9}}

    worst, lowest = worst_per_seed(scores)

    assert worst == {0: 0.4, 1: 0.4}
    assert min(np.mean(list(s.values())) for s in scores.values()) == pytest.approx(0.7)
    assert lowest == {"alie": 1, "ipm": 1}


def test_seed_blocked_differences_support_a_consistent_gap_and_not_noise():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.5, 0.9, 12)
    keys = [("attack", seed) for seed in range(12)]
    scores = {
        "strong": dict(zip(keys, base + 0.05 + rng.normal(0, 0.01, 12), strict=True)),
        "weak": dict(zip(keys, base, strict=True)),
        "twin": dict(zip(keys, base + rng.normal(0, 0.01, 12), strict=True)),
    }

    pairs = {(p.first, p.second): p for p in seed_blocked_differences(scores)}

    assert pairs["strong", "weak"].supported and pairs["strong", "weak"].mean_difference > 0
    assert pairs["strong", "weak"].p_value == pytest.approx(smallest_p(12))
    assert not pairs["weak", "twin"].supported
    assert all(p.p_holm >= p.p_value for p in pairs.values())  # Holm adjusts upwards


def test_pairs_use_only_the_observations_both_methods_have_and_equal_ones_tie():
    scores = {
        "a": {("x", 0): 0.5, ("x", 1): 0.6, ("x", 2): 0.7},
        "b": {("x", 1): 0.6, ("x", 2): 0.7, ("x", 3): 0.1},
    }

    [pair] = seed_blocked_differences(scores)

    assert pair.n == 2 and pair.mean_difference == 0 and pair.p_value == 1.0
    assert not pair.supported


def test_rate_intervals_are_exact_and_stay_inside_zero_and_one():
    rate, low, high = rate_interval(0, 10)
    assert (rate, low) == (0.0, 0.0)
    assert high == pytest.approx(1 - 0.025 ** (1 / 10))  # Clopper-Pearson: 0.308
    rate, low, high = rate_interval(10, 10)
    assert rate == 1.0 and high == pytest.approx(1.0) and low < 1.0
    assert all(np.isnan(rate_interval(0, 0)))


def test_exact_mcnemar_counts_the_discordant_seeds_and_tests_them_exactly():
    # seeds 0-9: the first bans an honest client in 6 seeds, the second in 1 (seed 0, shared)
    first = {seed: seed < 6 for seed in range(10)}
    second = {seed: seed == 0 for seed in range(10)}

    only_first, only_second, p = exact_mcnemar(first, second)

    assert (only_first, only_second) == (5, 0)
    assert p == pytest.approx(2 * 0.5**5)  # binomial, two-sided: 0.0625
    assert exact_mcnemar(first, first) == (0, 0, 1.0)


def test_seed_blocked_tests_exchange_whole_seeds_and_five_cannot_reach_five_percent():
    # A beats B under every attack of every seed: 5 seeds give 2 / 32 at best, 10 seeds
    # give 2 / 1024; 13 attacks per seed do not count as 13 more observations
    attacks = [f"attack{i}" for i in range(13)]
    for seeds, p in ((5, 0.0625), (10, 2 / 1024)):
        a = {(attack, seed): 0.9 for attack in attacks for seed in range(seeds)}
        b = {(attack, seed): 0.8 - 0.01 * seed for attack in attacks for seed in range(seeds)}

        [pair] = seed_blocked_differences({"A": a, "B": b})

        assert pair.n == seeds and pair.p_value == pytest.approx(p) == smallest_p(seeds)
        assert pair.mean_difference > 0 and pair.supported == (seeds == 10)


def test_seed_blocked_test_averages_a_seeds_attacks_before_testing():
    # per seed the differences over attacks average to +0.1, -0.1, +0.1, -0.1: no effect
    a = {("x", s): 1.0 for s in range(4)} | {("y", s): 0.0 for s in range(4)}
    b = {("x", s): 0.8 if s % 2 == 0 else 1.2 for s in range(4)} | {("y", s): 0.0 for s in range(4)}

    [pair] = seed_blocked_differences({"A": a, "B": b})

    assert pair.mean_difference == pytest.approx(0.0) and pair.p_value == pytest.approx(1.0)
