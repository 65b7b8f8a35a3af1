"""docs/results.md's robustness tables are the committed per-seed records, recomputed:
none is typed by hand, and a table that no longer matches its records fails here."""

from __future__ import annotations

import pytest

from benchmarks import report


def test_every_generated_block_of_the_results_matches_its_records():
    text = report.DOC.read_text()
    names = report.BLOCK.findall(text)
    assert {name for _, name, *_ in names} == set(report.BLOCKS)  # every table is there

    _, changed = report.regenerated(text)

    assert changed == [], f"stale: {changed}; run python -m benchmarks.report"


def test_a_hand_edit_inside_a_block_is_caught_and_an_unknown_block_refused():
    text = report.DOC.read_text()
    name = next(iter(report.BLOCKS))
    start = text.index(f"<!-- report:{name} -->\n") + len(f"<!-- report:{name} -->\n")
    edited = text[:start] + "| typed | 0.99 |\n" + text[start:]

    fixed, changed = report.regenerated(edited)

    assert changed == [name] and fixed == text
    with pytest.raises(KeyError, match="unknown generated block 'nope'"):
        report.regenerated("<!-- report:nope -->\nx\n<!-- /report:nope -->")
