"""A paired table: methods against one reference, seed by seed, Holm-adjusted, with a
difference each test could detect (the power of the exact sign-flip test it ran, under
Holm). The claims ledger reads its verdicts from the same adjustment the table shows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any

import numpy as np

from benchmarks.evidence.tables.cells import shown
from tasks.comparison import interval
from tasks.statistics import EXACT_UP_TO

POWER = 0.8
POWER_DRAWS = 4000  # simulated sets of per-seed differences per candidate difference


def sign_flip_p(differences: np.ndarray) -> np.ndarray:
    """The exact two-sided sign-flip p of each row of ``differences`` (draws × seeds),
    every sign pattern enumerated: the p of :func:`tasks.statistics.seed_difference`
    (scipy's ``permutation_test`` with ``permutation_type='samples'``, its tolerance for
    ties included), for many draws at once. The null is symmetric (a pattern and its
    negation), so p = 2 · #{patterns: mean ≥ |observed|} / 2ⁿ = #{patterns with the first
    sign +: |mean| ≥ |observed|} / 2ⁿ⁻¹."""
    draws, n = differences.shape
    half = 2 ** (n - 1)
    signs = 1.0 - 2.0 * ((np.arange(half)[:, None] >> np.arange(n)) & 1)
    observed = np.abs(differences.mean(axis=1))
    bound = observed - observed * np.finfo(float).eps * 100
    p = np.empty(draws)
    for start in range(0, draws, 512):
        rows = slice(start, start + 512)
        null = np.abs(differences[rows] @ signs.T) / n
        p[rows] = np.minimum(1.0, (null >= bound[rows, None]).sum(axis=1) / half)
    return p


def sign_flip_power(effect: float, n: int, threshold: float, draws: int = POWER_DRAWS) -> float:
    """The share of ``draws`` seeded sets of ``n`` per-seed differences ~ Normal(``effect``,
    1) whose exact sign-flip p is below ``threshold``."""
    noise = np.random.default_rng(0).standard_normal((draws, n))
    return float(np.mean(sign_flip_p(effect + noise) < threshold))


def detectable_factor(n: int, family: int, alpha: float = 0.05) -> float | None:
    """The smallest true mean difference, in units of the per-seed differences' standard
    deviation, that the exact sign-flip test over ``n`` seeds detects with 80 % power at
    α / ``family``: Holm's first and strictest step, which rejects a test whatever its
    family's other p-values, so the power is a lower bound and the difference an upper
    bound on what the test, Holm-adjusted, could detect. Simulated (:func:`sign_flip_power`,
    seeded, the same draws at every candidate), found by bisection to 0.01. None where no
    sign pattern reaches p < α / ``family``: the smallest exact p is 2 / 2ⁿ."""
    if n > EXACT_UP_TO:
        raise ValueError(f"{n} seeds: the test samples sign patterns beyond {EXACT_UP_TO}")
    # p is a count of patterns over 2ⁿ⁻¹: thresholds allowing the same count share a factor
    allowed = math.ceil(2 ** (n - 1) * alpha / family) - 1
    return _factor(n, allowed) if allowed >= 1 else None


@cache
def _factor(n: int, allowed: int) -> float:
    """:func:`detectable_factor` for a test that rejects at ≤ ``allowed`` patterns as extreme
    as the observed one, once per process."""
    threshold = (allowed + 0.5) / 2 ** (n - 1)
    low, high = 0.0, 1.0
    while sign_flip_power(high, n, threshold) < POWER:
        low, high = high, 2 * high
    while high - low > 0.01:
        middle = (low + high) / 2
        low, high = (
            (middle, high) if sign_flip_power(middle, n, threshold) < POWER else (low, middle)
        )
    return high


@dataclass(frozen=True)
class Paired:
    """Methods against one reference, seed by seed: per test (method, ``label``'s value,
    (per-seed differences, sign-flip p)). Holm adjusts over every test of the table: the
    table is one family, and the claims ledger reads its verdicts from the same
    adjustment the table shows."""

    tests: list[tuple[str, str, tuple[Any, float]]]
    reference: str
    label: str
    statistic: str = "worst case"

    def families(self) -> list[list[int]]:
        """The tests' indices, one list per family Holm adjusts over: the whole table."""
        return [list(range(len(self.tests)))]

    def index_of(self, method: str, value: str) -> int | None:
        """The index of ``method``'s test at ``value``, or None where the table has none."""
        for index, (tested, tested_value, _) in enumerate(self.tests):
            if (tested, tested_value) == (method, value):
                return index
        return None

    def family_size(self, index: int) -> int:
        """How many tests Holm adjusts test ``index`` with: the table's."""
        return len(self.tests)

    def holm(self) -> list[float]:
        """Each test's p, Holm-adjusted within its family (statsmodels)."""
        return list(self._holm)

    @cached_property
    def _holm(self) -> tuple[float, ...]:
        """Adjusted once per table: statsmodels' Holm runs a full garbage collection on
        every call, a second or more in a process holding the records."""
        from statsmodels.stats.multitest import multipletests

        adjusted = [1.0] * len(self.tests)
        for members in self.families():
            holm = multipletests([self.tests[i][2][1] for i in members], method="holm")[1]
            for i, p_holm in zip(members, holm, strict=True):
                adjusted[i] = float(p_holm)
        return tuple(adjusted)


def against_block(paired: Paired) -> str:
    """A paired table: per test the mean difference ± t-interval, the exact p, Holm's
    adjustment (:meth:`Paired.holm`), and, where the adjusted p is not below 0.05, a
    difference the exact sign-flip test had at least an 80 % chance to detect at Holm's
    strictest step, α / m (:func:`detectable_factor` times the differences' standard
    deviation), or why none was detectable."""
    lines = [
        f"| method | {paired.label} | {paired.statistic} minus {paired.reference}'s "
        "| p (sign-flip over seeds) | p, Holm "
        "| detectable difference (≥ 80 % power, exact test at α / m) |",
        "|---|---|---|---|---|---|",
    ]
    for index, ((method, value, (differences, p)), p_holm) in enumerate(
        zip(paired.tests, paired.holm(), strict=True)
    ):
        _, std, _ = interval(list(differences))
        n, family = len(differences), paired.family_size(index)
        factor = detectable_factor(n, family) if n > 1 else None
        if p_holm < 0.05:
            detectable = "–"
        elif not std > 0:
            detectable = "none: equal in every seed"
        elif factor is None:
            detectable = f"none: with {n} seeds the exact test cannot reach p < α/m = 0.05/{family}"
        else:
            detectable = f"{factor * std:.2f}"
        lines.append(
            f"| {method} | {value} | {shown(differences, 3)} | {p:.3g} | {p_holm:.3g} "
            f"| {detectable} |"
        )
    return "\n".join(lines) + "\n"
