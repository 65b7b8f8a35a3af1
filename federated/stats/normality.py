"""Vectorised Shapiro–Wilk and Anderson–Darling normality tests over many coordinates.

EMA (Wu et al., "Enabling quartile-based estimated-mean gradient aggregation as baseline
for federated image classifications", Section 2.2) justifies its estimated mean by the
clients' gradients being normal across clients, checked coordinate by coordinate with
Shapiro–Wilk and Anderson–Darling (the paper ran 1,075,621 tests over 50 clients). The
"Pre-Testing rate" is the share of coordinates judged normal.

Input is a matrix ``values`` of shape ``(n_clients, n_coords)``: column ``j`` holds the n
clients' values of coordinate ``j``. Every column is tested independently; columns are
processed in chunks (bounded memory), sorted once, and both tests share the sort.

Shapiro–Wilk
    Royston's approximation, Algorithm AS R94 (Royston 1995, Appl. Statist. 44, 547–551;
    Royston 1992, Stat. Comput. 2, 117–119) as ported in ``scipy.stats.shapiro``: the
    coefficients ``a`` depend on n only (computed once, cached), W is the squared
    correlation between ``a`` and the sorted column (one matrix-vector product per chunk),
    and the p-value is the same normalising transform of ``log(1 - W)`` (exact for n = 3).
    Valid for 3 <= n <= 5000 (a warning above 5000, as scipy).

Anderson–Darling (normal, mean and variance estimated)
    ``A² = -n - Σ_i (2i - 1)/n [log Φ(w_(i)) + log(1 - Φ(w_(n+1-i)))]`` with
    ``w = (x - x̄)/s`` (s with ddof = 1), as ``scipy.stats.anderson(x, 'norm')``. Critical
    values are scipy's: Stephens' (1974) asymptotic points at 15, 10, 5, 2.5, 1 % divided by
    ``1 + 0.75/n + 2.25/n²`` and rounded to 3 decimals. A p-value comes from the
    D'Agostino & Stephens (1986, Table 4.9) approximation on ``A*² = A²(1 + 0.75/n +
    2.25/n²)``; for A*² >= 10 it is 3.7e-24, as R's ``nortest::ad.test``.

Decisions at a significance level ``alpha`` ("judged normal" = not rejected):
    * Shapiro–Wilk: ``p >= alpha``.
    * Anderson–Darling: when ``alpha`` is one of scipy's tabulated levels
      (0.15, 0.10, 0.05, 0.025, 0.01) the critical-value decision ``A² <= critical``,
      exactly scipy's; for any other ``alpha`` the D'Agostino–Stephens p-value
      ``p >= alpha`` (scipy's ``method='interpolate'`` p-value is clamped to
      [0.01, 0.15], so it cannot decide outside that range; it is available as
      :func:`anderson_pvalue_interpolated`).

Constant coordinates (all clients equal within ``const_atol + const_rtol * max|x|``, e.g. a
frozen layer) have no defined statistic: they are flagged in a mask, their statistics are
NaN, and they count neither as passes nor as failures.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from scipy.special import log_ndtr, ndtri

__all__ = [
    "ANDERSON_SIGNIFICANCE",
    "LayerPretest",
    "NormalityTests",
    "PretestResult",
    "QQData",
    "anderson_critical_values",
    "anderson_darling",
    "anderson_normal",
    "anderson_pvalue_interpolated",
    "anderson_pvalue_stephens",
    "constant_mask",
    "normality_tests",
    "pretest_normality",
    "qq_data",
    "representative_coords",
    "sample_coordinates",
    "shapiro_wilk",
    "shapiro_wilk_coefficients",
]

ArrayLike = np.ndarray | torch.Tensor

#: Significance levels of scipy's normal-case critical values, as fractions.
ANDERSON_SIGNIFICANCE: tuple[float, ...] = (0.15, 0.10, 0.05, 0.025, 0.01)
_ANDERSON_ASYMPTOTIC = np.array([0.561, 0.631, 0.752, 0.873, 1.035])

DEFAULT_CHUNK = 1 << 12  # (4096, n) float64 blocks stay in cache: ~2x faster than 1 << 15
_SW_MAX_N = 5000
_SMALL = 1e-19  # AS R94's floor for p-values and ranges


# ----------------------------------------------------------------------------------------
# Shapiro–Wilk (AS R94)
# ----------------------------------------------------------------------------------------


def _poly(c: Sequence[float], x: float) -> float:
    """AS 181 polynomial ``c[0] + c[1] x + ...``, evaluated in R94's order."""
    nord = len(c)
    res = c[0]
    if nord == 1:
        return res
    p = x * c[nord - 1]
    if nord == 2:
        return res + p
    for ind in range(nord - 2, 0, -1):
        p = (p + c[ind]) * x
    return res + p


def _ppnd(p: float) -> float:
    """Normal quantile by AS 111 (the one R94 uses; kept for bit-level parity with scipy)."""
    q = p - 0.5
    if abs(q) <= 0.42:
        r = q * q
        num = q * (
            ((-25.44106049637 * r + 41.39119773534) * r - 18.61500062529) * r + 2.50662823884
        )
        den = (((3.13082909833 * r - 21.06224101826) * r + 23.08336743743) * r - 8.47351093090) * r
        return num / (den + 1.0)
    r = 1 - p if q > 0 else p
    if r <= 0:
        return 0.0
    r = math.sqrt(-math.log(r))
    num = ((2.32121276858 * r + 4.85014127135) * r - 2.29796479134) * r - 2.78718931138
    num /= (1.63706781897 * r + 3.54388924762) * r + 1.0
    return -num if q < 0 else num


_C1 = (0.0, 0.221157, -0.147981, -2.07119, 4.434685, -2.706056)
_C2 = (0.0, 0.042981, -0.293762, -1.752461, 5.682633, -3.582633)
_C3 = (0.5440, -0.39978, 0.025054, -0.0006714)
_C4 = (1.3822, -0.77857, 0.062767, -0.0020322)
_C5 = (-1.5861, -0.31082, -0.083751, 0.0038915)
_C6 = (-0.4803, -0.082676, 0.0030302)
_G = (-2.273, 0.459)


@lru_cache(maxsize=64)
def _sw_half(n: int) -> tuple[float, ...]:
    """R94's ``a[0 : n//2]`` (positive, largest first), exactly as scipy's ``swilk``."""
    nn2 = n // 2
    if n == 3:
        return (math.sqrt(2) / 2,)
    an25 = n + 0.25
    m = [_ppnd((i + 1 - 0.375) / an25) for i in range(nn2)]
    summ2 = 0.0
    for v in m:
        summ2 += v**2
    summ2 *= 2.0
    ssumm2 = math.sqrt(summ2)
    rsn = 1 / math.sqrt(n)
    a = list(m)
    a1 = _poly(_C1, rsn) - m[0] / ssumm2
    if n > 5:
        i1 = 2
        a2 = -m[1] / ssumm2 + _poly(_C2, rsn)
        fac = math.sqrt((summ2 - 2 * m[0] ** 2 - 2 * m[1] ** 2) / (1 - 2 * a1**2 - 2 * a2**2))
        a[1] = a2
    else:
        i1 = 1
        fac = math.sqrt((summ2 - 2 * m[0] ** 2) / (1 - 2 * a1**2))
    a[0] = a1
    for i in range(i1, nn2):
        a[i] = m[i] * (-1.0 / fac)
    return tuple(a)


def shapiro_wilk_coefficients(n: int) -> np.ndarray:
    """Shapiro–Wilk weights for the n sorted values: antisymmetric, centred, unit norm.

    ``W = (Σ a_i x_(i))² / Σ (x_i - x̄)²``; the weights depend on n only, which is what lets
    one matrix-vector product test a whole chunk of coordinates.
    """
    _check_n(n)
    half = np.asarray(_sw_half(n))
    coef = np.zeros(n)
    k = np.arange(n)
    mirror = n - 1 - k
    lower, upper = k < mirror, k > mirror
    coef[lower] = -half[k[lower]]
    coef[upper] = half[mirror[upper]]
    coef -= coef.mean()
    return coef / math.sqrt(float(coef @ coef))


def _alnorm_upper(x: np.ndarray) -> np.ndarray:
    """Upper normal tail ``1 - Φ(x)`` by AS 66 (R94's ``alnorm``), vectorised."""
    upper = x > 0
    z = np.where(upper, x, -x)
    y = 0.5 * z * z
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        # Both continued fractions evaluated from the innermost term out (AS 66's order).
        d = y + 5.92885724438
        d = y + 2.62433121679 + 48.6959930692 / d
        d = y + 5.75885480458 - 29.8213557808 / d
        small = 0.5 - z * (0.398942280444 - 0.399903438504 * y / d)
        cf = z + 3.99019417011
        cf = z + 0.742380924027 + 30.789933034 / cf
        cf = z + 4.8385912808 - 15.1508972451 / cf
        cf = z - 0.151679116635 + 5.29330324926 / cf
        cf = z + 3.98064794e-4 + 1.98615381364 / cf
        cf = z - 3.8052e-8 + 1.00000615302 / cf
        large = 0.398942280385 * np.exp(-y) / cf
    temp = np.where(z <= 1.28, small, large)
    out = np.where(upper, temp, 1.0 - temp)
    # Beyond the tail limits (7 below, 38 above; NaN included) AS 66 returns 0 or 1.
    outside = ~((z <= 7.0) | (upper & (z <= 38.0)))
    return np.where(outside, np.where(upper, 0.0, 1.0), out)


def _sw_pvalue(w: np.ndarray, w1: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """R94's p-value for W (``w1 = 1 - W`` computed without cancellation)."""
    if n == 3:
        low = w < 0.75
        with np.errstate(invalid="ignore"):
            p = 1.0 - (6 / np.pi) * np.arccos(np.sqrt(np.clip(w, 0.75, 1.0)))
        return np.where(low, 0.75, w), np.where(low, 0.0, p)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.log(w1)
        if n <= 11:
            gamma = _poly(_G, float(n))
            beyond = y >= gamma
            y = -np.log(gamma - y)
            m, s = _poly(_C3, float(n)), math.exp(_poly(_C4, float(n)))
        else:
            beyond = np.zeros(w.shape, dtype=bool)
            m, s = _poly(_C5, math.log(n)), math.exp(_poly(_C6, math.log(n)))
        p = _alnorm_upper((y - m) / s)
    return w, np.where(beyond, _SMALL, p)


# ----------------------------------------------------------------------------------------
# Anderson–Darling (normal)
# ----------------------------------------------------------------------------------------


def anderson_critical_values(n: int) -> np.ndarray:
    """scipy's normal-case critical values for n observations, at ``ANDERSON_SIGNIFICANCE``."""
    _check_n(n)
    return np.around(_ANDERSON_ASYMPTOTIC / (1.0 + 0.75 / n + 2.25 / n / n), 3)


def anderson_pvalue_stephens(a2: ArrayLike, n: int) -> np.ndarray:
    """D'Agostino & Stephens (1986) p-value approximation for the normal A² with n values.

    Continuous in A² (unlike the five tabulated levels), so it suits a p-value histogram
    and decisions at untabulated ``alpha``. Within about 5e-4 of the table at its levels.
    """
    a2 = np.asarray(a2, dtype=np.float64)
    aa = a2 * (1.0 + 0.75 / n + 2.25 / n**2)
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.select(
            [aa < 0.2, aa < 0.34, aa < 0.6, aa < 10.0],
            [
                1.0 - np.exp(-13.436 + 101.14 * aa - 223.73 * aa**2),
                1.0 - np.exp(-8.318 + 42.796 * aa - 59.938 * aa**2),
                np.exp(0.9177 - 4.279 * aa - 1.38 * aa**2),
                np.exp(1.2937 - 5.709 * aa + 0.0186 * aa**2),
            ],
            default=3.7e-24,
        )
    return np.where(np.isnan(aa), np.nan, np.clip(p, 0.0, 1.0))


def anderson_pvalue_interpolated(a2: ArrayLike, n: int) -> np.ndarray:
    """scipy's ``anderson(x, method='interpolate')`` p-value: linear in the table, clamped
    to [0.01, 0.15]."""
    crit = anderson_critical_values(n)
    return np.interp(np.asarray(a2, dtype=np.float64), crit, np.asarray(ANDERSON_SIGNIFICANCE))


def _tabulated_level(alpha: float) -> int | None:
    for i, level in enumerate(ANDERSON_SIGNIFICANCE):
        if math.isclose(alpha, level, rel_tol=1e-9):
            return i
    return None


def anderson_normal(a2: ArrayLike, n: int, alpha: float) -> np.ndarray:
    """Not rejected at ``alpha``: ``A² <= critical`` at scipy's tabulated levels, otherwise
    the D'Agostino–Stephens p-value ``>= alpha``. NaN (constant) gives False."""
    _check_alpha(alpha)
    a2 = np.asarray(a2, dtype=np.float64)
    level = _tabulated_level(alpha)
    if level is not None:
        return a2 <= anderson_critical_values(n)[level]
    return anderson_pvalue_stephens(a2, n) >= alpha


def _anderson_rule(alpha: float) -> str:
    return "critical_value" if _tabulated_level(alpha) is not None else "stephens_pvalue"


# ----------------------------------------------------------------------------------------
# Chunked driver
# ----------------------------------------------------------------------------------------


def _check_n(n: int) -> None:
    if n < 3:
        raise ValueError(
            "Shapiro–Wilk and Anderson–Darling need at least 3 values per coordinate "
            f"(3 <= n_clients <= {_SW_MAX_N}); got n_clients={n}"
        )


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1); got {alpha}")


def _as_array(values: ArrayLike) -> ArrayLike:
    return values if isinstance(values, torch.Tensor) else np.asarray(values)


def _shape(values: ArrayLike) -> tuple[int, int]:
    if values.ndim != 2:
        raise ValueError(
            f"values must be a matrix (n_clients, n_coords); got shape {tuple(values.shape)}"
        )
    n, m = (int(s) for s in values.shape)
    _check_n(n)
    if n > _SW_MAX_N:
        warnings.warn(
            f"Shapiro–Wilk p-values may be inaccurate for n_clients > {_SW_MAX_N} (n={n})",
            stacklevel=3,
        )
    return n, m


def _sorted_chunk(values: ArrayLike, cols: np.ndarray | slice) -> np.ndarray:
    """Columns ``cols`` as a C-contiguous float64 ``(k, n)`` block, each row sorted."""
    if isinstance(values, torch.Tensor):
        idx = cols if isinstance(cols, slice) else torch.from_numpy(cols).to(values.device)
        block = values[:, idx].detach().to(device="cpu", dtype=torch.float64).numpy()
    else:
        block = values[:, cols]
    ys = np.array(block.T, dtype=np.float64, order="C")  # (k, n)
    ys.sort(axis=1)
    return ys


def _indices(m: int, coords: ArrayLike | Sequence[int]) -> np.ndarray:
    idx = np.asarray(coords, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= m):
        raise ValueError(
            f"coords must index columns 0..{m - 1}; got range [{idx.min()}, {idx.max()}]"
        )
    return idx


def _check_chunk(chunk_size: int) -> None:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")


@dataclass(frozen=True)
class NormalityTests:
    """Per-coordinate results of both tests (arrays aligned with ``coords``).

    Statistics and p-values of constant coordinates are NaN.
    """

    n_clients: int
    coords: np.ndarray  # (k,) int64, column indices into the input
    constant: np.ndarray  # (k,) bool
    shapiro_w: np.ndarray  # (k,)
    shapiro_p: np.ndarray  # (k,)
    anderson_a2: np.ndarray  # (k,)
    anderson_p: np.ndarray  # (k,) D'Agostino–Stephens approximation


def constant_mask(ys_sorted: np.ndarray, *, rtol: float = 1e-9, atol: float = 0.0) -> np.ndarray:
    """Rows of a row-sorted ``(k, n)`` block whose range is within ``atol + rtol * max|x|``.

    The relative default (1e-9) is far below float32 spacing (~6e-8), so genuinely distinct
    float32 client values never count as equal, while float64 rounding noise does.
    """
    lo, hi = ys_sorted[:, 0], ys_sorted[:, -1]
    return (hi - lo) <= atol + rtol * np.maximum(np.abs(lo), np.abs(hi))


def _test_block(
    ys: np.ndarray, coef: np.ndarray, ad_w: tuple[np.ndarray, np.ndarray], rtol: float, atol: float
) -> tuple[np.ndarray, ...]:
    """Both tests on a row-sorted ``(k, n)`` block."""
    if not np.isfinite(ys).all():
        bad = int((~np.isfinite(ys)).any(axis=1).sum())
        raise ValueError(
            f"values contain non-finite entries in {bad} coordinate(s); "
            "normality tests need finite client updates"
        )
    n = ys.shape[1]
    const = constant_mask(ys, rtol=rtol, atol=atol)
    with np.errstate(divide="ignore", invalid="ignore"):
        xc = ys - ys.mean(axis=1, keepdims=True)
        xc /= (ys[:, -1] - ys[:, 0])[:, None]  # scale to unit range, as R94 does
        ssx = np.einsum("ij,ij->i", xc, xc)
        sax = xc @ coef
        root = np.sqrt(ssx)
        w1 = np.maximum((root - sax) * (root + sax) / ssx, 0.0)
        w, p_sw = _sw_pvalue(1.0 - w1, w1, n)

        z = xc * (np.sqrt((n - 1) / ssx))[:, None]  # (x - x̄)/s, s with ddof=1
        fwd, rev = ad_w
        a2 = -n - (log_ndtr(z) @ fwd + log_ndtr(-z) @ rev)
    nan = np.float64(np.nan)
    return (
        const,
        np.where(const, nan, w),
        np.where(const, nan, p_sw),
        np.where(const, nan, a2),
    )


def normality_tests(
    values: ArrayLike,
    *,
    coords: ArrayLike | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    const_rtol: float = 1e-9,
    const_atol: float = 0.0,
) -> NormalityTests:
    """Shapiro–Wilk and Anderson–Darling on every column of ``values`` (or ``coords``).

    ``values``: ``(n_clients, n_coords)`` numpy array or torch tensor (any device; chunks are
    copied to CPU float64 one at a time). Memory is ``O(chunk_size * n_clients)``.
    """
    values = _as_array(values)
    n, m = _shape(values)
    _check_chunk(chunk_size)
    idx = None if coords is None else _indices(m, coords)
    total = m if idx is None else idx.size
    coef = shapiro_wilk_coefficients(n)
    fwd = (2.0 * np.arange(1, n + 1) - 1.0) / n
    ad_w = (fwd, fwd[::-1].copy())

    const = np.empty(total, dtype=bool)
    w, p_sw, a2 = (np.empty(total) for _ in range(3))
    for start in range(0, total, chunk_size):
        stop = min(start + chunk_size, total)
        cols = slice(start, stop) if idx is None else idx[start:stop]
        ys = _sorted_chunk(values, cols)
        const[start:stop], w[start:stop], p_sw[start:stop], a2[start:stop] = _test_block(
            ys, coef, ad_w, const_rtol, const_atol
        )
    return NormalityTests(
        n_clients=n,
        coords=np.arange(m, dtype=np.int64) if idx is None else idx,
        constant=const,
        shapiro_w=w,
        shapiro_p=p_sw,
        anderson_a2=a2,
        anderson_p=anderson_pvalue_stephens(a2, n),
    )


def shapiro_wilk(
    values: ArrayLike, *, chunk_size: int = DEFAULT_CHUNK
) -> tuple[np.ndarray, np.ndarray]:
    """``(W, p)`` per column, as ``scipy.stats.shapiro`` on each column (NaN if constant)."""
    res = normality_tests(values, chunk_size=chunk_size)
    return res.shapiro_w, res.shapiro_p


def anderson_darling(values: ArrayLike, *, chunk_size: int = DEFAULT_CHUNK) -> np.ndarray:
    """``A²`` per column, as ``scipy.stats.anderson(column, 'norm').statistic``."""
    return normality_tests(values, chunk_size=chunk_size).anderson_a2


# ----------------------------------------------------------------------------------------
# Pre-Testing (EMA Section 2.2)
# ----------------------------------------------------------------------------------------


def sample_coordinates(
    n_coords: int, max_tests: int | None, rng: np.random.Generator | int
) -> np.ndarray:
    """Sorted indices of at most ``max_tests`` distinct coordinates, drawn with ``rng``.

    ``max_tests=None`` (or >= n_coords) returns every coordinate. ``rng`` is a
    ``numpy.random.Generator`` or a seed; same seed, same sample.
    """
    if n_coords < 0:
        raise ValueError(f"n_coords must be >= 0; got {n_coords}")
    if max_tests is None or max_tests >= n_coords:
        return np.arange(n_coords, dtype=np.int64)
    if max_tests < 1:
        raise ValueError(f"max_tests must be >= 1 or None; got {max_tests}")
    gen = np.random.default_rng(rng)
    return np.sort(gen.choice(n_coords, size=max_tests, replace=False)).astype(np.int64)


def _rate(normal: np.ndarray, constant: np.ndarray) -> float:
    k = int((~constant).sum())
    return float(normal[~constant].sum() / k) if k else math.nan


@dataclass(frozen=True)
class LayerPretest:
    """Pre-Testing counts and rates over one layer's tested coordinates."""

    n_tests: int
    n_constant: int
    shapiro_rate: float
    anderson_rate: float


@dataclass(frozen=True)
class PretestResult:
    """EMA's Pre-Testing rates and the per-coordinate evidence behind them.

    ``n_tests`` counts the coordinates examined, constant ones included; the rates are the
    share judged normal among the ``n_tests - n_constant`` non-constant ones (NaN when there
    are none). Arrays are aligned with ``coords``.
    """

    alpha: float
    n_clients: int
    n_tests: int
    n_constant: int
    shapiro_rate: float
    anderson_rate: float
    anderson_rule: str  # "critical_value" (scipy's table) or "stephens_pvalue"
    per_layer: dict[str, LayerPretest]
    tests: NormalityTests = field(repr=False)
    shapiro_normal: np.ndarray = field(repr=False)  # (k,) bool, False where constant
    anderson_normal: np.ndarray = field(repr=False)  # (k,) bool, False where constant

    @property
    def coords(self) -> np.ndarray:
        return self.tests.coords

    @property
    def constant(self) -> np.ndarray:
        return self.tests.constant

    @property
    def shapiro_pvalues(self) -> np.ndarray:
        """Non-constant coordinates' Shapiro–Wilk p-values (for a histogram)."""
        return self.tests.shapiro_p[~self.tests.constant]

    @property
    def anderson_pvalues(self) -> np.ndarray:
        """Non-constant coordinates' D'Agostino–Stephens p-values (for a histogram)."""
        return self.tests.anderson_p[~self.tests.constant]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (no per-coordinate arrays; NaN becomes None)."""

        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "alpha": self.alpha,
            "n_clients": self.n_clients,
            "n_tests": self.n_tests,
            "n_constant": self.n_constant,
            "shapiro_rate": num(self.shapiro_rate),
            "anderson_rate": num(self.anderson_rate),
            "anderson_rule": self.anderson_rule,
            "per_layer": {
                name: {
                    "n_tests": lay.n_tests,
                    "n_constant": lay.n_constant,
                    "shapiro_rate": num(lay.shapiro_rate),
                    "anderson_rate": num(lay.anderson_rate),
                }
                for name, lay in self.per_layer.items()
            },
        }


def _layer_masks(
    coords: np.ndarray, m: int, layer_slices: Mapping[str, slice]
) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, sl in layer_slices.items():
        start, stop, step = sl.indices(m)
        if step != 1:
            raise ValueError(f"layer_slices[{name!r}] must be a contiguous slice; got {sl}")
        out[name] = (coords >= start) & (coords < stop)
    return out


def pretest_normality(
    values: ArrayLike,
    *,
    alpha: float = 0.05,
    layer_slices: Mapping[str, slice] | None = None,
    coords: ArrayLike | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    const_rtol: float = 1e-9,
    const_atol: float = 0.0,
) -> PretestResult:
    """EMA's Pre-Testing: share of coordinates judged normal across clients, per test.

    ``values``: ``(n_clients, n_coords)`` client updates (one row per client, e.g. stacked
    flat gradients). ``coords``: optional column indices to test (see
    :func:`sample_coordinates`); ``layer_slices``: ``name -> slice`` into the columns of
    ``values`` (e.g. ``StateLayout.slices()``), giving per-layer rates over the tested
    coordinates that fall in each layer.
    """
    _check_alpha(alpha)
    values = _as_array(values)
    m = int(values.shape[1]) if values.ndim == 2 else 0
    tests = normality_tests(
        values, coords=coords, chunk_size=chunk_size, const_rtol=const_rtol, const_atol=const_atol
    )
    n = tests.n_clients
    const = tests.constant
    sw_normal = (tests.shapiro_p >= alpha) & ~const
    ad_normal = anderson_normal(tests.anderson_a2, n, alpha) & ~const

    per_layer: dict[str, LayerPretest] = {}
    for name, mask in _layer_masks(tests.coords, m, layer_slices or {}).items():
        per_layer[name] = LayerPretest(
            n_tests=int(mask.sum()),
            n_constant=int(const[mask].sum()),
            shapiro_rate=_rate(sw_normal[mask], const[mask]),
            anderson_rate=_rate(ad_normal[mask], const[mask]),
        )
    return PretestResult(
        alpha=alpha,
        n_clients=n,
        n_tests=int(const.size),
        n_constant=int(const.sum()),
        shapiro_rate=_rate(sw_normal, const),
        anderson_rate=_rate(ad_normal, const),
        anderson_rule=_anderson_rule(alpha),
        per_layer=per_layer,
        tests=tests,
        shapiro_normal=sw_normal,
        anderson_normal=ad_normal,
    )


# ----------------------------------------------------------------------------------------
# QQ-plot data
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QQData:
    """Normal QQ data of one coordinate: sorted client values vs normal quantiles.

    Theoretical quantiles use Blom's positions ``(i - 3/8)/(n + 1/4)`` (the ones behind the
    Shapiro–Wilk weights); ``slope``/``intercept`` are the least-squares reference line.
    """

    coord: int
    theoretical: np.ndarray  # (n,)
    sample: np.ndarray  # (n,) sorted
    slope: float
    intercept: float


def qq_data(values: ArrayLike, coords: Sequence[int] | np.ndarray) -> list[QQData]:
    """QQ data for a few coordinates (columns of ``values``); plotting is the caller's."""
    values = _as_array(values)
    n, m = _shape(values)
    idx = _indices(m, coords)
    theo = ndtri((np.arange(1, n + 1) - 0.375) / (n + 0.25))
    ys = _sorted_chunk(values, idx)
    out = []
    for c, row in zip(idx, ys, strict=True):
        slope, intercept = np.polyfit(theo, row, 1)
        out.append(QQData(int(c), theo.copy(), row, float(slope), float(intercept)))
    return out


def representative_coords(result: PretestResult, k: int = 4) -> np.ndarray:
    """``k`` non-constant coordinates spanning the Shapiro–Wilk p-value range (min to max),
    e.g. for QQ plots. Deterministic; fewer if fewer exist."""
    live = ~result.tests.constant
    coords, p = result.tests.coords[live], result.tests.shapiro_p[live]
    if coords.size == 0 or k < 1:
        return np.empty(0, dtype=np.int64)
    order = np.argsort(p, kind="stable")
    picks = np.unique(np.round(np.linspace(0, coords.size - 1, min(k, coords.size))).astype(int))
    return coords[order[picks]]
