"""One contract suite run over every registered aggregation rule.

Each rule is built with the parameters in ``PARAMS`` (for n = 11 clients, f = 2) and
called the way the server calls it (Zeno gets a synthetic quadratic-loss oracle, FLTrust
and MoNNA a reference update, FoolsGold the rows' client ids).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch import Tensor

from aggregation import (
    build_aggregator,
    build_preaggregator,
    drop_non_finite,
    list_aggregators,
)
from registry import RegistryError

N, D, F = 11, 16, 2
PARAMS: dict[str, dict[str, Any]] = {
    "fedavg": {},
    "median": {},
    "trimmed_mean": {"f": F},
    "krum": {"f": F},
    "multi_krum": {"f": F},
    "bulyan": {"f": F},
    "geometric_median": {"tol": 1e-12, "max_iter": 500},
    "centered_clipping": {"tau": 10.0},
    "ema": {},
    "fedlag": {},
    "zeno": {"b": F},
    "mda": {"f": F},
    "monna": {"f": F},
    "meamed": {"f": F},
    "dnc": {"f": F},
    "fltrust": {},
    "foolsgold": {},
    "weighted_median": {},
    "weighted_trimmed_mean": {"beta": 0.2},  # above the share of the weight rows 0-1 hold
    "norm_bounded_mean": {},
    "fednova": {},
    "afl": {},
}
RULES = list_aggregators()
# FedAvg follows any update; FoolsGold down-weights look-alike (sybil) histories, not
# large updates: two unlike huge updates keep their full weight.
NOT_ROBUST = {"fedavg", "foolsgold", "fednova", "afl"}
# FoolsGold gives identical clients no weight (they are sybils): identical rows -> zero.
NOT_IDENTITY = {"foolsgold"}
# Rules with rule(X + c) = rule(X) + c (centered clipping starts from a zero center, Zeno's
# oracle and FLTrust's reference are not translated, norms and cosines are not invariant).
TRANSLATION_EQUIVARIANT = {
    "fedavg",
    "fednova",
    "afl",
    "median",
    "trimmed_mean",
    "krum",
    "multi_krum",
    "bulyan",
    "geometric_median",
    "ema",
    "fedlag",
    "mda",
    "monna",
    "meamed",
    "dnc",
    "weighted_median",
    "weighted_trimmed_mean",
}
# Rules whose output is a per-coordinate convex combination of the clients' values (the
# others shrink updates towards a center or zero, or rescale them; FoolsGold returns zero
# when every client has a copy).
INSIDE_HULL = set(RULES) - {"centered_clipping", "fltrust", "norm_bounded_mean", "foolsgold"}
# Coordinate-wise rules: each output coordinate is a combination of that coordinate's
# values, and their effective weights average those per-coordinate coefficients.
COORDINATEWISE = {
    "median",
    "trimmed_mean",
    "ema",
    "meamed",
    "weighted_median",
    "weighted_trimmed_mean",
}
# Rules whose effective weights do not sum to 1: the clipped share goes to the previous
# center or to zero, FLTrust rescales every update to the reference's norm.
PARTIAL_WEIGHT = {"centered_clipping", "fltrust", "norm_bounded_mean"}
# Rules whose output is effective_weight @ updates (centered clipping from a zero center);
# the coordinate-wise rules' effective weights are per-coordinate averages (attributions).
WEIGHTED_MEAN = {
    "fedavg",
    "fednova",
    "afl",
    "krum",
    "multi_krum",
    "geometric_median",
    "zeno",
    "centered_clipping",
    "mda",
    "monna",
    "dnc",
    "fltrust",
    "foolsgold",
    "norm_bounded_mean",
}
Aggregate = Callable[..., Tensor]


def build(name: str) -> Any:
    return build_aggregator(name, **PARAMS.get(name, {}))


def sample(dtype: torch.dtype = torch.float64, seed: int = 0) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    updates = torch.randn(N, D, generator=gen, dtype=torch.float64).to(dtype)
    weights = torch.randint(1, 50, (N,), generator=gen).to(dtype)
    return updates, weights


def test_every_registered_rule_is_covered() -> None:
    assert set(RULES) <= set(PARAMS), f"add contract parameters for {set(RULES) - set(PARAMS)}"


@pytest.mark.parametrize("name", RULES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_shape_dtype_and_device_are_kept(
    name: str, dtype: torch.dtype, aggregate: Aggregate
) -> None:
    updates, weights = sample(dtype)

    out = aggregate(build(name), updates, weights)

    assert out.shape == (D,)
    assert out.dtype == dtype
    assert out.device == updates.device
    assert bool(torch.isfinite(out).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", RULES)
def test_cuda_matches_cpu(name: str, aggregate: Aggregate) -> None:
    updates, weights = sample(torch.float32)

    on_gpu = aggregate(build(name), updates.cuda(), weights.cuda())

    assert on_gpu.device.type == "cuda"
    torch.testing.assert_close(
        on_gpu.cpu(), aggregate(build(name), updates, weights), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("name", RULES)
def test_client_order_does_not_matter(name: str, aggregate: Aggregate) -> None:
    updates, weights = sample()
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(1))

    out = aggregate(build(name), updates, weights)
    permuted = aggregate(build(name), updates[perm], weights[perm])

    torch.testing.assert_close(permuted, out, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", sorted(set(RULES) - NOT_IDENTITY))
def test_identical_rows_return_that_row(name: str, aggregate: Aggregate) -> None:
    row = torch.randn(D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    updates = row.repeat(N, 1)
    _, weights = sample()

    out = aggregate(build(name), updates, weights, target=row)

    torch.testing.assert_close(out, row, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(TRANSLATION_EQUIVARIANT & set(RULES)))
def test_translation_equivariance(name: str, aggregate: Aggregate) -> None:
    updates, weights = sample()
    shift = 3.0 * torch.randn(D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    out = aggregate(build(name), updates, weights)
    shifted = aggregate(build(name), updates + shift, weights)

    torch.testing.assert_close(shifted, out + shift, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", sorted(set(RULES) - NOT_ROBUST))
@pytest.mark.parametrize(("dtype", "magnitude"), [(torch.float64, 1e6), (torch.float32, 1e30)])
def test_robust_rules_stay_bounded_under_huge_updates(
    name: str, dtype: torch.dtype, magnitude: float, aggregate: Aggregate
) -> None:
    updates, weights = sample(dtype)
    honest_scale = float(updates.abs().max())
    gen = torch.Generator().manual_seed(4)
    updates[:F] = magnitude * torch.sign(torch.randn(F, D, generator=gen)).to(dtype)

    out = aggregate(build(name), updates, weights)

    assert bool(torch.isfinite(out).all())
    assert float(out.abs().max()) <= 10.0 * honest_scale


@pytest.mark.parametrize("name", RULES)
def test_float32_agrees_with_float64(name: str, aggregate: Aggregate) -> None:
    updates, weights = sample(torch.float64)
    updates = updates.float().double()  # the same values in both precisions

    out64 = aggregate(build(name), updates, weights)
    out32 = aggregate(build(name), updates.float(), weights.float())

    torch.testing.assert_close(out32.double(), out64, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", RULES)
def test_non_finite_rows_are_dropped_before_the_rule(name: str, aggregate: Aggregate) -> None:
    updates, weights = sample()
    clean = aggregate(build(name), updates, weights)
    broken = torch.ones(2, D, dtype=updates.dtype)
    broken[0, 3] = float("nan")
    broken[1, 5] = -float("inf")
    poisoned = torch.cat([broken, updates])

    kept, kept_weights, keep = drop_non_finite(poisoned, torch.cat([weights[:2], weights]))
    out = aggregate(build(name), kept, kept_weights)

    assert keep.tolist() == [False, False] + [True] * N
    torch.testing.assert_close(out, clean, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_finite_rows_whose_sum_overflows_are_kept(dtype: torch.dtype) -> None:
    """The check sums each row first: a sum that overflows must not cost a finite row its
    place, and opposite infinities (a NaN sum) must still drop theirs."""
    big = torch.finfo(dtype).max
    updates = torch.zeros(4, 8, dtype=dtype)
    updates[0] = big  # finite, its sum is +Inf
    updates[1, :2] = torch.tensor([float("inf"), -float("inf")], dtype=dtype)
    updates[2, 7] = float("nan")
    updates[3] = -big

    _, _, keep = drop_non_finite(updates, torch.ones(4, dtype=dtype))

    assert keep.tolist() == [True, False, False, True]


@settings(max_examples=30, deadline=None)
@given(
    values=arrays(
        dtype="float64",
        shape=(N, 3),
        elements=st.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False).map(
            lambda v: round(v, 1)
        ),
    )
)
def test_output_inside_each_coordinates_range(
    values: Any, inputs_for: Callable[..., dict[str, Any]]
) -> None:
    updates = torch.from_numpy(values)
    low, high = updates.min(dim=0).values, updates.max(dim=0).values
    slack = 1e-9 * (1.0 + updates.abs().max())
    for name in sorted(INSIDE_HULL):
        rule = build(name)
        out = rule(updates, **inputs_for(rule, updates, None))
        assert bool((out >= low - slack).all() and (out <= high + slack).all()), name


@settings(max_examples=30, deadline=None)
@given(
    values=arrays(
        dtype="float64",
        shape=(N, 4),
        elements=st.integers(-5, 5).map(float),  # many ties on purpose
    ),
    seed=st.integers(0, 2**16),
)
def test_coordinatewise_rules_ignore_order_even_with_ties(values: Any, seed: int) -> None:
    updates = torch.from_numpy(values)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(seed))
    for name in (
        "median",
        "trimmed_mean",
        "ema",
        "fedlag",
        "meamed",
        "weighted_median",
        "weighted_trimmed_mean",
    ):
        rule = build(name)
        torch.testing.assert_close(rule(updates[perm]), rule(updates), rtol=1e-12, atol=1e-12)


def test_unknown_name_lists_the_rules() -> None:
    with pytest.raises(RegistryError, match=r"available: .*krum.*median"):
        build_aggregator("krumm")


@pytest.mark.parametrize("name", RULES)
def test_unknown_parameter_lists_the_accepted_ones(name: str) -> None:
    with pytest.raises(RegistryError, match="has no parameter bogus; accepted: "):
        build_aggregator(name, bogus=1, **PARAMS.get(name, {}))


INT_0 = "an integer >= 0"
INT_1 = "an integer >= 1"
POSITIVE = "a finite number > 0"
NON_NEGATIVE = "a finite number >= 0"
SHARE = "a number in [0, 0.5) or None"


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("krum", {"f": -1}, f"f must be {INT_0}, got -1"),
        ("multi_krum", {"f": 1, "m": 0}, f"m must be {INT_1} or None, got 0"),
        ("bulyan", {"f": -2}, f"f must be {INT_0}, got -2"),
        ("bulyan", {"f": True}, f"f must be {INT_0}, got True"),
        (
            "trimmed_mean",
            {"f": 1, "beta": 0.1},
            "exactly one of f (values dropped per side) or beta",
        ),
        ("trimmed_mean", {"beta": 0.5}, f"beta must be {SHARE}, got 0.5"),
        ("trimmed_mean", {"f": -1}, f"f must be {INT_0} or None, got -1"),
        ("geometric_median", {"nu": 0.0}, f"nu must be {POSITIVE}, got 0.0"),
        ("geometric_median", {"max_iter": 0}, f"max_iter must be {INT_1}, got 0"),
        ("geometric_median", {"tol": float("nan")}, f"tol must be {NON_NEGATIVE}, got nan"),
        ("centered_clipping", {"tau": -1.0}, f"tau must be {POSITIVE}, got -1.0"),
        ("centered_clipping", {"tau": float("inf")}, f"tau must be {POSITIVE}, got inf"),
        ("centered_clipping", {"n_iter": 0}, f"n_iter must be {INT_1}, got 0"),
        ("ema", {"k": -0.5}, f"k must be {NON_NEGATIVE}, got -0.5"),
        ("fedlag", {"eps": 0.0}, f"eps must be {POSITIVE}, got 0.0"),
        ("fedlag", {"max_candidates": 0}, f"max_candidates must be {INT_1} or None, got 0"),
        ("fedlag", {"seed": 1.5}, "seed must be an integer, got 1.5"),
        ("zeno", {"b": -1}, f"b must be {INT_0}, got -1"),
        ("zeno", {"b": 1, "rho": -1.0}, f"rho must be {NON_NEGATIVE}, got -1.0"),
        ("mda", {"f": -1}, f"f must be {INT_0}, got -1"),
        ("mda", {"f": 1, "max_nodes": 0}, f"max_nodes must be {INT_1}, got 0"),
        (
            "monna",
            {"f": 1, "anchor": "mean"},
            "anchor must be one of 'median', 'reference', got 'mean'",
        ),
        ("meamed", {"f": 1.5}, f"f must be {INT_0}, got 1.5"),
        ("dnc", {"f": 1, "n_iters": 0}, f"n_iters must be {INT_1}, got 0"),
        ("dnc", {"f": 1, "sub_dim": 0}, f"sub_dim must be {INT_1}, got 0"),
        ("dnc", {"f": 1, "filter_frac": -0.5}, f"filter_frac must be {NON_NEGATIVE}, got -0.5"),
        ("dnc", {"f": 1, "seed": "0"}, "seed must be an integer, got '0'"),
        ("foolsgold", {"kappa": 0.0}, f"kappa must be {POSITIVE}, got 0.0"),
        ("weighted_trimmed_mean", {"beta": 0.5}, f"beta must be {SHARE}, got 0.5"),
        ("norm_bounded_mean", {"max_norm": 0.0}, f"max_norm must be {POSITIVE} or None, got 0.0"),
        ("krum", {}, "missing 1 required keyword-only argument: 'f'"),
    ],
)
def test_invalid_hyperparameters_fail_when_built(
    name: str, params: dict[str, Any], message: str
) -> None:
    with pytest.raises(RegistryError, match=re.escape(message)):
        build_aggregator(name, **params)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("bucketing", {"s": 0}, f"s must be {INT_1}, got 0"),
        ("clip", {"c": 0.0}, f"c must be {POSITIVE}, got 0.0"),
        ("arc", {"f": -1}, f"f must be {INT_0}, got -1"),
        ("nnm", {"f": 1.0}, f"f must be {INT_0}, got 1.0"),
    ],
)
def test_invalid_preaggregator_hyperparameters_fail_when_built(
    name: str, params: dict[str, Any], message: str
) -> None:
    with pytest.raises(RegistryError, match=re.escape(message)):
        build_preaggregator(name, **params)


@pytest.mark.parametrize(
    ("name", "params", "n", "parameter"),
    [
        ("krum", {"f": 2}, 6, "f=2"),
        ("multi_krum", {"f": 2}, 6, "f=2"),
        ("multi_krum", {"f": 1, "m": 9}, 8, "m=9"),
        ("bulyan", {"f": 2}, 10, "f=2"),
        ("trimmed_mean", {"f": 3}, 6, "f=3"),
        ("zeno", {"b": 4}, 4, "b=4"),
        ("mda", {"f": 3}, 6, "f=3"),
        ("monna", {"f": 3}, 6, "f=3"),
        ("meamed", {"f": 3}, 6, "f=3"),
        ("dnc", {"f": 6}, 6, "f=6"),
    ],
)
def test_data_conditions_are_checked_at_call_time(
    name: str, params: dict[str, Any], n: int, parameter: str, aggregate: Aggregate
) -> None:
    rule = build_aggregator(name, **params)
    updates = torch.randn(n, D, dtype=torch.float64)

    with pytest.raises(ValueError, match=parameter):
        aggregate(rule, updates)


Diagnose = Callable[..., tuple[Tensor, dict[str, Any]]]


@pytest.mark.parametrize("name", RULES)
def test_every_rule_reports_per_client_weights_and_columns(name: str, diagnose: Diagnose) -> None:
    updates, weights = sample()

    _, diagnostics = diagnose(build(name), updates, weights)

    weight = diagnostics["effective_weight"]
    assert weight.shape == (N,) and weight.dtype == torch.float64
    assert bool(torch.isfinite(weight).all()) and bool((weight >= 0).all())
    for column, values in diagnostics["columns"].items():
        assert values.shape == (N,), column
        assert bool(torch.isfinite(values).all()), column


@pytest.mark.parametrize("name", sorted(set(RULES) - PARTIAL_WEIGHT))
def test_effective_weights_sum_to_one(name: str, diagnose: Diagnose) -> None:
    updates, weights = sample()

    _, diagnostics = diagnose(build(name), updates, weights)

    assert float(diagnostics["effective_weight"].sum()) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("name", sorted(WEIGHTED_MEAN))
def test_weighted_mean_rules_are_their_effective_weights_times_the_updates(
    name: str, diagnose: Diagnose
) -> None:
    updates, weights = sample()

    out, diagnostics = diagnose(build(name), updates, weights)

    torch.testing.assert_close(diagnostics["effective_weight"] @ updates, out)


@pytest.mark.parametrize("name", sorted(set(RULES) - PARTIAL_WEIGHT))
def test_a_selected_or_heavier_honest_client_outweighs_a_huge_one(
    name: str, diagnose: Diagnose
) -> None:
    updates, weights = sample()
    updates[0] = 1e6  # an outlier every robust rule should (almost) ignore

    _, diagnostics = diagnose(build(name), updates, weights)

    weight = diagnostics["effective_weight"]
    if name not in NOT_ROBUST:
        assert float(weight[0]) < float(weight[1:].max()), name


@pytest.mark.parametrize("name", RULES)
def test_non_finite_rows_are_dropped_by_the_rule_and_reported(
    name: str, diagnose: Diagnose
) -> None:
    updates, weights = sample()
    clean, clean_diagnostics = diagnose(build(name), updates, weights)
    broken = torch.ones(2, D, dtype=updates.dtype)
    broken[0, 3] = float("nan")
    broken[1, 5] = -float("inf")
    poisoned = torch.cat([updates[:4], broken, updates[4:]])  # rows 4 and 5
    rows = [*range(4), *range(6, N + 2)]

    out, diagnostics = diagnose(
        build(name), poisoned, torch.cat([weights[:4], weights[:2], weights[4:]])
    )

    torch.testing.assert_close(out, clean, rtol=1e-12, atol=1e-12)
    assert diagnostics["dropped_non_finite"].tolist() == [4, 5]
    weight = diagnostics["effective_weight"]
    assert weight[4:6].tolist() == [0.0, 0.0]
    torch.testing.assert_close(weight[rows], clean_diagnostics["effective_weight"])
    for column, values in diagnostics["columns"].items():
        assert bool(values[4:6].isnan().all()), column
        torch.testing.assert_close(values[rows], clean_diagnostics["columns"][column])
    if "selected" in clean_diagnostics:
        expected = [rows[i] for i in clean_diagnostics["selected"].tolist()]
        assert diagnostics["selected"].tolist() == expected


@pytest.mark.parametrize("name", RULES)
def test_a_non_finite_weight_drops_that_client(name: str, diagnose: Diagnose) -> None:
    updates, weights = sample()
    clean, _ = diagnose(build(name), updates, weights)
    extended = torch.cat([updates[:3], updates[:1], updates[3:]])  # row 3 is a copy of row 0
    sizes = torch.cat([weights[:3], torch.tensor([float("nan")], dtype=weights.dtype), weights[3:]])

    out, diagnostics = diagnose(build(name), extended, sizes)

    assert diagnostics["dropped_non_finite"].tolist() == [3]
    torch.testing.assert_close(out, clean, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", RULES)
def test_all_rows_non_finite_raise(name: str, diagnose: Diagnose) -> None:
    updates = torch.full((N, D), float("nan"), dtype=torch.float64)

    with pytest.raises(ValueError, match="every one of the 11 updates"):
        diagnose(build(name), updates, None)


@pytest.mark.parametrize(
    ("name", "keyword"),
    [
        ("zeno", "oracle"),
        ("fltrust", "reference"),
        ("foolsgold", "client_ids"),
        ("fednova", "local_norms"),
        ("afl", "client_ids"),
    ],
)
def test_a_missing_round_input_says_how_to_pass_it(name: str, keyword: str) -> None:
    updates, _ = sample()

    with pytest.raises(TypeError, match=rf"{name} needs {keyword}: call step\("):
        build(name)(updates)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"client_ids": [0] * N}, "client_ids must be 11 distinct ids"),
        ({"client_ids": [0, 1]}, "client_ids must be 11 distinct ids"),
        ({"reference": torch.zeros(D + 1)}, r"reference must have shape \(16,\)"),
        ({"reference": torch.full((D,), float("inf"))}, "reference .* holds NaN or Inf"),
        ({"local_norms": torch.zeros(N)}, "local_norms must be 11 positive numbers"),
        ({"local_norms": torch.ones(N - 1)}, "local_norms must be 11 positive numbers"),
        ({"losses": torch.full((N,), float("nan"))}, "losses must be 11 finite numbers"),
    ],
)
def test_bad_round_inputs_are_refused(inputs: dict[str, Any], message: str) -> None:
    updates, _ = sample()

    with pytest.raises(ValueError, match=message):
        build("fedavg").step({}, updates, **inputs)


@pytest.mark.parametrize("name", sorted(COORDINATEWISE))
@pytest.mark.parametrize("ties", [False, True])
def test_coordinatewise_weights_reproduce_each_coordinate_and_average(
    name: str, ties: bool, diagnose: Diagnose
) -> None:
    updates, weights = sample()
    if ties:
        updates = updates.mul(1.5).round()  # runs of equal values at every window edge

    out, diagnostics = diagnose(build(name), updates, weights)

    per_column = []
    for k in range(D):
        value, column = diagnose(build(name), updates[:, k : k + 1], weights)
        coefficients = column["effective_weight"]
        torch.testing.assert_close(coefficients @ updates[:, k], out[k : k + 1].squeeze(0))
        torch.testing.assert_close(value, out[k : k + 1])
        # clients holding equal values get equal coefficients (per unit of weight)
        share = coefficients / weights.double() if name.startswith("weighted") else coefficients
        equal = updates[:, k, None] == updates[None, :, k]
        torch.testing.assert_close(
            share[:, None].expand(N, N)[equal], share[None, :].expand(N, N)[equal]
        )
        per_column.append(coefficients)
    torch.testing.assert_close(diagnostics["effective_weight"], torch.stack(per_column).mean(dim=0))
