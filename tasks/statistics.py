"""The statistics a reviewer expects of a comparison over seeds: a worst case estimated
per seed, paired tests between methods with Holm's correction, and intervals for rates
that stay inside [0, 1]. Pure functions over plain numbers; scipy and statsmodels do the
tests and intervals.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

__all__ = ["PairedDifference", "paired_differences", "rate_interval", "worst_per_seed"]


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


def paired_differences(
    scores: Mapping[str, Mapping[Hashable, float]],
) -> list[PairedDifference]:
    """Every pair of methods compared on the observations both have (``scores[method]
    [key]``, a key being e.g. an (attack, seed) both ran): the Wilcoxon signed-rank test
    (two-sided; a pair whose differences are all zero gets p = 1), the p-values adjusted
    together with Holm's step-down method."""
    pairs = []
    for first, second in itertools.combinations(scores, 2):
        keys = [k for k in scores[first] if k in scores[second]]
        differences = np.array([scores[first][k] - scores[second][k] for k in keys], float)
        differences = differences[np.isfinite(differences)]
        if len(differences) == 0:
            continue
        p_value = 1.0 if np.all(differences == 0) else float(stats.wilcoxon(differences).pvalue)
        pairs.append((first, second, len(differences), float(differences.mean()), p_value))
    if not pairs:
        return []
    adjusted = multipletests([p for *_, p in pairs], method="holm")[1]
    return [
        PairedDifference(first, second, n, mean, p, float(p_holm))
        for (first, second, n, mean, p), p_holm in zip(pairs, adjusted, strict=True)
    ]


def rate_interval(successes: int, trials: int) -> tuple[float, float, float]:
    """A rate and its 95 % Wilson interval (inside [0, 1], unlike a t-interval on a
    count); NaNs when there were no trials."""
    if trials <= 0:
        return math.nan, math.nan, math.nan
    low, high = proportion_confint(successes, trials, alpha=0.05, method="wilson")
    return successes / trials, float(low), float(high)
