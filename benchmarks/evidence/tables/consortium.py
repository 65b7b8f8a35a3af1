"""A small consortium's defence (benchmarks/robustness/small_consortium.py): which filter, in front of
the median, takes a label flipper out of a few sites, and what it costs the honest ones.

The table is built from rows of the fields below, read off the record by
:func:`consortium_rows`: a record that holds ``rows`` of these fields is read as it is,
and the record written before them (``by_size``, per filter) is read into them."""

from __future__ import annotations

from typing import Any

from benchmarks.evidence.tables.cells import table
from benchmarks.evidence.tables.records import results_json

RECORD = "small-consortium-cpu"
# A row: dataset, sites, attack, defence, seeds, caught_seeds (seeds with every flipper
# out), median_round (the round the last was out, median over those seeds),
# false_exclusions (honest client-rounds excluded, mean over seeds), and where recorded
# honest_banned_seeds and test_acc_mean
FIELDS = ("dataset", "sites", "attack", "defence", "seeds", "caught_seeds", "median_round",
          "false_exclusions")  # fmt: skip


def consortium_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's rows, one per (sites, defence), with :data:`FIELDS`."""
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


def small_consortium_block() -> str:
    """Per size and filter: the seeds with every flipper out, the median round of it, the
    honest client-rounds excluded and, where recorded, the seeds with an honest site
    banned and the mean test accuracy; the filter the benchmark's rule recommends marked."""
    record = results_json(RECORD)
    recommended = {int(k): v for k, v in record.get("recommended", {}).items()}
    rows = consortium_rows(record)
    extra = [key for key in ("honest_banned_seeds", "test_acc_mean") if key in rows[0]]
    header = ("dataset", "sites", "attack", "filter", "every flipper out (seeds)",
              "by round (median)", "honest client-rounds excluded (mean)",
              *(("seeds with an honest site banned",) if "honest_banned_seeds" in extra else ()),
              *(("test ACC (mean, no interval: the record keeps no seeds)",)
                if "test_acc_mean" in extra else ()))  # fmt: skip
    body = []
    for row in rows:
        mark = " (recommended)" if recommended.get(row["sites"]) == row["defence"] else ""
        median = "–" if row["median_round"] is None else f"{row['median_round']:g}"
        cells = [row["dataset"], row["sites"], row["attack"], f"{row['defence']}{mark}",
                 f"{row['caught_seeds']} of {row['seeds']}", median,
                 f"{row['false_exclusions']:.1f}"]  # fmt: skip
        cells += [str(row["honest_banned_seeds"])] if "honest_banned_seeds" in extra else []
        cells += [f"{row['test_acc_mean']:.3f}"] if "test_acc_mean" in extra else []
        body.append(tuple(cells))
    return table(header, body)
