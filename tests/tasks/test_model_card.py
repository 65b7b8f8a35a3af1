"""The card's training section from a run's trail: exclusions, and each site's
contribution where the sites validated (site_validation)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from config.params import Params
from federated.data import dataset_info
from tasks.model_card import build_card, card_markdown
from tasks.reports import ProjectPaths

RUN = {"name": "fedsieve-breastmnist", "version": "1", "run_id": "abc", "tags": {}}


def write_trail(paths: ProjectPaths, rows: list[dict[str, object]]) -> None:
    paths.exclusions.parent.mkdir(parents=True)
    with paths.exclusions.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_each_sites_mean_contribution_is_on_the_card(tmp_path: Path) -> None:
    paths = ProjectPaths(tmp_path)
    # site-c measured in round 1 only (banned, then not judged); site-a twice
    write_trail(paths, [
        {"round": 1, "client": 0, "site": "site-a", "excluded": False, "reason": "", "contribution": 0.25},
        {"round": 1, "client": 2, "site": "site-c", "excluded": True, "reason": "site_validation", "contribution": -0.5},
        {"round": 2, "client": 0, "site": "site-a", "excluded": False, "reason": "", "contribution": 0.75},
        {"round": 2, "client": 2, "site": "site-c", "excluded": True, "reason": "site_validation", "contribution": "nan"},
    ])  # fmt: skip
    params = Params.model_validate(
        {"filters": [{"name": "site_validation"}], "partition": {"local_test": 0.2}}
    )

    card = build_card(params, paths, {"rounds": 2}, RUN, dataset_info("breastmnist"))

    exclusions = card["training"]["exclusions"]
    assert exclusions["contribution"] == {
        "site-a": {"mean": pytest.approx(0.5), "rounds": 2},
        "site-c": {"mean": pytest.approx(-0.5), "rounds": 1},
    }
    text = card_markdown(card)
    assert "- site-a: +0.5000 over 2 rounds" in text
    assert "- site-c: -0.5000 over 1 rounds" in text


def test_without_validation_the_card_says_nothing_of_contributions(tmp_path: Path) -> None:
    paths = ProjectPaths(tmp_path)
    write_trail(paths, [{"round": 1, "client": 0, "excluded": False, "reason": ""}])

    card = build_card(Params(), paths, {"rounds": 1}, RUN, dataset_info("breastmnist"))

    assert card["training"]["exclusions"]["contribution"] == {}
    assert "Contribution per site" not in card_markdown(card)
