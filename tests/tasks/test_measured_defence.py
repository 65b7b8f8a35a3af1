"""A run says what its defence caught where it was measured: the lookup in the small
consortium's record (tasks/measured_defence.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def params(sites: int, filters: list[dict[str, Any]], dataset: str = "breastmnist") -> Params:
    return Params.model_validate({
        "data": {"dataset": dataset}, "partition": {"num_clients": sites},
        "aggregate": {"name": "median"}, "filters": filters,
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
        "defence as measured: robust (measured in front of the median) at 3 sites (the "
        "measured size nearest to this run's 4), one attacking site, 5 rounds "
        f"({measured_defence.SHOWN}): a label flipper out in 2 of 10 seeds on breastmnist, "
        "10 of 10 on digits; a sign flipper out in 9 of 10 seeds on breastmnist"
    )
    assert start_line(params(3, [ROBUST | {"alpha": 0.01}]), path) == (
        "defence as measured: the configured filters (pid_made, as set) were not measured "
        f"({measured_defence.SHOWN} measures median, robust, absent); what they catch at 3 "
        "sites is unknown"
    )
    assert start_line(params(3, [ROBUST]), tmp_path / "none.json") == (
        f"defence as measured: no record of what filters catch ({measured_defence.SHOWN} not "
        "found, or written before its rows)"
    )


def test_with_nobody_excluded_the_run_says_how_many_flippers_this_defence_caught(tmp_path):
    path = written(tmp_path)
    assert no_exclusion_sentence(params(3, [ROBUST]), path) == (
        "no site excluded; this defence caught 2 of 10 label flippers at 3 sites in our "
        "measurements (breastmnist)"
    )
    # a dataset the record did not measure: every measured one is named
    assert no_exclusion_sentence(params(3, [ROBUST], "pathmnist"), path) == (
        "no site excluded; this defence caught 2 of 10 (breastmnist), 10 of 10 (digits) label "
        "flippers at 3 sites in our measurements"
    )
    assert no_exclusion_sentence(params(3, []), path).startswith(
        "no site excluded; this defence caught 0 of 10 label flippers at 3 sites"
    )
    assert no_exclusion_sentence(params(3, [ROBUST | {"alpha": 0.01}]), path) == (
        "no site excluded; this defence was not measured against a label flipper in our "
        f"measurements ({measured_defence.SHOWN})"
    )


def test_the_committed_record_is_read_for_the_distance_cusum_at_three_sites():
    line = start_line(params(3, [{"name": "distance_cusum", "exclusion": "permanent"}]))
    record = measured_defence.load_record()
    assert record is not None
    [row] = [r for r in record["rows"] if (r["dataset"], r["sites"], r["attack"], r["defence"])
             == ("breastmnist", 3, "label_flip", "distance_cusum")]  # fmt: skip
    assert line.startswith(
        "defence as measured: distance_cusum (measured in front of the median) at 3 sites, "
        "one attacking site, 5 rounds"
    )
    assert f"a label flipper out in {row['caught_seeds']} of 10 seeds on breastmnist" in line
