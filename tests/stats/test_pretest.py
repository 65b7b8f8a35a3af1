"""EMA Pre-Testing: rates, constant coordinates, layers, sampling, QQ data."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from federated.stats import (
    pretest_normality,
    qq_data,
    representative_coords,
    sample_coordinates,
)


def _mixed(rng: np.random.Generator) -> np.ndarray:
    """50 clients; columns 0..999 normal, 1000..1999 exponential, 2000..2099 constant."""
    values = np.empty((50, 2100))
    values[:, :1000] = rng.normal(size=(50, 1000))
    values[:, 1000:2000] = rng.exponential(size=(50, 1000))
    values[:, 2000:] = rng.normal(size=100)  # one value per column, the same for all
    return values


def test_rates_on_constructed_data_with_layers_and_constants() -> None:
    # arrange
    values = _mixed(np.random.default_rng(0))
    layers = {"normal": slice(0, 1000), "expon": slice(1000, 2000), "frozen": slice(2000, 2100)}

    # act
    res = pretest_normality(values, alpha=0.05, layer_slices=layers, chunk_size=333)

    # assert
    assert (res.n_tests, res.n_constant, res.n_clients) == (2100, 100, 50)
    assert res.anderson_rule == "critical_value"
    live = ~res.constant
    assert res.shapiro_rate == np.mean(res.tests.shapiro_p[live] >= 0.05)
    assert res.anderson_rate == res.anderson_normal[live].mean()
    assert not (res.shapiro_normal[res.constant] | res.anderson_normal[res.constant]).any()
    normal, expon, frozen = (res.per_layer[k] for k in ("normal", "expon", "frozen"))
    assert 0.92 < normal.shapiro_rate < 0.98 and 0.92 < normal.anderson_rate < 0.98
    assert expon.shapiro_rate < 0.01 and expon.anderson_rate < 0.02
    assert (frozen.n_tests, frozen.n_constant) == (100, 100)
    assert math.isnan(frozen.shapiro_rate) and math.isnan(frozen.anderson_rate)
    # equal-sized non-constant layers: the overall rate is their average
    assert res.shapiro_rate == pytest.approx((normal.shapiro_rate + expon.shapiro_rate) / 2)
    assert res.shapiro_pvalues.shape == (2000,)
    assert res.anderson_pvalues.shape == (2000,)


def test_all_constant_gives_nan_rates_and_json_nulls() -> None:
    res = pretest_normality(np.ones((5, 8)), layer_slices={"w": slice(0, 8)})

    assert res.n_constant == res.n_tests == 8
    summary = res.to_dict()
    assert summary["shapiro_rate"] is None and summary["anderson_rate"] is None
    assert summary["per_layer"]["w"]["shapiro_rate"] is None
    json.dumps(summary, allow_nan=False)


def test_untabulated_alpha_uses_stephens_rule() -> None:
    values = np.random.default_rng(1).normal(size=(12, 50))

    res = pretest_normality(values, alpha=0.2)

    assert res.anderson_rule == "stephens_pvalue"
    np.testing.assert_array_equal(res.anderson_normal, res.tests.anderson_p >= 0.2)


def test_bad_alpha_and_layer_slices_are_errors() -> None:
    values = np.random.default_rng(1).normal(size=(5, 10))
    with pytest.raises(ValueError, match="alpha"):
        pretest_normality(values, alpha=0.0)
    with pytest.raises(ValueError, match="contiguous"):
        pretest_normality(values, layer_slices={"w": slice(0, 10, 2)})


def test_seeded_sampling_is_reproducible_and_layers_follow_the_sample() -> None:
    # arrange
    values = _mixed(np.random.default_rng(2))
    layers = {"normal": slice(0, 1000), "expon": slice(1000, 2000)}

    # act
    a = sample_coordinates(values.shape[1], 300, 42)
    b = sample_coordinates(values.shape[1], 300, np.random.default_rng(42))
    c = sample_coordinates(values.shape[1], 300, 43)
    res = pretest_normality(values, coords=a, layer_slices=layers)

    # assert
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.size == np.unique(a).size == 300 and (np.diff(a) > 0).all()
    assert res.n_tests == 300
    np.testing.assert_array_equal(res.coords, a)
    assert res.per_layer["normal"].n_tests == np.sum(a < 1000)
    assert res.per_layer["expon"].n_tests == np.sum((a >= 1000) & (a < 2000))
    assert res.n_constant == np.sum(a >= 2000)
    full = pretest_normality(values)
    np.testing.assert_array_equal(res.tests.shapiro_p, full.tests.shapiro_p[a])


def test_sampling_everything_and_bad_sizes() -> None:
    np.testing.assert_array_equal(sample_coordinates(5, None, 0), np.arange(5))
    np.testing.assert_array_equal(sample_coordinates(5, 10, 0), np.arange(5))
    with pytest.raises(ValueError, match="max_tests"):
        sample_coordinates(5, 0, 0)


def test_qq_data_and_representative_coords() -> None:
    # arrange
    rng = np.random.default_rng(3)
    values = np.column_stack([rng.normal(2.0, 3.0, size=40), rng.exponential(size=40)])

    # act
    res = pretest_normality(values)
    picks = representative_coords(res, k=2)
    qq = qq_data(values, picks)

    # assert
    assert set(picks.tolist()) == {0, 1}
    assert picks[0] == 1  # the exponential column has the smallest p-value
    for item in qq:
        np.testing.assert_array_equal(item.sample, np.sort(values[:, item.coord]))
        np.testing.assert_allclose(item.theoretical, -item.theoretical[::-1], atol=1e-12)
    normal = next(q for q in qq if q.coord == 0)
    assert normal.slope == pytest.approx(np.std(values[:, 0], ddof=1), rel=0.1)
    assert normal.intercept == pytest.approx(np.mean(values[:, 0]), rel=1e-9)
