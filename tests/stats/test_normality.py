"""Vectorised Shapiro–Wilk / Anderson–Darling against scipy, coordinate by coordinate."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from federated.stats import (
    ANDERSON_SIGNIFICANCE,
    anderson_critical_values,
    anderson_darling,
    anderson_normal,
    anderson_pvalue_interpolated,
    anderson_pvalue_stephens,
    normality_tests,
    shapiro_wilk,
    shapiro_wilk_coefficients,
)

N_CLIENTS = [3, 4, 5, 6, 11, 12, 20, 50, 100]


def _draw(kind: str, n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "normal":
        return rng.normal(0.3, 2.0, size=(n, m))
    if kind == "exponential":
        return rng.exponential(size=(n, m))
    if kind == "lognormal":
        return rng.lognormal(sigma=1.5, size=(n, m))
    if kind == "uniform":
        return rng.uniform(-1, 1, size=(n, m))
    if kind == "ties":  # rounded normal: many tied values
        return np.round(rng.normal(size=(n, m)), 1)
    raise AssertionError(kind)


def _scipy_anderson(col: np.ndarray) -> tuple[float, np.ndarray, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        res = stats.anderson(col, dist="norm")
    p_interp = stats.anderson(col, dist="norm", method="interpolate").pvalue
    return float(res.statistic), np.asarray(res.critical_values), float(p_interp)


@pytest.mark.parametrize("kind", ["normal", "exponential", "lognormal", "uniform", "ties"])
@pytest.mark.parametrize("n", N_CLIENTS)
def test_agrees_with_scipy_on_a_random_sample_of_coordinates(n: int, kind: str) -> None:
    # arrange: 1000 coordinates, chunked unevenly; scipy on a seeded sample of 25 of them
    rng = np.random.default_rng(1000 * n + len(kind))
    values = _draw(kind, n, 1000, rng)
    sample = rng.choice(values.shape[1], size=25, replace=False)

    # act
    res = normality_tests(values, chunk_size=257)

    # assert
    assert not res.constant[sample].any()
    crit = anderson_critical_values(n)
    # n = 3: p = 1 - (6/π) acos(√W) is exact but cancels near W = 3/4 (two tied values),
    # so both sides carry ~1e-16 absolute noise there.
    p_atol = 1e-14 if n == 3 else 0.0
    for j in sample:
        col = values[:, j]
        w, p = stats.shapiro(col)
        a2, sp_crit, p_interp = _scipy_anderson(col)
        np.testing.assert_allclose(res.shapiro_w[j], w, rtol=1e-8, atol=0)
        np.testing.assert_allclose(res.shapiro_p[j], p, rtol=1e-6, atol=p_atol)
        np.testing.assert_allclose(res.anderson_a2[j], a2, rtol=1e-8, atol=0)
        np.testing.assert_array_equal(crit, sp_crit)
        ours = [bool(anderson_normal(res.anderson_a2[j], n, lvl)) for lvl in ANDERSON_SIGNIFICANCE]
        assert ours == [bool(a2 <= c) for c in sp_crit]
        np.testing.assert_allclose(
            anderson_pvalue_interpolated(res.anderson_a2[j], n), p_interp, rtol=1e-12
        )


def test_clearly_non_normal_data_is_rejected_and_normal_data_mostly_kept() -> None:
    rng = np.random.default_rng(7)
    normal = rng.normal(size=(50, 2000))
    expo = rng.exponential(size=(50, 2000))

    res_n, res_e = normality_tests(normal), normality_tests(expo)

    assert 0.93 < np.mean(res_n.shapiro_p >= 0.05) < 0.97
    assert 0.93 < np.mean(anderson_normal(res_n.anderson_a2, 50, 0.05)) < 0.97
    assert np.mean(res_e.shapiro_p >= 0.05) < 0.01
    assert np.mean(anderson_normal(res_e.anderson_a2, 50, 0.05)) < 0.01


def test_large_n_and_tiny_pvalues_match_scipy() -> None:
    rng = np.random.default_rng(3)
    values = rng.standard_cauchy(size=(1000, 5))

    w, p = shapiro_wilk(values)
    a2 = anderson_darling(values)

    for j in range(values.shape[1]):
        sw = stats.shapiro(values[:, j])
        np.testing.assert_allclose([w[j], p[j]], [sw.statistic, sw.pvalue], rtol=1e-6)
        np.testing.assert_allclose(a2[j], _scipy_anderson(values[:, j])[0], rtol=1e-8)


def test_torch_input_and_coordinate_subset_match_numpy() -> None:
    rng = np.random.default_rng(11)
    values = rng.normal(size=(20, 300)).astype(np.float32)
    coords = np.array([5, 0, 299, 17])

    full = normality_tests(values)
    sub = normality_tests(torch.from_numpy(values), coords=coords, chunk_size=3)

    np.testing.assert_array_equal(sub.coords, coords)
    np.testing.assert_allclose(sub.shapiro_w, full.shapiro_w[coords], rtol=1e-14)
    np.testing.assert_allclose(sub.shapiro_p, full.shapiro_p[coords], rtol=1e-12)
    np.testing.assert_allclose(sub.anderson_a2, full.anderson_a2[coords], rtol=1e-12)


def test_constant_coordinates_are_flagged_with_nan_statistics() -> None:
    rng = np.random.default_rng(5)
    values = rng.normal(size=(10, 6))
    values[:, 1] = 0.0  # frozen at zero
    values[:, 3] = 3.7  # frozen elsewhere
    values[:, 4] = 1.0 + 1e-15 * rng.normal(size=10)  # float64 rounding noise only

    res = normality_tests(values)

    np.testing.assert_array_equal(res.constant, [False, True, False, True, True, False])
    for arr in (res.shapiro_w, res.shapiro_p, res.anderson_a2, res.anderson_p):
        assert np.isnan(arr[res.constant]).all()
        assert np.isfinite(arr[~res.constant]).all()


def test_float32_distinct_values_are_not_constant() -> None:
    base = np.float32(0.1)
    col = base + np.arange(5, dtype=np.float32) * np.spacing(base)

    res = normality_tests(col[:, None])

    assert not res.constant[0]


@pytest.mark.parametrize("n", [0, 1, 2])
def test_fewer_than_three_clients_is_a_clear_error(n: int) -> None:
    with pytest.raises(ValueError, match=r"at least 3 values per coordinate.*n_clients=" + str(n)):
        normality_tests(np.ones((n, 4)))


def test_bad_shapes_and_non_finite_values_are_errors() -> None:
    with pytest.raises(ValueError, match="matrix"):
        normality_tests(np.arange(10.0))
    values = np.random.default_rng(0).normal(size=(5, 4))
    values[2, 1] = np.nan
    with pytest.raises(ValueError, match="non-finite entries in 1 coordinate"):
        normality_tests(values)
    with pytest.raises(ValueError, match="coords"):
        normality_tests(values[:, :1], coords=[3])


def test_more_than_5000_clients_warns() -> None:
    values = np.random.default_rng(0).normal(size=(5001, 1))
    with pytest.warns(UserWarning, match="5000"):
        normality_tests(values)


def test_shapiro_wilk_coefficients_are_antisymmetric_unit_weights() -> None:
    for n in (3, 4, 7, 50):
        a = shapiro_wilk_coefficients(n)
        np.testing.assert_allclose(a, -a[::-1], atol=1e-15)
        assert math.isclose(float(a @ a), 1.0, rel_tol=1e-14)
    np.testing.assert_allclose(shapiro_wilk_coefficients(3), [-(0.5**0.5), 0.0, 0.5**0.5])


def test_anderson_critical_values_for_n_10_by_hand() -> None:
    # scipy's rule: asymptotic points / (1 + 0.75/10 + 2.25/100) = / 1.0975, 3 decimals
    np.testing.assert_array_equal(anderson_critical_values(10), [0.511, 0.575, 0.685, 0.795, 0.943])


def test_stephens_pvalue_by_hand_and_monotone() -> None:
    n = 20
    adj = 1 + 0.75 / n + 2.25 / n**2
    # A*² = 1.0 -> exp(1.2937 - 5.709 + 0.0186); A*² = 0.5 -> exp(0.9177 - 2.1395 - 0.345)
    p = anderson_pvalue_stephens(np.array([1.0, 0.5, 0.3, 0.1, 50.0]) / adj, n)
    np.testing.assert_allclose(
        p,
        [
            math.exp(1.2937 - 5.709 + 0.0186),
            math.exp(0.9177 - 4.279 * 0.5 - 1.38 * 0.25),
            1 - math.exp(-8.318 + 42.796 * 0.3 - 59.938 * 0.09),
            1 - math.exp(-13.436 + 101.14 * 0.1 - 223.73 * 0.01),
            3.7e-24,
        ],
        rtol=1e-12,
    )
    grid = np.linspace(0.01, 12, 2000)
    assert (np.diff(anderson_pvalue_stephens(grid, n)) <= 0).all()


def test_untabulated_alpha_decides_with_the_stephens_pvalue() -> None:
    a2 = np.array([0.3, 0.6, 0.9, np.nan])

    decided = anderson_normal(a2, 30, alpha=0.07)

    np.testing.assert_array_equal(decided, anderson_pvalue_stephens(a2, 30) >= 0.07)
    assert not decided[-1]
    with pytest.raises(ValueError, match="alpha"):
        anderson_normal(a2, 30, alpha=1.5)
