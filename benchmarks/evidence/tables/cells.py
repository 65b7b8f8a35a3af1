"""How a figure is written in a table cell (a difference or a measure: mean ± 95 % t
half-width; a share in [0, 1] averaged over seeds: its mean and 95 % logit-scale
t-interval, which stays in [0, 1] (:func:`tasks.statistics.share_interval`); a count with
its range over seeds; a rate of independent runs with its exact interval; a goal met or
not), and a markdown table of rows."""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import cache
from typing import Any

import numpy as np

from tasks import statistics
from tasks.comparison import interval
from tasks.statistics import rate_interval


def shown(values: Iterable[float], digits: int = 2) -> str:
    """Mean ± 95 % t half-width with n: ``0.62 ± 0.05 [5]``."""
    values = list(values)
    mean, _, half = interval(values)
    if math.isnan(mean):
        return "–"
    spread = "" if math.isnan(half) else f" ± {half:.{digits}f}"
    return f"{mean:.{digits}f}{spread} [{len(values)}]"


@cache
def share_interval(values: tuple[float, ...]) -> tuple[float, float, float]:
    """The mean of per-seed shares and its 95 % logit-scale t-interval over seeds
    (:func:`tasks.statistics.share_interval`), once per distinct set of values."""
    return statistics.share_interval(values)


def shown_share(values: Iterable[float], digits: int = 2, scale: float = 1.0) -> str:
    """A share per seed (accuracy, AUC, a rate): mean [95 % logit-scale t-interval] with
    n, ``0.62 [0.58, 0.65] [5]``; ``scale`` = 100 writes it in percent."""
    values = tuple(float(v) for v in values)
    mean, low, high = share_interval(values)
    if math.isnan(mean):
        return "–"
    spread = "" if math.isnan(low) else f" [{low * scale:.{digits}f}, {high * scale:.{digits}f}]"
    return f"{mean * scale:.{digits}f}{spread} [{len(values)}]"


def plain_share(values: Iterable[Any], digits: int = 3) -> str:
    """:func:`shown_share` without n (the row's seeds column gives it)."""
    values = tuple(float(v) for v in values)
    mean, low, high = share_interval(values)
    return f"{mean:.{digits}f}" + (
        "" if math.isnan(low) else f" [{low:.{digits}f}, {high:.{digits}f}]"
    )


def shown_counts(values: Iterable[float]) -> str:
    """A count per seed: its mean and its range over seeds with n, ``0.2 (0–1) [5]``."""
    values = [float(v) for v in values]
    if not values:
        return "–"
    return f"{np.mean(values):.1f} ({min(values):g}–{max(values):g}) [{len(values)}]"


def shown_rate(successes: float, trials: float) -> str:
    """k of n independent runs (one per seed) as a rate with its exact interval."""
    rate, low, high = rate_interval(int(successes), int(trials))
    return "–" if math.isnan(rate) else f"{rate:.2f} [{low:.2f}, {high:.2f}]"


def shown_seed_rates(hits: Iterable[float], trials: Iterable[float]) -> str:
    """A rate taken at the level it was sampled: one rate per seed (events over that
    seed's client-rounds or images, which share its partition and model), their mean with
    a 95 % logit-scale t-interval over seeds (:func:`shown_share`), and in how many
    seeds it happened at all."""
    rates = [h / t for h, t in zip(hits, trials, strict=True) if t > 0]
    if not rates:
        return "–"
    seeds_with = sum(rate > 0 for rate in rates)
    return f"{shown_share(rates)}; {seeds_with} of {len(rates)} seeds"


def plain(values: Iterable[Any], digits: int = 3, scale: float = 1.0) -> str:
    """Mean ± 95 % t half-width, without n (the row's seeds column gives it)."""
    mean, _, half = interval([float(v) * scale for v in values])
    return f"{mean:.{digits}f}" + ("" if math.isnan(half) else f" ± {half:.{digits}f}")


def table(header: tuple[str, ...], rows: Iterable[tuple[Any, ...]]) -> str:
    """A markdown table of ``rows`` under ``header``."""
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def ratio_check(value: float, goal: float, *, at_most: bool) -> str:
    met = value <= goal if at_most else value >= goal
    return f"{'≤' if at_most else '≥'} {goal:g} " + ("✓" if met else "✗")
