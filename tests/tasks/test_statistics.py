"""The statistics behind the robustness tables: a worst case per seed, paired tests
blocked by seed with Holm's correction (an exact sign-flip test on integers, so ties are
exact), exact McNemar tests, exact rate intervals and the logit-scale t-interval of a
share."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.statistics import (
    exact_mcnemar,
    rate_interval,
    seed_blocked_differences,
    seed_difference,
    share_interval,
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


def test_the_sign_flip_test_counts_tied_patterns_exactly():
    """Four-digit scores whose differences are equal in decimals but not in binary: scipy's
    permutation test on the float differences gives 0.6875, leaving out sign patterns
    exactly as extreme as the observed one; on the scores counted in whole units every
    pattern is compared exactly, as a brute-force count with integers does."""
    import itertools

    first = [0.9514, 0.956, 0.9592, 0.9613, 0.9453, 0.9548, 0.9601, 0.9465]
    second = [0.9541, 0.9505, 0.9565, 0.9586, 0.9508, 0.9521, 0.9546, 0.952]
    units = [round(a * 10_000) - round(b * 10_000) for a, b in zip(first, second, strict=True)]
    observed = abs(sum(units))
    as_extreme = sum(
        abs(sum(sign * u for sign, u in zip(signs, units, strict=True))) >= observed
        for signs in itertools.product((1, -1), repeat=len(units))
    )

    _, p = seed_difference(
        {("attack", seed): v for seed, v in enumerate(first)},
        {("attack", seed): v for seed, v in enumerate(second)},
    )

    assert p == as_extreme / 2 ** len(units) == 0.828125


def test_a_seed_enters_the_sign_flip_test_as_its_mean_over_the_attacks_it_ran():
    """Seed 0 ran two attacks and seed 1 one: each seed counts as its mean difference
    (weights by the least common multiple of the counts), so only the patterns with both
    signs alike reach the observed mean, p = 2/4."""
    first = {("a", 0): 0.3, ("b", 0): 0.1, ("a", 1): 0.2}
    second = {("a", 0): 0.1, ("b", 0): 0.1, ("a", 1): 0.1}

    differences, p = seed_difference(first, second)

    assert differences.tolist() == pytest.approx([0.1, 0.1]) and p == 0.5


@pytest.mark.parametrize(
    "shares", [[0.0, 0.0, 0.0, 0.033, 0.0], [0.91, 0.95, 0.93, 0.97, 0.96, 0.9], [0.2, 0.9]]
)
def test_a_share_interval_is_the_quasi_binomial_glms_t_interval_and_stays_in_0_1(shares):
    import statsmodels.api as sm

    fit = sm.GLM(np.array(shares), np.ones(len(shares)), family=sm.families.Binomial()).fit(
        scale="X2", use_t=True
    )
    expected = 1 / (1 + np.exp(-fit.conf_int(0.05)[0]))

    mean, low, high = share_interval(shares)

    assert mean == pytest.approx(np.mean(shares))
    assert (low, high) == pytest.approx(tuple(expected), rel=1e-9)
    assert 0 < low <= mean <= high < 1


def test_a_share_interval_of_equal_values_is_the_value_and_of_one_value_is_unknown():
    assert share_interval([0.0, 0.0, 0.0]) == (0.0, 0.0, 0.0)
    assert share_interval([0.5, 0.5]) == (0.5, 0.5, 0.5)
    mean, low, high = share_interval([0.7])
    assert mean == 0.7 and np.isnan(low) and np.isnan(high)
