"""EMA's estimator by Monte Carlo: bias and variance against the mean and the median,
each column of a (clients × replicates) matrix one independent federation round."""

from __future__ import annotations

import math

import pytest

from benchmarks.papers.ema_monte_carlo import CLIENTS, REPLICATES, estimates


def test_on_normal_data_ema_is_unbiased_and_nearly_as_efficient_as_the_mean() -> None:
    out = estimates(0.0)
    variance = {name: float(v.var()) for name, v in out.items()}

    standard_error = math.sqrt(variance["ema"] / REPLICATES)
    assert abs(float(out["ema"].mean())) < 4 * standard_error
    # the mean is optimal (1/n); the median costs pi/2 of it; EMA sits between, near the mean
    assert variance["mean"] == pytest.approx(1 / CLIENTS, rel=0.05)
    assert variance["mean"] < variance["ema"] < variance["median"]
    assert variance["ema"] / variance["mean"] < 1.25


@pytest.mark.parametrize("share", [0.1, 0.2])
def test_under_contamination_below_a_quarter_ema_is_less_biased_than_mean_and_median(
    share: float,
) -> None:
    out = estimates(share)
    bias = {name: abs(float(v.mean())) for name, v in out.items()}

    assert bias["mean"] == pytest.approx(10 * share, rel=0.05)
    assert bias["ema"] < bias["median"] < bias["mean"]
    assert float(out["ema"].var()) < 2 / CLIENTS  # the dropped outliers add no spread


def test_from_a_quarter_of_one_sided_outliers_the_fences_give_way() -> None:
    # Q3 lands among the outliers, the IQR spans them and nothing is fenced: EMA's
    # breakdown point is a quarter, where the median's is a half
    out = estimates(0.3)
    bias = {name: abs(float(v.mean())) for name, v in out.items()}

    assert bias["ema"] > 2.0 > 1.0 > bias["median"]
