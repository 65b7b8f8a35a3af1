"""The statistics a reviewer expects of a comparison over seeds: a worst case estimated
per seed, paired tests between methods blocked by seed with Holm's correction, exact
McNemar tests of per-seed events, exact intervals for counts of independent runs and
logit-scale t-intervals for shares averaged over seeds. Pure functions over plain
numbers; scipy and statsmodels do the tests and intervals.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special, stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

__all__ = [
    "PairedDifference",
    "exact_mcnemar",
    "rate_interval",
    "seed_blocked_differences",
    "share_interval",
    "smallest_p",
    "worst_per_seed",
]


def worst_per_seed(
    scores: Mapping[str, Mapping[int, float]],
) -> tuple[dict[int, float], Counter[str]]:
    """Per seed, the lowest score over the attacks (``scores[attack][seed]``) run with
    that seed, and how often each attack was the lowest. The minimum of per-attack means
    is biased low and its interval is not one for the worst case; a per-seed worst
    followed by an interval over seeds is."""
    worst: dict[int, float] = {}
    lowest: dict[int, str] = {}
    for attack, by_seed in scores.items():
        for seed, score in by_seed.items():
            if math.isnan(score):
                continue
            if seed not in worst or score < worst[seed]:
                worst[seed], lowest[seed] = score, attack
    return dict(sorted(worst.items())), Counter(lowest.values())


@dataclass(frozen=True)
class PairedDifference:
    """``first`` minus ``second`` over the ``n`` paired observations both have."""

    first: str
    second: str
    n: int
    mean_difference: float
    p_value: float
    p_holm: float  # adjusted over every pair compared together

    @property
    def supported(self) -> bool:
        return self.p_holm < 0.05


def rate_interval(successes: int, trials: int) -> tuple[float, float, float]:
    """A rate of independent trials (runs, one per seed) and its exact 95 % Clopper–Pearson
    interval (inside [0, 1], unlike a t-interval on a count); NaNs when there were no
    trials. Not for events pooled over seeds: those are not independent trials."""
    if trials <= 0:
        return math.nan, math.nan, math.nan
    low, high = proportion_confint(successes, trials, alpha=0.05, method="beta")
    return successes / trials, float(low), float(high)


def share_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """The mean of per-seed shares (accuracies, AUCs, rates: each in [0, 1]) and its 95 %
    interval, a Student t-interval on the logit scale around the mean: statsmodels'
    quasi-binomial GLM with an intercept alone, fitted with the Pearson scale and t
    quantiles (``GLM(values, 1, Binomial()).fit(scale="X2", use_t=True)``), written out
    in closed form because a table computes thousands (a test holds the two equal):
    logit(m) ± t(0.975, n − 1) · s / (√n · m(1 − m)). It never leaves [0, 1] and, unlike
    the percentile bootstrap (83 % at 5 seeds), covers the mean about 95 % of the time
    at 5 and 10 seeds (benchmarks/evidence/share_intervals.py). Equal values give the value as
    both bounds; NaN bounds below two values."""
    from tasks.comparison import interval

    mean, spread, half = interval(values)
    if math.isnan(half):
        return mean, math.nan, math.nan
    if spread == 0 or not 0 < mean < 1:
        return mean, mean, mean
    centre, width = special.logit(mean), half / (mean * (1 - mean))
    return mean, float(special.expit(centre - width)), float(special.expit(centre + width))


def exact_mcnemar(
    first: Mapping[Hashable, bool], second: Mapping[Hashable, bool]
) -> tuple[int, int, float]:
    """Two methods' yes/no outcomes paired by seed (``first[seed]``): how many seeds only
    the first had, how many only the second had, and the exact McNemar p-value (a
    two-sided binomial test on those discordant seeds; 1 when there are none)."""
    from statsmodels.stats.contingency_tables import mcnemar

    seeds = [seed for seed in first if seed in second]
    only_first = sum(bool(first[s]) and not second[s] for s in seeds)
    only_second = sum(bool(second[s]) and not first[s] for s in seeds)
    if only_first + only_second == 0:
        return 0, 0, 1.0
    both = sum(bool(first[s]) and bool(second[s]) for s in seeds)
    neither = len(seeds) - both - only_first - only_second
    table = [[both, only_first], [only_second, neither]]
    return only_first, only_second, float(mcnemar(table, exact=True).pvalue)


EXACT_UP_TO = 16  # seeds: every sign pattern (65,536) up to here, a seeded sample beyond


def smallest_p(seeds: int) -> float:
    """The smallest two-sided p-value an exact sign-flip test over ``seeds`` paired seeds
    can give (all differences one way): ``2 / 2**seeds``; 0.0625 at 5 seeds, so five
    seeds cannot support a difference at 0.05 whatever its size."""
    return min(1.0, 2.0 / 2.0**seeds)


RESOLUTION = 1e-6  # below any digit the records hold (4 or 5 decimals)


def seed_difference(
    first: Mapping[tuple[str, int], float],
    second: Mapping[tuple[str, int], float],
    resolution: float = RESOLUTION,
) -> tuple[np.ndarray, float]:
    """Per seed, the mean over the (attack, seed) keys both have of ``first − second``,
    and the exact two-sided sign-flip p-value over seeds (the seed is the unit that was
    sampled: a seed's attacks share its partition and initial model, so the seed, not
    the (attack, seed) pair, is what may be exchanged).

    The test runs on integers, so tied sign patterns are exactly tied: every value is
    counted in units of ``resolution``, and each seed enters as its sum of differences
    weighted by lcm(keys per seed) / its keys (its mean, in whole units). scipy's
    permutation test compares floats within a relative tolerance, and differences equal
    in decimals but not in binary once slipped past it (0.986 where the exact p is 0.992)."""
    per_seed: dict[int, list[int]] = {}
    means: dict[int, list[float]] = {}
    for key, value in first.items():
        if key in second and math.isfinite(value) and math.isfinite(second[key]):
            counted = round(value / resolution) - round(second[key] / resolution)
            per_seed.setdefault(key[1], []).append(counted)
            means.setdefault(key[1], []).append(value - second[key])
    differences = np.array([np.mean(v) for _, v in sorted(means.items())], float)
    common = math.lcm(*(len(v) for v in per_seed.values())) if per_seed else 1
    units = np.array([sum(v) * (common // len(v)) for _, v in sorted(per_seed.items())], np.int64)
    if len(units) == 0 or np.all(units == 0):
        return differences, 1.0
    result = stats.permutation_test(
        (units, np.zeros_like(units)),
        lambda x, y, axis: np.sum(x - y, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=np.inf if len(units) <= EXACT_UP_TO else 99_999,
        alternative="two-sided",
        rng=np.random.default_rng(0),
    )
    return differences, float(min(1.0, result.pvalue))


def seed_blocked_differences(
    scores: Mapping[str, Mapping[tuple[str, int], float]],
) -> list[PairedDifference]:
    """Every pair of methods compared seed by seed (:func:`seed_difference`: per-seed
    mean differences over the attacks both ran, an exact sign-flip test over seeds), the
    p-values adjusted together with Holm's step-down method. ``n`` counts seeds."""
    pairs = []
    for first, second in itertools.combinations(scores, 2):
        differences, p_value = seed_difference(scores[first], scores[second])
        if len(differences):
            pairs.append((first, second, len(differences), float(differences.mean()), p_value))
    if not pairs:
        return []
    adjusted = multipletests([p for *_, p in pairs], method="holm")[1]
    return [
        PairedDifference(first, second, n, mean, p, float(p_holm))
        for (first, second, n, mean, p), p_holm in zip(pairs, adjusted, strict=True)
    ]
