"""Runs that end at the majority class, counted two ways: accuracy equal to the majority
class's share of the test set, and accuracy within one test image of it. A model that
calls every test image the majority class scores exactly that share. One that differs on a
single image may have learnt almost nothing either, so the readings quote both counts."""

from __future__ import annotations

from collections.abc import Iterable

from benchmarks.evidence.tables.cells import table
from benchmarks.evidence.tables.records import Row, distinct, load, with_halts

# records whose majority counts docs/results.md reads: the BreastMNIST CNN's clean runs
MAJORITY_COUNTED = ("breastmnist-cnn",)
ROUNDING = 5e-5  # the records keep four digits


def test_images(rows: Iterable[Row]) -> int:
    """The test set's size, read off the records: the smallest number of images of which
    every recorded accuracy and majority share is a whole count (to four digits)."""
    shares = {r[key] for r in rows for key in ("test_acc", "majority_share") if r[key] is not None}
    for images in range(1, 100_001):
        if all(
            abs(share * images - round(share * images)) <= images * ROUNDING for share in shares
        ):
            return images
    raise ValueError("no test set size of up to 100,000 images makes every accuracy a count")


def images_off(row: Row, images: int) -> int:
    """How many test images the run's accuracy is from the majority class's share."""
    return abs(round(row["test_acc"] * images) - round(row["majority_share"] * images))


def counted(runs: list[Row], images: int, within: int) -> tuple[int, list[int]]:
    """Runs within ``within`` test images of the majority share (a halted run, scored at
    chance, is not counted: it ended at no model), and their seeds."""
    seeds = sorted(
        int(r["seed"]) for r in runs if not r["halted"] and images_off(r, images) <= within
    )
    return len(seeds), seeds


def majority_block(name: str) -> str:
    """Per method of record ``name``: its runs without attack and under attack that end at
    the majority class's share exactly and within one test image, with a line for all."""
    rows = with_halts(load(name))
    images = test_images(r for r in rows if not r["halted"])
    groups = {
        "no attack": [r for r in rows if r["attack"] == "none"],
        "under attack": [r for r in rows if r["attack"] != "none"],
    }

    def cells(runs: list[Row], seeds_shown: bool) -> list[str]:
        shown = []
        for within in (0, 1):
            count, seeds = counted(runs, images, within)
            named = f"seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}"
            where = f" ({named})" if seeds_shown and seeds else ""
            shown.append(f"{count} of {len(runs)}{where}")
        return shown

    header = ("method", *(f"{group}: {how}" for group in groups
                          for how in ("exactly", "within one test image")))  # fmt: skip
    body = [
        (method, *(cell for group, runs in groups.items()
                   for cell in cells([r for r in runs if r["method"] == method],
                                     seeds_shown=group == "no attack")))
        for method in distinct(rows)
    ]  # fmt: skip
    body.append(("all", *(cell for runs in groups.values() for cell in cells(runs, False))))
    majority = next(r["majority_share"] for r in rows)
    return (
        f"Test set: {images} images (read off the records); the majority class's share "
        f"{majority:.4f} ({round(majority * images)} images), one image {1 / images:.4f}.\n\n"
        + table(header, body)
    )
