"""Each site's data lineage as the hub keeps it (flowerapp.lineage): the digest a site
answered from, with the rounds it trained and scored on it; a change mid-run is named with
the rounds on either side; a resumed run's part continues the earlier part's record; the
pooled held-out split's majority share comes from the counts the sites reported."""

from __future__ import annotations

import pytest

from flowerapp.lineage import SiteLineage

A, B = "a" * 64, "b" * 64
COUNTS = {"train": [3, 1], "test": [1, 1]}


def test_a_site_answering_from_the_same_data_is_one_entry_with_its_rounds() -> None:
    lineage = SiteLineage()
    assert lineage.record(0, A, **COUNTS, trained=1) is None
    for round_number in (2, 3):
        assert lineage.record(0, A, **COUNTS, trained=round_number, scored=round_number - 1) is None
    assert lineage.record(0, A, **COUNTS, scored=3) is None
    assert lineage.to_json() == {
        "0": [{"sha256": A, **COUNTS, "trained": [1, 2, 3], "scored": [1, 2, 3]}]
    }
    assert lineage.changed() == []


def test_a_change_mid_run_is_named_with_the_rounds_before_and_after() -> None:
    lineage = SiteLineage()
    lineage.record(1, A, **COUNTS, trained=1)
    lineage.record(1, A, **COUNTS, trained=2, scored=1)
    line = lineage.record(1, B, train=[2, 2], test=[1, 1], trained=3, scored=2)
    assert line == (
        f"site 1's data changed during the run: {A[:12]} (trained rounds 1-2, scored round 1) "
        f"became {B[:12]} (trained round 3, scored round 2)"
    )
    assert lineage.record(1, B, train=[2, 2], test=[1, 1], scored=3) is None  # said once
    assert [seen["sha256"] for seen in lineage.to_json()["1"]] == [A, B]
    assert lineage.to_json()["1"][1]["train"] == [2, 2]
    assert lineage.changed() == [1]


def test_a_resumed_runs_part_continues_the_earlier_record() -> None:
    earlier = SiteLineage()
    earlier.record(0, A, **COUNTS, trained=1)
    later = SiteLineage()
    later.record(0, A, **COUNTS, trained=2, scored=1)
    later.record(1, B, **COUNTS, trained=2, scored=1)
    merged = SiteLineage.from_json(earlier.to_json())
    merged.extend(later)
    assert merged.to_json()["0"] == [{"sha256": A, **COUNTS, "trained": [1, 2], "scored": [1]}]
    assert merged.changed() == []
    resumed_on_new_data = SiteLineage()
    resumed_on_new_data.record(0, B, **COUNTS, trained=3, scored=2)
    merged.extend(resumed_on_new_data)
    assert merged.changed() == [0]
    assert [seen["trained"] for seen in merged.to_json()["0"]] == [[1, 2], [3]]


def test_the_majority_share_pools_the_sites_held_out_counts() -> None:
    lineage = SiteLineage()
    lineage.record(0, A, train=[5, 5], test=[3, 1], trained=1)
    lineage.record(1, B, train=[5, 5], test=[1, 3], trained=1)
    lineage.record(2, B, train=[5, 5], test=[4, 0], trained=1)
    assert lineage.test_majority_share() == pytest.approx(8 / 12)
    assert SiteLineage().test_majority_share() is None
