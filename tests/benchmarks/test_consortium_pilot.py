"""The real-site pilot's own steps (benchmarks/sites/consortium_pilot.py): hospital-c's
training labels reversed and nothing else, and what the run's trail says of who was out."""

from __future__ import annotations

import csv
from pathlib import Path

from benchmarks.sites import consortium_pilot


def test_the_flipper_reverses_its_training_labels_and_keeps_its_held_out_ones(tmp_path: Path):
    table = tmp_path / "labels.csv"
    rows = [("train/0.png", "malignant", "train"), ("train/1.png", "normal, benign", "train"),
            ("test/0.png", "malignant", "test")]  # fmt: skip
    with table.open("w", newline="") as handle:
        csv.writer(handle).writerows([("file", "label", "split"), *rows])

    assert consortium_pilot.flip_training_labels(table) == 2
    with table.open(newline="") as handle:
        flipped = [(r["file"], r["label"], r["split"]) for r in csv.DictReader(handle)]
    assert flipped == [("train/0.png", "normal, benign", "train"),
                       ("train/1.png", "malignant", "train"),
                       ("test/0.png", "malignant", "test")]  # fmt: skip


def test_the_outcome_is_read_off_the_trail_by_site(tmp_path: Path):
    trail = tmp_path / "exclusions.csv"
    excluded = {(1, 1), (2, 2), (3, 2)}  # hospital-b out in round 1, hospital-c from round 2
    with trail.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("round", "client", "excluded"))
        writer.writerows((t, c, (t, c) in excluded) for t in (1, 2, 3) for c in (0, 1, 2))

    assert consortium_pilot.outcome(trail) == {
        "flipper_out_round": 2, "honest_banned": ["hospital-b"],
        "honest_site_rounds_excluded": 1, "rounds_in_trail": 3,
    }  # fmt: skip
