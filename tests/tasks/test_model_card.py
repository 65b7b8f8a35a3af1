"""The model card: each site named as the plan names it, in the worst and best site and a
table of held-out counts and scores per site; the training section from a run's trail,
with each site's contribution where the sites validated (site_validation)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from config.dataset import dataset_info_of
from config.params import Params, validate_params
from federated.data import dataset_info
from tasks.model_card import build_card, card_markdown
from tasks.reports import ProjectPaths

HOSPITALS = ["hospital-a", "hospital-b", "hospital-c"]


def test_the_card_names_the_worst_and_best_site_and_gives_their_held_out_counts(
    tmp_path: Path,
) -> None:
    sites = [{"name": name, "node_id": k + 1, "samples": 100} for k, name in enumerate(HOSPITALS)]
    params = validate_params(
        {"data": {"dataset": "digits"}, "noniid": {"every": 0, "final": False},
         "eval": {"where": "sites"}, "federation": {"runtime": "flower", "sites": sites}},
        "params.yaml",
    )  # fmt: skip
    paths = ProjectPaths(tmp_path)
    paths.reports.mkdir()
    scored = [
        {"site": 0, "n": 31, "loss": 0.4, "acc": 0.9, "auc": 0.95},
        {"site": 1, "n": 17, "loss": 0.9, "acc": 0.6, "auc": 0.7},
        {"site": 2, "n": 24, "loss": 0.3, "acc": 0.95, "auc": 0.99},
    ]  # the sites' own scores of the final model, as reports/sites.json keeps them
    paths.sites_final.write_text(json.dumps({"site_worst": 1, "site_best": 2, "sites": scored}))
    results = {"test_auc": 0.9, "site_acc_worst": 0.6, "site_worst": 1, "site_acc_best": 0.95,
               "site_best": 2, "rounds": 3, "selected_round": 3}  # fmt: skip
    run = {"name": "fedsieve-digits", "version": "4", "run_id": "r", "tags": {}}

    card = build_card(params, paths, results, run, dataset_info_of(params.data))

    spread = card["performance"]["sites"]
    assert (spread["site_worst"], spread["site_best"]) == ("hospital-b", "hospital-c")
    assert card["performance"]["per_site"] == [
        {"site": "hospital-a", "held_out": 31, "acc": 0.9, "auc": 0.95},
        {"site": "hospital-b", "held_out": 17, "acc": 0.6, "auc": 0.7},
        {"site": "hospital-c", "held_out": 24, "acc": 0.95, "auc": 0.99},
    ]
    markdown = card_markdown(card)
    assert "- site_worst: hospital-b" in markdown and "- site_best: hospital-c" in markdown
    assert "| hospital-b | 17 | 0.6000 | 0.7000 |" in markdown


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


def test_a_volume_models_card_names_its_input_as_a_volume_with_size_and_spacing(
    tmp_path: Path,
) -> None:
    paths = ProjectPaths(tmp_path)
    write_trail(paths, [{"round": 1, "client": 0, "excluded": False, "reason": ""}])
    own = {"path": "x", "task": "binary-class", "classes": ["a", "b"], "spatial_dims": 3,
           "spacing": "stretch", "intensity": "window"}  # fmt: skip
    params = validate_params(
        {"data": {"dataset": "ct", "size": 32, "own": own}, "model": {"name": "small_cnn3d"},
         "tracking": {"register_model": False}}, "t",
    )  # fmt: skip

    card = build_card(params, paths, {"rounds": 1}, RUN, dataset_info_of(params.data))

    said = card_markdown(card)
    assert (
        "a volume: a NIfTI file, a multi-frame DICOM or a folder holding one DICOM series" in said
    )
    assert "at 32x32x32 voxels (spacing stretch, torch trilinear; intensity window)" in said
