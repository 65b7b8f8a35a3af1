"""``fedsieve explain --round R --client C``: why a client counted less in a round, in one
screen, read from the exclusion trail (``reports/exclusions.csv``, or a comparison cell's
with ``--cell``). At real sites (``federation.runtime: flower``) the trail names each
site, ``--site NAME`` picks one, and the explanation names it: there is no ground truth
about who is malicious there, so none is printed.

It says whether the client was left out and by what (screen, non-finite update, filter,
a selecting rule), the weight it effectively received against the round's average, and
every per-client value the filters, pre-aggregators and rule recorded for it, each beside
the round's median and the client's rank among the round's clients. Under validation at
the sites that includes its votes, its contribution, its held-out count and its loss of
each candidate (``val_loss``, ``val_loss_without_<id>``).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from pathlib import Path

from config.errors import OpsError

__all__ = ["add_explain_arguments", "explain", "explain_row"]

# the trail's identity and decision columns; every other numeric column is a measurement
IDENTITY = (
    "round", "client", "site", "num_samples", "malicious", "excluded", "reason", "message",
)  # fmt: skip
REASONS = {
    "noniid_loss": "left out before training by the non-IID screen: its loss on the global "
    "model was an outlier (z-score above noniid.z)",
    "client_error": "its local training failed or the site refused the task",
    "client_timeout": "no reply came within federation.round_timeout",
    "client_unavailable": "the site was not connected (its SuperNode offline)",
    "bad_update": "its update had the wrong shape or type",
    "non_finite": "its update held NaN or Inf and never reached the model",
}


def add_explain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--round", type=int, required=True, help="the round (1-based)")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--client", type=int, help="the client id")
    who.add_argument("--site", help="the site's name (runs at real sites)")
    parser.add_argument("--cell", help="a comparison cell's trail (artifacts/compare/<cell>)")
    parser.add_argument("--trail", type=Path, help="a trail file (default reports/exclusions.csv)")


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text not in (None, "") else None
    except ValueError:
        return None
    return None if value is None or math.isnan(value) else value


def _decision(row: dict[str, str]) -> str:
    reason = row.get("reason", "")
    if row.get("excluded") == "True":
        if reason in REASONS:
            return f"excluded: {REASONS[reason]}" + (
                f" ({row['message']})" if row.get("message") else ""
            )
        votes, voters = _number(row.get("votes")), _number(row.get("voters"))
        if reason == "site_validation" and votes is not None and voters is not None:
            return (
                f"excluded by the filter site_validation: {votes:.0f} of the {voters:.0f} other "
                "sites found the round's aggregate better without it on their held-out splits"
                + (f" ({row['message']})" if row.get("message") else "")
            )
        score, threshold = _number(row.get("score")), _number(row.get("threshold"))
        compared = (
            f": score {score:.4g} above the threshold {threshold:.4g}"
            if score is not None and threshold is not None
            else ""
        )
        return f"excluded by the filter {reason}{compared}"
    if row.get("selected") == "False":
        return "kept by the filters, but not selected by the aggregation rule"
    return "kept: its update reached the aggregation rule"


def explain_row(row: dict[str, str], round_rows: list[dict[str, str]]) -> str:
    """The explanation of one trail row among its round's rows."""
    samples = f"{row.get('num_samples', '?')} samples"
    if row.get("site"):  # a real site: no ground truth
        header = f"round {row['round']}, site {row['site']} ({samples})"
    else:
        malicious = "yes" if row.get("malicious") == "True" else "no"
        header = f"round {row['round']}, client {row['client']} ({samples}; malicious in truth: {malicious})"
    lines = [header, _decision(row)]
    weight = _number(row.get("effective_weight"))
    if weight is not None:
        counted = [w for r in round_rows if (w := _number(r.get("effective_weight"))) is not None]
        lines.append(
            f"weight in the aggregate: {weight:.4f} (round average {sum(counted) / len(counted):.4f} "
            f"over {len(counted)} clients)"
        )
    votes, voters = _number(row.get("votes")), _number(row.get("voters"))
    if votes is not None and voters is not None and row.get("excluded") != "True":
        lines.append(
            f"validation at the sites: {votes:.0f} of the {voters:.0f} other sites voted against it"
        )
    columns = [k for k in row if k not in IDENTITY and k not in ("effective_weight", "selected")]
    for name in columns:
        value = _number(row.get(name))
        if value is None:
            continue
        others = [v for r in round_rows if (v := _number(r.get(name))) is not None]
        rank = 1 + sum(v > value for v in others)
        lines.append(
            f"  {name}: {value:.4g} (round median {statistics.median(others):.4g}; "
            f"rank {rank} of {len(others)}, highest first)"
        )
    return "\n".join(lines)


def explain(args: argparse.Namespace, workdir: Path) -> int:
    trail = args.trail or (
        workdir / "artifacts" / "compare" / args.cell / "reports" / "exclusions.csv"
        if args.cell
        else workdir / "reports" / "exclusions.csv"
    )
    if not trail.exists():
        raise OpsError(f"no exclusion trail at {trail}: run the pipeline (or the grid) first")
    with trail.open() as handle:
        trail_rows = list(csv.DictReader(handle))
    rows = [r for r in trail_rows if _number(r.get("round")) == args.round]
    if not rows:
        held = sorted({int(n) for r in trail_rows if (n := _number(r.get("round"))) is not None})
        if not held:
            raise OpsError(f"{trail} holds no round yet")
        rounds = f"rounds {held[0]} to {held[-1]}" if len(held) > 1 else f"round {held[0]}"
        raise OpsError(f"{trail} has no round {args.round}; it holds {rounds}")
    if args.site is not None:
        row = next((r for r in rows if r.get("site") == args.site), None)
    else:
        row = next((r for r in rows if _number(r.get("client")) == args.client), None)
    if row is None:
        asked = f"site {args.site}" if args.site is not None else f"client {args.client}"
        sampled = ", ".join(r.get("site") or r["client"] for r in rows)
        raise OpsError(f"{asked} was not sampled in round {args.round}; sampled: {sampled}")
    print(explain_row(row, rows))
    return 0
