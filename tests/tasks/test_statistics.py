"""The statistics behind the robustness tables: a worst case per seed, paired tests with
Holm's correction, and rate intervals that stay inside [0, 1]."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tasks.statistics import paired_differences, rate_interval, worst_per_seed


def test_the_worst_case_is_taken_per_seed_before_averaging():
    """Two attacks each bad in a different seed: the minimum of their means (0.7) hides
    that every seed met an attack that took it to 0.4."""
    scores = {"alie": {0: 0.4, 1: 1.0}, "ipm": {0: 1.0, 1: 0.4}, "noise": {0: 0.9}}

    worst, lowest = worst_per_seed(scores)

    assert worst == {0: 0.4, 1: 0.4}
    assert min(np.mean(list(s.values())) for s in scores.values()) == pytest.approx(0.7)
    assert lowest == {"alie": 1, "ipm": 1}


def test_paired_differences_support_a_consistent_gap_and_not_noise():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.5, 0.9, 30)
    scores = {
        "strong": dict(enumerate(base + 0.05 + rng.normal(0, 0.01, 30))),
        "weak": dict(enumerate(base)),
        "twin": dict(enumerate(base + rng.normal(0, 0.01, 30))),
    }

    pairs = {(p.first, p.second): p for p in paired_differences(scores)}

    assert pairs["strong", "weak"].supported and pairs["strong", "weak"].mean_difference > 0
    assert not pairs["weak", "twin"].supported
    # Holm adjusts upwards; the raw p-value is scipy's Wilcoxon signed-rank
    strong_weak = pairs["strong", "weak"]
    raw = stats.wilcoxon(np.array(list(scores["strong"].values())) - base).pvalue
    assert strong_weak.p_value == pytest.approx(raw)
    assert all(p.p_holm >= p.p_value for p in pairs.values())


def test_pairs_use_only_the_observations_both_methods_have_and_equal_ones_tie():
    scores = {"a": {0: 0.5, 1: 0.6, 2: 0.7}, "b": {1: 0.6, 2: 0.7, 3: 0.1}}

    [pair] = paired_differences(scores)

    assert pair.n == 2 and pair.mean_difference == 0 and pair.p_value == 1.0
    assert not pair.supported


def test_rate_intervals_are_wilson_and_stay_inside_zero_and_one():
    rate, low, high = rate_interval(0, 10)
    assert (rate, low) == (0.0, 0.0)
    assert high == pytest.approx(3.8415 / 13.8415, abs=1e-4)  # z² / (n + z²)
    rate, low, high = rate_interval(10, 10)
    assert rate == 1.0 and high == pytest.approx(1.0) and low < 1.0
    assert all(np.isnan(rate_interval(0, 0)))
