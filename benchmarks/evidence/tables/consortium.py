"""A small consortium's defence (benchmarks/robustness/small_consortium.py): which
defence, in front of the median, takes an attacking site out of a few sites, and what it
costs the honest ones; and the recommendation per size with the datasets behind it.

The tables are built from rows of the fields below, read off the record by
:func:`consortium_rows`: a record that holds ``rows`` of these fields is read as it is,
and the record written before them (``by_size``, per filter) is read into them."""

from __future__ import annotations

from typing import Any

import yaml

from benchmarks.evidence.tables.cells import table
from benchmarks.evidence.tables.records import RESULTS, results_json

RECORD = "small-consortium-cpu"
CNN_RECORD = "small-consortium-cnn-cpu"  # params.yaml's model: the family small-consortium-cnn
# the records, one per model, in the order the recommendation's table shows them, and
# what each model's training was
MODELS = {
    RECORD: "logreg (the robustness matrix's training: batch 16)",
    CNN_RECORD: "small_cnn (params.yaml's model and training)",
}
# A row: dataset, sites, attack, defence, seeds, caught_seeds (seeds with every attacker
# out), median_round (the round the last was out, median over those seeds),
# false_exclusions (honest client-rounds excluded, mean over seeds), and where recorded
# caught_by_round_seeds, honest_banned_seeds and test_acc_mean
FIELDS = ("dataset", "sites", "attack", "defence", "seeds", "caught_seeds", "median_round",
          "false_exclusions")  # fmt: skip


def consortium_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's rows, one per (dataset, sites, attack, defence), with :data:`FIELDS`."""
    if "rows" in record:
        return list(record["rows"])
    settings = record["settings"]
    return [
        {
            "dataset": settings["data"], "sites": int(sites), "attack": "label_flip",
            "defence": defence, "seeds": cell["seeds"],
            "caught_seeds": cell["flippers_out_in_seeds"],
            "median_round": cell["flippers_out_by_round_median"],
            "false_exclusions": cell["honest_client_rounds_excluded_mean"],
            "honest_banned_seeds": cell["seeds_with_honest_banned"],
            "test_acc_mean": cell["test_acc_mean"],
        }
        for sites, defences in record["by_size"].items()
        for defence, cell in defences.items()
    ]  # fmt: skip


def recommendations(record: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The recommendation per size: ``defence``, and where recorded the datasets where it
    holds against the label flipper (``holds_on``) and where it does not (``fails_on``)."""
    found = record.get("recommended", {})
    return {
        int(sites): choice if isinstance(choice, dict) else {"defence": choice}
        for sites, choice in found.items()
    }


def small_consortium_block(name: str = RECORD) -> str:
    """Per dataset, size, attack and defence of record ``name``: the seeds with the
    attacker out, those with it out by the rule's round, the median round, the honest
    client-rounds excluded and, where recorded, the seeds with an honest site banned and
    the mean test accuracy; the defence the benchmark's rule recommends per size marked."""
    record = results_json(name)
    recommended = {s: c["defence"] for s, c in recommendations(record).items()}
    rows = consortium_rows(record)
    by_round = record["settings"].get("by_round")
    optional = {
        "caught_by_round_seeds": f"attacker out by round {by_round} (seeds)",
        "honest_banned_seeds": "seeds with an honest site banned",
        "test_acc_mean": "test ACC (mean, no interval: the record keeps no seeds)",
    }
    extra = [key for key in optional if key in rows[0]]
    header = ("dataset", "sites", "attack", "defence", "attacker out (seeds)",
              "by round (median)", "honest client-rounds excluded (mean)",
              *(optional[key] for key in extra))  # fmt: skip
    body = []
    for row in rows:
        mark = " (recommended)" if recommended.get(row["sites"]) == row["defence"] else ""
        median = "–" if row["median_round"] is None else f"{row['median_round']:g}"
        excluded = row["false_exclusions"]
        cells = [row["dataset"], row["sites"], row["attack"], f"{row['defence']}{mark}",
                 f"{row['caught_seeds']} of {row['seeds']}", median,
                 "–" if excluded is None else f"{excluded:.1f}"]  # fmt: skip
        for key in extra:
            value = row[key]
            if key == "test_acc_mean":
                cells.append("–" if value is None else f"{value:.3f}")
            elif key == "caught_by_round_seeds":
                cells.append(f"{value} of {row['seeds']}")
            else:
                cells.append(str(value))
        body.append(tuple(cells))
    missing = record.get("not_run")
    if not missing:
        return table(header, body)
    return table(header, body) + (
        f"\nNot run (the grid stopped at its registered time; dataset/sites/attack/defence): "
        f"{', '.join(missing)}.\n"
    )


def recommendation_block() -> str:
    """docs/configuration.md's table: per model and size, the recommended defence, the
    datasets its rule saw it hold on against the label flipper and those it did not, and
    what it did there (out by the rule's round, seeds with an honest site banned), from
    each model's record (a model's recommendation holds for that model only)."""
    body = []
    for name, model in MODELS.items():
        if (RESULTS / f"{name}.json").exists():
            body += _recommended_rows(results_json(name), model)
    header = ("model", "sites", "use (in front of `median`)",
              "holds against one label flipper on", "does not hold on",
              "the label flipper, as measured")  # fmt: skip
    return table(header, body)


def _recommended_rows(record: dict[str, Any], model: str) -> list[tuple[Any, ...]]:
    rows = consortium_rows(record)
    by_round = record["settings"].get("by_round")
    body = []
    for sites, choice in sorted(recommendations(record).items()):
        defence = choice["defence"]
        flipper = [r for r in rows if r["sites"] == sites and r["defence"] == defence
                   and r["attack"] == "label_flip"]  # fmt: skip
        measured = "; ".join(
            f"{r['dataset']}: out by round {by_round} in {r['caught_by_round_seeds']} of "
            f"{r['seeds']}, an honest site banned in {r['honest_banned_seeds']}"
            for r in flipper
            if "caught_by_round_seeds" in r
        )
        holds = ", ".join(choice.get("holds_on", [])) or "none"
        fails = ", ".join(choice.get("fails_on", [])) or "none"
        spec = record["settings"].get("defences", {}).get(defence)
        flow = yaml.safe_dump(spec, default_flow_style=True, sort_keys=False, width=1000).strip()
        use = (
            "the median alone: `filters: []` (no measured filter holds)"
            if defence == "median"
            else f"{defence}: `filters: {flow}`"
        )
        held_out = record["settings"].get("held_out", {}).get(defence)
        use += f", `partition.local_test: {held_out}`" if held_out else ""
        body.append((model, sites, use, holds, fails, measured or "–"))
    return body


PILOT_RECORD = "consortium-pilot-cpu"


def pilot_block() -> str:
    """benchmarks/sites/consortium_pilot.py's record: per seed, the round the flipping
    hospital was out at real sites on loopback, the honest sites excluded, the final test
    AUC pooled at the sites; then the seeds with it out by the rule's round and with an
    honest site banned."""
    record = results_json(PILOT_RECORD)
    settings, summary = record["settings"], record["summary"]
    flipper, by_round = settings["flipper"], settings["by_round"]
    body = [
        (run["seed"], run["flipper_out_round"] or "never",
         ", ".join(run["honest_banned"]) or "none",
         "–" if run["test_auc"] is None else f"{run['test_auc']:.3f}")
        for run in record["runs"]
    ]  # fmt: skip
    header = ("seed", f"{flipper} out in round", "honest sites excluded",
              "final test AUC (pooled at the sites)")  # fmt: skip
    return table(header, body) + (
        f"\n{settings['defence']} in front of the median, {settings['model']}, "
        f"{settings['rounds']} rounds: {flipper} out by round {by_round} in "
        f"{summary['flipper_out_by_round_3_seeds']} of {summary['seeds']} seeds, an honest site "
        f"excluded in {summary['honest_banned_seeds']}.\n"
    )
