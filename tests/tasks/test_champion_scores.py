"""What the gate reads of the champion scored at the sites: an AUC the sites recorded,
even 0, is a score; only a missing one counts as unscored."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tasks.champion import scored_at_sites
from tasks.reports import ProjectPaths


def _scored(root: Path, candidate: float | None, champion: float | None) -> ProjectPaths:
    paths = ProjectPaths(root)
    paths.reports.mkdir(parents=True)
    paths.champion_at_sites.write_text(json.dumps({
        "run_id": "run-1", "version": "3",
        "candidate": {"auc": candidate}, "champion": {"auc": champion},
    }))  # fmt: skip
    return paths


def test_an_auc_of_zero_is_a_score_not_a_gap(tmp_path: Path) -> None:
    paths = _scored(tmp_path, candidate=0.0, champion=0.0)

    assert scored_at_sites(paths, "3", "run-1") == (0.0, 0.0, "")


def test_an_auc_no_site_recorded_is_unscored_with_its_reason(tmp_path: Path) -> None:
    paths = _scored(tmp_path, candidate=None, champion=None)

    candidate, champion, why = scored_at_sites(paths, "3", "run-1")

    assert math.isnan(candidate) and champion is None
    assert why == "no site scored it at the run's end"
