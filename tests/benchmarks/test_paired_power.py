"""The paired tables' detectable difference: the power of the exact sign-flip test the
tables ran, at Holm's strictest step."""

import numpy as np

from benchmarks.evidence.tables.paired import detectable_factor, sign_flip_p, sign_flip_power
from tasks.statistics import seed_difference


def test_five_seeds_detect_nothing():
    # the smallest exact two-sided p over 5 seeds is 2/32 = 0.0625 > 0.05
    assert detectable_factor(5, 1) is None


def test_ten_seeds_factor_has_80_percent_power():
    factor = detectable_factor(10, 1)
    assert factor is not None and 0.5 < factor < 2
    assert 0.78 <= sign_flip_power(factor, 10, 0.05) <= 0.85
    assert sign_flip_power(factor - 0.05, 10, 0.05) < 0.8


def test_larger_family_needs_larger_difference():
    assert detectable_factor(10, 4) > detectable_factor(10, 1)
    assert detectable_factor(10, 12) > detectable_factor(10, 4)


def test_enumeration_matches_the_test_used():
    rows = np.random.default_rng(3).normal(0.4, 1, (12, 8))
    rows[0] = [1, -1] * 4
    zeros = {("a", i): 0.0 for i in range(8)}
    expected = [seed_difference(dict(zip(zeros, r, strict=True)), zeros)[1] for r in rows]
    assert np.allclose(sign_flip_p(rows), expected)
