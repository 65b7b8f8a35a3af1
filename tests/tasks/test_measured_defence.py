"""A run says what its defence caught where it was measured: the lookup in the small
consortium's record (tasks/measured_defence.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from config.params import Params
from tasks import measured_defence
from tasks.measured_defence import measured_for, no_exclusion_sentence, start_line

ROBUST = {"name": "pid_made", "threshold": "robust", "spending": "none"}


def _row(dataset: str, sites: int, attack: str, defence: str, caught: int) -> dict[str, Any]:
    return {"dataset": dataset, "sites": sites, "attack": attack, "defence": defence,
            "seeds": 10, "caught_seeds": caught, "median_round": 2 if caught else None,
            "false_exclusions": 0.0}  # fmt: skip


RECORD = {
    "settings": {
        "model": "small_cnn",
        "rounds": 5,
        "defences": {"median": [], "robust": [ROBUST], "absent": [{"name": "no_such_filter"}]},
    },
    "rows": [
        _row("breastmnist", 3, "label_flip", "robust", 2),
        _row("digits", 3, "label_flip", "robust", 10),
        _row("breastmnist", 3, "sign_flip", "robust", 9),
        _row("breastmnist", 10, "label_flip", "robust", 10),
        _row("breastmnist", 3, "label_flip", "median", 0),
        _row("breastmnist", 3, "label_flip", "absent", 10),
    ],
}


def params(
    sites: int,
    filters: list[dict[str, Any]],
    dataset: str = "breastmnist",
    model: str = "small_cnn",
) -> Params:
    return Params.model_validate({
        "data": {"dataset": dataset}, "partition": {"num_clients": sites},
        "aggregate": {"name": "median"}, "filters": filters, "model": {"name": model},
    })  # fmt: skip


def test_a_runs_filters_are_found_at_the_nearest_measured_size_with_every_setting_equal():
    at_three = measured_for(params(3, [ROBUST]), RECORD)
    assert (at_three.defence, at_three.sites) == ("robust", 3)
    assert {(r["dataset"], r["attack"]) for r in at_three.rows} == {
        ("breastmnist", "label_flip"),
        ("digits", "label_flip"),
        ("breastmnist", "sign_flip"),
    }
    assert measured_for(params(4, [ROBUST]), RECORD).sites == 3  # ties go to the smaller
    assert measured_for(params(7, [ROBUST]), RECORD).sites == 10
    # one setting changed is another filter: not measured, never borrowed
    other = measured_for(params(3, [ROBUST | {"alpha": 0.01}]), RECORD)
    assert other.defence is None and other.known == ["median", "robust", "absent"]
    assert measured_for(params(3, []), RECORD).defence == "median"


def written(folder: Path, record: dict[str, Any] = RECORD) -> Path:
    path = folder / "small-consortium-cpu.json"
    path.write_text(json.dumps(record))
    return path


def test_the_start_line_says_what_was_caught_or_that_nothing_was_measured(tmp_path):
    path = written(tmp_path)
    assert start_line(params(4, [ROBUST]), path) == (
        "defence as measured: robust (measured in front of the median) with small_cnn at 3 "
        "sites (the measured size nearest to this run's 4), one attacking site, 5 rounds "
        f"({measured_defence.SHOWN}): a label flipper out in 2 of 10 seeds on breastmnist, "
        "10 of 10 on digits; a sign flipper out in 9 of 10 seeds on breastmnist"
    )
    assert start_line(params(3, [ROBUST | {"alpha": 0.01}]), path) == (
        "defence as measured: the configured filters (pid_made, as set) were not measured "
        f"({measured_defence.SHOWN} measures median, robust, absent with small_cnn); what "
        "they catch at 3 sites is unknown"
    )
    # the record's choice at the measured size: where it holds, or which it is
    chosen = RECORD | {"recommended": {"3": {"defence": "robust", "holds_on": ["digits"],
                                             "fails_on": ["breastmnist"]}}}  # fmt: skip
    recommended = written(tmp_path, chosen)
    assert start_line(params(3, [ROBUST]), recommended).endswith(
        "; the recommendation for small_cnn at 3 sites: it holds against a label flipper on "
        "digits, and does not on breastmnist"
    )
    assert start_line(params(3, []), recommended).endswith(
        "; the recommendation for small_cnn at 3 sites is robust"
    )
    path = written(tmp_path)
    assert start_line(params(3, [ROBUST]), tmp_path / "none.json") == (
        "defence as measured: no record of what filters catch with small_cnn "
        "(benchmarks/results/none.json not found, or written before its rows)"
    )


def test_with_nobody_excluded_the_run_says_how_many_flippers_this_defence_caught(tmp_path):
    path = written(tmp_path)
    assert no_exclusion_sentence(params(3, [ROBUST]), path) == (
        "no site excluded; this defence caught 2 of 10 label flippers at 3 sites in our "
        "measurements (breastmnist, small_cnn)"
    )
    # a dataset the record did not measure: every measured one is named
    assert no_exclusion_sentence(params(3, [ROBUST], "pathmnist"), path) == (
        "no site excluded; this defence caught 2 of 10 (breastmnist), 10 of 10 (digits) label "
        "flippers at 3 sites in our measurements (small_cnn)"
    )
    assert no_exclusion_sentence(params(3, []), path).startswith(
        "no site excluded; this defence caught 0 of 10 label flippers at 3 sites"
    )
    assert no_exclusion_sentence(params(3, [ROBUST | {"alpha": 0.01}]), path) == (
        "no site excluded; this defence was not measured against a label flipper with "
        f"small_cnn in our measurements ({measured_defence.SHOWN})"
    )


def test_a_run_reads_its_own_models_record_never_another_models(tmp_path):
    """What a filter catches depends on the model it guards: a logistic run given the
    small CNN's record (or a model no record measured) is told that its model was not
    measured, and is given none of the rows."""
    path = written(tmp_path)  # measured with small_cnn
    logistic = params(3, [ROBUST], model="logreg")
    assert measured_for(logistic, RECORD).rows == []
    said = start_line(logistic, path)
    assert said.startswith("defence as measured: not measured with this run's model, logreg")
    assert "2 of 10" not in said
    assert no_exclusion_sentence(logistic, path).startswith(
        "no site excluded; this defence was not measured with this run's model, logreg"
    )
    # by default each model's run reads its own model's record, a model without one none
    assert measured_defence.record_path(logistic) == measured_defence.RECORDS["logreg"]
    assert measured_defence.record_path(params(3, [])) == measured_defence.RECORDS["small_cnn"]
    resnet = params(3, [ROBUST], model="resnet18")
    assert measured_defence.record_path(resnet) is None
    assert "not measured with this run's model, resnet18" in start_line(resnet)
    assert "not measured with this run's model, resnet18" in no_exclusion_sentence(resnet)


def test_filters_in_front_of_another_rule_were_not_measured(tmp_path):
    """The record measured filters directly in front of the median: a FedAvg run, or one
    with a pre-aggregator between, is told so and given no row."""
    path = written(tmp_path)
    fedavg = params(3, []).model_copy(update={"aggregate": params(3, []).aggregate.model_copy(
        update={"name": "fedavg"})})  # fmt: skip
    assert measured_for(fedavg, RECORD).rows == []
    said = (
        f"not measured in front of fedavg ({measured_defence.SHOWN} measures filters directly "
        "in front of median with small_cnn)"
    )
    assert start_line(fedavg, path) == (
        f"defence as measured: this run's defence was {said}; what it catches at 3 sites is unknown"
    )
    assert no_exclusion_sentence(fedavg, path) == f"no site excluded; this defence was {said}"
    clipped = Params.model_validate({
        "data": {"dataset": "breastmnist"}, "partition": {"num_clients": 3},
        "aggregate": {"name": "median"}, "preaggregators": [{"name": "clip", "c": 1.0}],
    })  # fmt: skip
    assert "not measured in front of median after clip" in start_line(clipped, path)


@pytest.mark.parametrize("model", ["logreg", "small_cnn"])
def test_the_committed_record_of_the_runs_model_is_read_for_the_distance_cusum(model):
    cusum = [{"name": "distance_cusum", "exclusion": "permanent"}]
    line = start_line(params(3, cusum, model=model))
    record = measured_defence.load_record(measured_defence.RECORDS[model])
    assert record is not None and record["settings"]["model"] == model
    [row] = [r for r in record["rows"] if (r["dataset"], r["sites"], r["attack"], r["defence"])
             == ("breastmnist", 3, "label_flip", "distance_cusum")]  # fmt: skip
    assert line.startswith(
        f"defence as measured: distance_cusum (measured in front of the median) with {model} "
        "at 3 sites, one attacking site, 5 rounds"
    )
    assert f"a label flipper out in {row['caught_seeds']} of 10 seeds on breastmnist" in line
