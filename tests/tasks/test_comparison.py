"""The grid's summary over seeds: means, 95 % intervals, and what the heatmap marks."""

import math

import numpy as np
import pytest

from tasks.comparison import (
    CellResult,
    aggregate_over_seeds,
    heat_table,
    interval,
    summary_markdown,
)


def test_the_interval_is_students_t_over_the_seeds():
    mean, std, half = interval([0.7, 0.8, 0.9])

    assert mean == pytest.approx(0.8)
    assert std == pytest.approx(0.1)
    assert half == pytest.approx(4.302652729911275 * 0.1 / math.sqrt(3))  # t(0.975, 2)


def test_one_seed_has_a_mean_but_no_interval_and_nans_are_left_out():
    assert interval([0.5])[0] == 0.5 and math.isnan(interval([0.5])[2])
    assert interval([0.4, float("nan"), 0.6])[0] == pytest.approx(0.5)
    assert all(math.isnan(v) for v in interval([]))


def cell(method, seed, acc, fp=0.0, rounds_to_target=3):
    metrics = {"test_acc": acc, "test_auc": acc, "rounds_to_target": rounds_to_target,
               "total_false_positives": fp, "total_false_negatives": 0.0}  # fmt: skip
    return CellResult(method, "sign_flip", 0.2, seed, metrics, [acc / 2, acc])


def test_cells_are_summarised_per_method_and_scenario_over_their_seeds():
    cells = [cell("fedavg", s, a) for s, a in enumerate([0.6, 0.7])] + [
        cell("median", s, a, fp=f, rounds_to_target=r)
        for s, (a, f, r) in enumerate([(0.8, 2.0, -1), (0.9, 4.0, 5)])
    ]

    rows = aggregate_over_seeds(cells)

    assert [(r["method"], r["seeds"]) for r in rows] == [("fedavg", [0, 1]), ("median", [0, 1])]
    median = rows[1]
    assert median["acc_mean"] == pytest.approx(0.85)
    assert median["fp_mean"] == pytest.approx(3.0)
    assert median["rounds_to_target_mean"] == 5  # a seed that never reached it is left out
    assert "| median | sign_flip | 0.2 | 2 | 0.850 ± " in summary_markdown(rows)


def test_the_heatmap_marks_methods_whose_interval_overlaps_the_best():
    rows = [
        {"method": m, "attack": "a", "fraction": 0.1, "acc_mean": mean, "acc_ci95": half}
        for m, mean, half in (("x", 0.80, 0.02), ("y", 0.79, 0.02), ("z", 0.60, 0.02))
    ]

    means, tied, scenarios = heat_table(rows, ["x", "y", "z"])

    assert scenarios == ["a @ 0.1"]
    assert np.allclose(means, [[0.80, 0.79, 0.60]])
    assert tied.tolist() == [[False, True, False]]  # the best itself is not marked
