"""The FedLag paper's Table 1, tested (benchmarks/papers/fedlag_table1.py): its per-run
records read (the clean part's and the attacked part's), a halted run scored as a model
that learnt nothing, the per-seed values the ``table1`` claims pair, and the tables of
docs/results.md."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from benchmarks.evidence.tables.records import Row
from benchmarks.papers.fedlag_table1 import (
    ATTACKED,
    ATTACKED_RECORD,
    ATTACKED_REGIME,
    DATASETS,
    METHODS,
    RECORD,
    REGIMES,
    ROBUST_FEDADAM,
    ROUNDS,
    TARGETS,
)

# a measure -> (its column in the record, what the tables call it)
MEASURES = {
    "acc": ("test_acc", "final test accuracy"),
    "auc": ("test_auc", "final test AUC"),
    "worst_site": ("site_acc_worst", "worst site's accuracy"),
    "rounds": ("rounds_to_target", "rounds to target"),
}
NEVER = ROUNDS + 1  # rounds to target of a run that never reached it (or halted)
WORST = "worst"  # a claim's attack that takes, per dataset and seed, the lower of ATTACKED


def record_of(part: str) -> Path:
    """A part's per-run record (``clean`` or ``attacked``), read where it is at call time."""
    if part not in ("clean", "attacked"):
        raise ValueError(f"part {part!r}; allowed: clean, attacked")
    return RECORD if part == "clean" else ATTACKED_RECORD


def table1_rows(part: str = "clean") -> list[Row]:
    """The part's record's runs, numbers as numbers; a halted run (an error) scored at
    chance: accuracy and worst site at its dataset's test majority share, AUC 0.5, the
    target never reached. A run that never reached its target counts :data:`NEVER` rounds."""
    with record_of(part).open(newline="") as handle:
        rows: list[Row] = list(csv.DictReader(handle))
    majority: dict[str, float] = {}
    for row in rows:
        row["seed"] = int(row["seed"])
        if not row["error"]:
            for key in ("test_acc", "test_auc", "site_acc_worst", "majority_share"):
                row[key] = float(row[key])
            row["rounds_to_target"] = int(row["rounds_to_target"])
            majority.setdefault(row["dataset"], row["majority_share"])
    for row in rows:
        if row["error"]:
            share = majority[row["dataset"]]
            row |= {"test_acc": share, "site_acc_worst": share, "test_auc": 0.5,
                    "rounds_to_target": NEVER}  # fmt: skip
        elif row["rounds_to_target"] < 0:
            row["rounds_to_target"] = NEVER
    return rows


def table1_by_seed(
    rows: list[Row], regime: str, method: str, measure: str, attack: str = "none"
) -> dict[tuple[str, int], float]:
    """One method's ``measure`` in ``regime`` under ``attack`` keyed ``(dataset, seed)``, as
    :func:`tasks.statistics.seed_difference` pairs them (per seed, the mean over the
    datasets both have). ``drop``: the accuracy lost from IID to ``regime``. Attack
    :data:`WORST`: per dataset and seed the lower of the attacks of ``ATTACKED`` (where
    both ran)."""
    if attack == WORST:
        each = [table1_by_seed(rows, regime, method, measure, a) for a in ATTACKED]
        return {key: min(e[key] for e in each) for key in each[0] if all(key in e for e in each)}
    if measure == "drop":
        iid = table1_by_seed(rows, "iid", method, "acc")
        there = table1_by_seed(rows, regime, method, "acc")
        return {key: iid[key] - value for key, value in there.items() if key in iid}
    column = MEASURES[measure][0]
    return {
        (r["dataset"], r["seed"]): float(r[column])
        for r in rows
        if (r["regime"], r["method"], r["attack"]) == (regime, method, attack)
    }


def claim_attacks(claim: dict[str, Any]) -> tuple[str, str]:
    """The attacks a ``table1`` claim reads its first and second method under: its
    ``first_attack`` and ``second_attack`` (each ``none`` unless named)."""
    return claim.get("first_attack", "none"), claim.get("second_attack", "none")


def table1_complete(claim: dict[str, Any]) -> bool:
    """Whether the claim's part's record holds every run a ``table1`` claim pairs: both
    methods under their attacks (both of :data:`ATTACKED` for :data:`WORST`) on every
    dataset and seed of the claim, in its regime (and IID for ``drop``)."""
    if not record_of(claim.get("part", "clean")).exists():
        return False
    first, last = claim.get("seeds", [0, 9])
    regimes = {claim["regime"], "iid"} if claim["measure"] == "drop" else {claim["regime"]}
    sides = list(zip((claim["first"], claim["second"]), claim_attacks(claim), strict=True))
    wanted = {(d, r, m, a, s) for d in DATASETS for r in regimes for m, attack in sides
              for a in (ATTACKED if attack == WORST else (attack,))
              for s in range(first, last + 1)}  # fmt: skip
    ran = {(r["dataset"], r["regime"], r["method"], r["attack"], r["seed"])
           for r in table1_rows(claim.get("part", "clean"))}  # fmt: skip
    return wanted <= ran


def _halted_lines(rows: list[Row]) -> list[str]:
    halted: dict[str, list[str]] = {}
    for r in rows:
        if r["error"]:
            where = f"{r['dataset']} at {r['regime']}, seed {r['seed']}"
            halted.setdefault(r["error"], []).append(where)
    count = sum(len(where) for where in halted.values())
    lines = [
        f"Runs that halted, scored at chance as the claims count them: {count} of {len(rows)}."
    ]
    for error, where in halted.items():
        lines.append(f"- {len(where)} runs: {error} ({'; '.join(sorted(set(where)))})")
    return lines


def _seeds(rows: list[Row]) -> str:
    """The runs per dataset in brackets: one count where every dataset has as many."""
    counts = [sum(1 for r in rows if r["dataset"] == d) for d in DATASETS]
    return f"[{counts[0]}]" if len(set(counts)) == 1 else f"[{' / '.join(map(str, counts))}]"


def _mean(values: list[float], digits: int = 3) -> str:
    return f"{sum(values) / len(values):.{digits}f}" if values else "–"


def table1_block() -> str:
    """Per measure, regime and method, the mean over seeds on each dataset (no attack),
    with the seed count; rounds to target counts a run that never reached it as
    :data:`NEVER`."""
    rows = [r for r in table1_rows() if r["attack"] == "none"]
    lines = []
    targets = ", ".join(f"{d} {t:g}" for d, t in TARGETS.items())
    for measure, (column, label) in MEASURES.items():
        extra = f" (targets: {targets}; never reached: {NEVER})" if measure == "rounds" else ""
        digits = 1 if measure == "rounds" else 3
        lines += [
            f"{label[0].upper()}{label[1:]}{extra}, mean over seeds (runs per dataset in brackets), {' / '.join(DATASETS)}:",
            "",
        ]
        lines += ["| method | " + " | ".join(REGIMES) + " |", "|---" * (len(REGIMES) + 1) + "|"]
        for method in METHODS:
            cells = []
            for regime in REGIMES:
                own = [r for r in rows if (r["method"], r["regime"]) == (method, regime)]
                per = [
                    _mean([float(r[column]) for r in own if r["dataset"] == d], digits)
                    for d in DATASETS
                ]
                cells.append(f"{' / '.join(per)} {_seeds(own)}" if own else "–")
            if any(cell != "–" for cell in cells):
                lines.append(f"| {method} | {' | '.join(cells)} |")
        lines.append("")
    return "\n".join(lines + _halted_lines(rows)) + "\n"


def table1_attacked_block() -> str:
    """The attacked part at its regime: per measure (accuracy, AUC, worst site), method
    and attack (a fifth of the clients), the mean over seeds on each dataset, with the
    seed count; the rows without attack are the clean part's runs."""
    rows = table1_rows("attacked")
    attacks = ("none", *ATTACKED)
    lines = []
    for measure in ("acc", "auc", "worst_site"):
        column, label = MEASURES[measure]
        lines += [
            f"{label[0].upper()}{label[1:]} at {ATTACKED_REGIME}, a fifth of the clients "
            f"attacking, mean over seeds (runs per dataset in brackets), {' / '.join(DATASETS)}:",
            "",
            "| method | " + " | ".join(attacks) + " |",
            "|---" * (len(attacks) + 1) + "|",
        ]
        for method in (*METHODS, *ROBUST_FEDADAM):
            cells = []
            for attack in attacks:
                own = [r for r in rows if (r["method"], r["attack"]) == (method, attack)]
                per = [
                    _mean([float(r[column]) for r in own if r["dataset"] == d]) for d in DATASETS
                ]
                cells.append(f"{' / '.join(per)} {_seeds(own)}" if own else "–")
            if any(cell != "–" for cell in cells):
                lines.append(f"| {method} | {' | '.join(cells)} |")
        lines.append("")
    return "\n".join(lines + _halted_lines(rows)) + "\n"
