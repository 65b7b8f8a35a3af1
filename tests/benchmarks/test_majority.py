"""Runs at the majority class, counted exactly and within one test image, from the
records: the test set's size is read off them and each run's distance is whole images."""

from __future__ import annotations

from benchmarks.evidence.tables import majority
from benchmarks.evidence.tables.records import load, with_halts
from benchmarks.evidence.tables.robustness_regimes import at_majority
from federated.data import DIGITS_SPLIT


def run(acc: float, *, halted: bool = False, seed: int = 0) -> dict:
    return {"test_acc": acc, "majority_share": 0.75, "halted": halted, "seed": seed}


def test_the_test_set_size_is_the_smallest_count_every_accuracy_is_a_whole_number_of():
    assert majority.test_images([run(0.25), run(0.5)]) == 4  # 0.75, 0.25, 0.5: quarters
    assert majority.test_images([run(0.3333), run(0.5)]) == 12  # thirds and quarters
    # digits' test split is 360 images (federated.data's split), and its records say so
    assert majority.test_images(load("digits-cnn")) == DIGITS_SPLIT["test"]


def test_a_run_one_image_away_counts_within_one_image_but_not_exactly():
    runs = [run(0.75, seed=0), run(0.5, seed=1), run(1.0, seed=2), run(0.75, halted=True)]

    assert majority.counted(runs, 4, within=0) == (1, [0])
    assert majority.counted(runs, 4, within=1) == (3, [0, 1, 2])  # the halted run never


def test_the_exact_count_is_the_grid_tables_majority_column():
    rows = with_halts(load("breastmnist-cnn"))
    images = majority.test_images(r for r in rows if not r["halted"])

    exact, _ = majority.counted(rows, images, within=0)

    assert exact == sum(at_majority(r) for r in rows if not r["halted"])
    assert majority.counted(rows, images, within=1)[0] > exact
