"""PID-MADE's convergence tables (benchmarks/evidence/tables/pid_made.py) on the committed record:
the clean row is there, and the measures are the ones benchmarks/papers/pid_made_convergence.py
states."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.evidence.tables.pid_made import (
    convergence_block,
    convergence_paired,
    convergence_rows,
    rounds_to,
)
from benchmarks.evidence.tables.records import results_json
from benchmarks.papers import pid_made_convergence as convergence


def test_rounds_to_is_the_first_round_at_or_below_the_target():
    losses = [2.0, 0.9, 0.5, 0.55, 0.4]

    assert rounds_to(losses, 0.5) == 3  # reached in round 3, whatever comes after
    assert rounds_to(losses, 2.0) == 1
    assert rounds_to(losses, 0.3) is None  # never: the paper's dashed bar


def committed_runs() -> list[dict]:
    """The record's rows read here with numpy, apart from the table's own parsing."""
    rows = results_json(convergence.STEM.name)["rows"]
    return [r | {"losses": np.array(r["loss_curve"].split(), float)} for r in rows]


def test_the_block_has_the_clean_rows_first_then_every_share_and_method():
    lines = convergence_block().splitlines()

    methods = list(convergence.method_specs(0))
    assert len(lines) == 2 + len(convergence.CLEAN_METHODS) + len(convergence.FRACTIONS) * len(
        methods
    )
    assert lines[2].startswith("| none | fedavg | – | 10/10 |")  # reaches its own target
    assert lines[3].startswith("| none | pid_made | – |")
    assert "| 0.000 ± 0.000 [10] |" in lines[2]  # the clean run minus itself
    assert lines[4].startswith("| 4 of 40 | fedavg | – |")
    assert lines[-1].startswith("| 20 of 40 | bulyan | 9 |")  # told what Bulyan can take


def test_the_measures_are_the_ones_the_benchmark_states():
    runs = committed_runs()
    clean = {
        r["seed"]: r["losses"]
        for r in runs
        if r["attack"] == "none" and r["method"] == "fedavg" and not r["error"]
    }
    table = {(r["method"], r["fraction"], r["seed"]): r for r in convergence_rows()}

    for run in runs:
        row = table[(run["method"], run["fraction"], run["seed"])]
        target = 1.10 * clean[run["seed"]][-1]  # 10 % above the clean run's final loss
        below = np.flatnonzero(run["losses"] <= target)
        assert row["rounds_to_target"] == (int(below[0]) + 1 if len(below) else None)
        assert row["mean_loss"] == pytest.approx(run["losses"].mean(), abs=1e-12)
        assert len(run["losses"]) == 20


def test_the_paired_table_tests_pid_made_against_fedavg_at_every_share():
    runs = committed_runs()
    paired = convergence_paired()

    assert [value for _, value, _ in paired.tests] == ["0.1", "0.2", "0.3", "0.4", "0.5"]
    assert paired.reference == "fedavg" and paired.families() == [[0, 1, 2, 3, 4]]
    for method, value, (differences, p) in paired.tests:
        mean = {
            (r["method"], r["seed"]): r["losses"].mean()
            for r in runs
            if r["fraction"] == float(value)
        }
        expected = [mean[("pid_made", s)] - mean[("fedavg", s)] for s in range(10)]
        assert method == "pid_made" and differences == pytest.approx(expected, abs=1e-12)
        assert 2 / 2**10 <= p <= 1 and not math.isnan(p)


def test_the_pinned_pid_made_is_the_papers_algorithm_as_pid_made_defaults_it():
    from aggregation.registry import build_filter

    spec = convergence.method_specs(4)["pid_made"]

    assert spec["aggregate"] == {"name": "fedavg"}
    assert build_filter(**spec["filters"][0]) == build_filter("pid_made")
    assert build_filter("pid_made").threshold == "gaussian"


def test_a_rerun_of_some_experiments_keeps_the_other_experiments_committed_rows(tmp_path):
    """``--experiments figure4`` (or a checkout without the cells file) rewrites the
    summary with figure4's rows from the cells and every other experiment's committed
    rows, not figure4's alone."""
    import json

    from benchmarks.papers import pid_made_paper
    from benchmarks.robustness.matrix import RESULTS

    committed = RESULTS / "pid-made-paper.json"
    stem = tmp_path / "pid-made-paper"
    stem.with_suffix(".json").write_text(committed.read_text())

    pid_made_paper.summarise(tmp_path / "no-cells.jsonl", stem)

    assert stem.with_suffix(".json").read_text() == committed.read_text()
    assert stem.with_suffix(".md").read_text() == committed.with_suffix(".md").read_text()

    cell = {
        "name": "figure4.fedavg-label_flip-f0.3-s0", "method": "figure4.fedavg", "fraction": 0.3,
        "seed": 0, "metrics": {"test_acc": 0.5, "test_loss": 1.5, "total_false_positives": 0.0,
                    "total_false_negatives": 12.0},
        "excluded": {"malicious_first_round": {}, "honest": []},
        "exposure": {"attackers": 12, "honest_rounds": 560, "attacker_rounds": 240},
    }  # fmt: skip
    (tmp_path / "cells.jsonl").write_text(json.dumps(cell) + "\n")

    pid_made_paper.summarise(tmp_path / "cells.jsonl", stem)

    rows = json.loads(stem.with_suffix(".json").read_text())["rows"]
    [rerun] = [r for r in rows if r["experiment"] == "figure4"]
    assert (rerun["method"], rerun["seeds"], rerun["acc"]) == ("fedavg", 1, [0.5])
    assert rerun["seed"] == [0]  # every per-seed list beside its seed ids
    others = [r for r in json.loads(committed.read_text())["rows"] if r["experiment"] != "figure4"]
    assert json.dumps([r for r in rows if r["experiment"] != "figure4"]) == json.dumps(others)
    assert "| figure4 | fedavg | 0.3 | 1 |" in stem.with_suffix(".md").read_text()
