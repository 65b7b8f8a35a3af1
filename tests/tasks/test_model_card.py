"""The model card of a federation of real sites names each site as the plan does, in the
worst and best site and in a table of held-out counts and scores per site."""

from __future__ import annotations

import json
from pathlib import Path

from config.dataset import dataset_info_of
from config.params import validate_params
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
