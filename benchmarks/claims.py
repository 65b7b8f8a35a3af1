"""The claims ledger: docs/results.md's readings cite a claim by its id (``[C3]``) for a
comparison they read as a finding, and ``benchmarks/claims.yaml`` holds for each claim the
record it rests on, the statistic, the test and the threshold the test must meet.
``python -m benchmarks.report --check`` recomputes every claim from the committed records
and fails naming each one that no longer holds, each id cited but not in the ledger, and
each claim no sentence cites.

Every claim of the ledger was written after the records it rests on, its threshold chosen
with them in view: the ledger's claims are regression guards, not confirmatory tests. The
confirmatory claims are pre-registered, in the same format, in benchmarks/preregistered.yaml
(:mod:`benchmarks.preregistration`).

Kinds (the fields each takes beside ``id``, ``text`` and ``kind``):

- ``worst_case``: ``record`` (a matrix, e.g. ``digits`` or ``digits-filters``),
  ``method``, ``fraction``, optional ``seeds`` (``[first, last]``), and ``at_least`` or
  ``at_most``: the method's worst case per seed over every attack at that fraction
  (halted runs at chance); holds when the 95 % t-interval over seeds lies entirely above
  ``at_least`` (below ``at_most``).
- ``better``: ``record``, ``first``, ``second``, ``fraction``, ``statistic`` (``worst``:
  the per-seed worst cases; ``mean``: the per-seed means over the attacks both ran),
  optional ``seeds``: ``first`` higher than ``second``, an exact sign-flip test over
  seeds, two-sided p < 0.05 (:func:`tasks.statistics.seed_difference`).
- ``drop``: ``record``, ``method``, ``attack``, ``fraction``: the attack lowers the
  method's headline metric, its run without attack minus its run under ``attack`` at
  ``fraction`` seed by seed, an exact sign-flip test over seeds, two-sided p < 0.05.
- ``ablation``: ``dataset``, ``first``, ``second``, ``outcome`` (``banning``: clean runs
  banning an honest client; ``caught``: attacked runs with every attacker out by round
  5), ``fewer`` or ``more``: on the held-out seeds of benchmarks/pid_made_ablation.py,
  ``first`` has the outcome in fewer (more) seeds than ``second``, exact McNemar p < 0.05.
- ``at_most_seeds``: ``dataset``, ``variant``, ``outcome``, ``held_out`` (bool), ``k``: the
  outcome happened in at most k of the ablation's seeds of that group.
- ``stability``: ``alpha``, ``first``, ``second``, ``measure`` (``acc``: final test
  accuracy; ``wobble``: its standard deviation over the last rounds), ``higher`` or
  ``lower`` (true): in benchmarks/fedlag_stability.py's record at that Dirichlet α,
  ``first``'s measure is higher (lower) than ``second``'s, an exact sign-flip test over
  seeds, two-sided p < 0.05.

A ``better`` or ``stability`` claim read off a paired table of docs/results.md names it:
``table`` (a block of :data:`benchmarks.tables.paired_tables.PAIRED_TABLES`) and ``row``
(the table's value column, e.g. ``"0.1"`` or ``"0.1, ACC"``). Its p is then the table's
Holm-adjusted one, within the family the table adjusts over, so a claim is never surer than
the table it is read from.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks import pid_made_ablation
from benchmarks.tables.fedlag import fedlag_by_seed
from benchmarks.tables.paired_tables import PAIRED_TABLES, paired_table
from benchmarks.tables.pid_made import ablation_outcomes, ablation_rows
from benchmarks.tables.records import HEADLINE, load, results_json, with_halts
from benchmarks.tables.robustness_matrix import worst_by_seed, worst_differences
from tasks.comparison import interval
from tasks.statistics import exact_mcnemar, seed_difference, smallest_p

LEDGER = Path(__file__).resolve().parent / "claims.yaml"
ALPHA = 0.05
CITATION = re.compile(r"\[(C\d+(?:,\s+C\d+)*)\]")  # [C3] or [C3, C4], wrapped or not


class LedgerError(ValueError):
    """A claims ledger that cannot be checked: its message is one line naming the claim."""


@dataclass(frozen=True)
class Verdict:
    """A claim recomputed: the statistic as shown, and whether its test passed."""

    claim: str
    text: str
    statistic: str
    test: str
    holds: bool


def load_ledger(path: Path = LEDGER) -> list[dict[str, Any]]:
    try:
        claims = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise LedgerError(f"{path.name}: not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(claims, list) or not all(
        isinstance(c, dict) and {"id", "kind", "text"} <= c.keys() for c in claims
    ):
        raise LedgerError(f"{path.name}: must be a list of claims, each with id, text and kind")
    ids = [c["id"] for c in claims]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise LedgerError(
            f"{path.name}: claim ids must be unique, got {', '.join(duplicated)} twice"
        )
    for claim in claims:
        if claim["kind"] not in KINDS:
            raise LedgerError(
                f"{path.name}: claim {claim['id']} has kind {claim['kind']!r}; "
                f"allowed: {', '.join(KINDS)}"
            )
        if "table" in claim and (claim["table"] not in PAIRED_TABLES or "row" not in claim):
            raise LedgerError(
                f"{path.name}: claim {claim['id']} names table {claim['table']!r} "
                f"(with its row); allowed: {', '.join(PAIRED_TABLES)}"
            )
    return claims


def seeds_of(claim: dict[str, Any]) -> range | None:
    if "seeds" not in claim:
        return None
    first, last = claim["seeds"]
    return range(first, last + 1)


def _matrix(claim: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    rows = with_halts(load(claim["record"]))
    seeds = seeds_of(claim)
    if seeds is not None:
        rows = [r for r in rows if int(r["seed"]) in seeds]
    dataset = claim["record"].split("-")[0]
    return rows, HEADLINE[dataset]


def worst_case(claim: dict[str, Any]) -> Verdict:
    rows, metric = _matrix(claim)
    worst, _, _ = worst_by_seed(rows, claim["method"], claim["fraction"], metric)
    mean, _, half = interval(list(worst.values()))
    half = 0.0 if math.isnan(half) else half
    if "at_least" in claim:
        bound, holds, test = mean - half, mean - half >= claim["at_least"], "≥"
        threshold = claim["at_least"]
    else:
        bound, holds, test = mean + half, mean + half <= claim["at_most"], "≤"
        threshold = claim["at_most"]
    return Verdict(
        claim["id"], claim["text"], f"{mean:.3f} ± {half:.3f} [{len(worst)} seeds]",
        f"95 % bound {bound:.3f} {test} {threshold:g}", bool(holds) and not math.isnan(mean),
    )  # fmt: skip


def _holm_in_table(claim: dict[str, Any], p: float) -> tuple[float, int]:
    """The claim's test as its paired table adjusts it: the Holm p within its family and
    the family's size. The table must test the same records (its raw p equals ``p``)."""
    paired = paired_table(claim["table"])
    pair = {claim["first"], claim["second"]}
    tested = pair - {paired.reference}  # one method left only when the other is the reference
    index = paired.index_of(tested.pop(), claim["row"]) if len(tested) == 1 else None
    if index is None:
        raise ValueError(
            f"claim {claim['id']}: {claim['table']} has no row {claim['row']!r} comparing "
            f"{' with '.join(sorted(pair))}"
        )
    raw = paired.tests[index][2][1]
    if not math.isclose(raw, p):
        raise ValueError(
            f"claim {claim['id']}: its p is {p:.3g} but row {claim['row']!r} of "
            f"{claim['table']} has {raw:.3g}; they must test the same records"
        )
    return paired.holm()[index], paired.family_size(index)


def _seed_verdict(
    claim: dict[str, Any], measure: str, differences: Any, p: float, higher: bool
) -> Verdict:
    """A paired claim's verdict: the mean per-seed difference in the claimed direction
    and the exact sign-flip p below 0.05, Holm-adjusted where a table is named."""
    mean = float(differences.mean()) if len(differences) else math.nan
    test = f"sign-flip p = {p:.3g}"
    if "table" in claim:
        p, family = _holm_in_table(claim, p)
        test += f", Holm over {family} tests of {claim['table']} = {p:.3g}"
    return Verdict(
        claim["id"], claim["text"], f"Δ {measure} = {mean:+.3f} over {len(differences)} seeds",
        f"{test} < {ALPHA:g} (smallest possible {smallest_p(len(differences)):.3g})",
        bool((mean > 0 if higher else mean < 0) and p < ALPHA),
    )  # fmt: skip


def better(claim: dict[str, Any]) -> Verdict:
    rows, metric = _matrix(claim)
    if claim["statistic"] == "worst":
        differences, p = worst_differences(
            rows, claim["first"], claim["second"], claim["fraction"], metric
        )
    else:
        first, second = (
            {(r["attack"], int(r["seed"])): r[metric] for r in rows
             if r["method"] == m and r["fraction"] == claim["fraction"] and r["attack"] != "none"}
            for m in (claim["first"], claim["second"])
        )  # fmt: skip
        differences, p = seed_difference(first, second)
    return _seed_verdict(claim, claim["statistic"], differences, p, higher=True)


def drop(claim: dict[str, Any]) -> Verdict:
    rows, metric = _matrix(claim)
    clean, attacked = (
        {(claim["method"], int(r["seed"])): r[metric] for r in rows
         if r["method"] == claim["method"] and r["attack"] == attack
         and (attack == "none" or r["fraction"] == claim["fraction"])}
        for attack in ("none", claim["attack"])
    )  # fmt: skip
    differences, p = seed_difference(clean, attacked)
    return _seed_verdict(claim, f"drop under {claim['attack']}", differences, p, higher=True)


def ablation(claim: dict[str, Any]) -> Verdict:
    rows = [r for r in ablation_rows() if int(r["seed"]) not in pid_made_ablation.TUNED_ON]
    outcome = claim["outcome"]
    first = ablation_outcomes(rows, claim["first"], claim["dataset"])[outcome]
    second = ablation_outcomes(rows, claim["second"], claim["dataset"])[outcome]
    only_first, only_second, p = exact_mcnemar(first, second)
    direction = only_first < only_second if "fewer" in claim else only_first > only_second
    return Verdict(
        claim["id"], claim["text"],
        f"{sum(first.values())}/{len(first)} against {sum(second.values())}/{len(second)} "
        f"held-out seeds ({only_first} / {only_second} discordant)",
        f"exact McNemar p = {p:.3g} < {ALPHA:g}", bool(direction and p < ALPHA),
    )  # fmt: skip


def at_most_seeds(claim: dict[str, Any]) -> Verdict:
    held_out = bool(claim["held_out"])
    rows = [r for r in ablation_rows()
            if (int(r["seed"]) not in pid_made_ablation.TUNED_ON) == held_out]  # fmt: skip
    events = ablation_outcomes(rows, claim["variant"], claim["dataset"])[claim["outcome"]]
    count = sum(events.values())
    return Verdict(
        claim["id"], claim["text"], f"{count} of {len(events)} seeds",
        f"≤ {claim['k']}", bool(events) and count <= claim["k"],
    )  # fmt: skip


def stability(claim: dict[str, Any]) -> Verdict:
    key = {"acc": "acc", "wobble": "last_rounds_acc_std"}[claim["measure"]]
    rows = results_json("fedlag-stability")["rows"]
    first, second = (
        fedlag_by_seed(rows, claim["alpha"], m, key) for m in (claim["first"], claim["second"])
    )
    differences, p = seed_difference(first, second)
    return _seed_verdict(claim, claim["measure"], differences, p, bool(claim.get("higher")))


KINDS: dict[str, Callable[[dict[str, Any]], Verdict]] = {
    "worst_case": worst_case,
    "better": better,
    "drop": drop,
    "ablation": ablation,
    "at_most_seeds": at_most_seeds,
    "stability": stability,
}


def verdicts(path: Path = LEDGER) -> list[Verdict]:
    """Every claim recomputed; a claim missing a field its kind needs, or naming a row
    its table lacks, raises a one-line ValueError naming the ledger and the claim."""
    found = []
    for claim in load_ledger(path):
        try:
            found.append(KINDS[claim["kind"]](claim))
        except KeyError as missing:
            raise LedgerError(
                f"{path.name}: claim {claim['id']} ({claim['kind']}) lacks the field {missing}"
            ) from None
        except ValueError as error:
            raise LedgerError(f"{path.name}: {error}") from None
    return found


def citation_problems(text: str, claims: list[dict[str, Any]]) -> list[str]:
    """Ids cited in ``text`` that the ledger lacks, and claims ``text`` never cites."""
    cited = {i for group in CITATION.findall(text) for i in re.split(r",\s+", group)}
    known = {c["id"] for c in claims}
    problems = [f"{i} is cited but not in the ledger" for i in sorted(cited - known)]
    problems += [f"{i} is in the ledger but no sentence cites it" for i in sorted(known - cited)]
    return problems
