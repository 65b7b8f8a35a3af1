"""The claims ledger: docs/results.md's readings cite a claim by its id (``[C3]``) for a
comparison they read as a finding, and ``benchmarks/claims.yaml`` holds for each claim the
record it rests on, the statistic, the test and the threshold the test must meet.
``python -m benchmarks.evidence.report --check`` recomputes every claim from the committed records
and fails naming each one that no longer holds, each id cited but not in the ledger, and
each claim no sentence cites.

Every claim of the ledger was written after the records it rests on, its threshold chosen
with them in view: the ledger's claims are regression guards, not confirmatory tests. The
confirmatory claims are pre-registered, in the same format, in benchmarks/preregistered.yaml
(:mod:`benchmarks.evidence.preregistration`).

Kinds (the fields each takes beside ``id``, ``text`` and ``kind``):

- ``worst_case``: ``record`` (a matrix, e.g. ``digits`` or ``digits-filters``),
  ``method``, ``fraction``, optional ``seeds`` (``[first, last]``), and ``at_least`` or
  ``at_most``: the method's worst case per seed over every attack at that fraction
  (halted runs at chance); holds when its 95 % logit-scale t-interval over seeds (a share:
  :func:`tasks.statistics.share_interval`) lies entirely above ``at_least`` (below
  ``at_most``).
- ``better``: ``record``, ``first``, ``second``, ``fraction``, ``statistic`` (``worst``:
  the per-seed worst cases; ``mean``: the per-seed means over the attacks both ran),
  optional ``seeds`` and ``lower`` (true): ``first`` higher (lower) than ``second``, an
  exact two-sided sign-flip test over seeds (:func:`tasks.statistics.seed_difference`),
  shown as ``first − second``.
- ``drop``: ``record``, ``method``, ``attack``, ``fraction``: the attack lowers the
  method's headline metric, its run without attack minus its run under ``attack`` at
  ``fraction`` seed by seed, an exact two-sided sign-flip test over seeds.
- ``ablation``: ``dataset``, ``first``, ``second``, ``outcome`` (``banning``: clean runs
  banning an honest client; ``caught``: attacked runs with every attacker out by round
  5), ``fewer`` or ``more``: on the held-out seeds of benchmarks/papers/pid_made_ablation.py,
  ``first`` has the outcome in fewer (more) seeds than ``second``, an exact McNemar test.
- ``at_most_seeds``: ``dataset``, ``variant``, ``outcome``, ``held_out`` (bool), ``k``: the
  outcome happened in at most k of the ablation's seeds of that group.
- ``consortium``: ``dataset``, ``sites``, ``attack``, ``defence`` (a defence of
  benchmarks/small_consortium.py, or ``recommended``: the one its pre-registered rule
  recommends at that size), ``caught_at_least`` or ``caught_at_most`` (k), optional
  ``honest_banned_at_most`` (m) and ``model`` (the family's model: ``logreg``, the
  default, or ``small_cnn``): in the small consortium's per-run record of that model, the seeds in
  which the attacker was out by the rule's round are at least (at most) k, and those with
  an honest site banned at most m; a count, no test.
- ``stability``: ``alpha``, ``first``, ``second``, ``measure`` (``acc``: final test
  accuracy; ``wobble``: its standard deviation over the last rounds), ``higher`` or
  ``lower`` (true): in benchmarks/papers/fedlag_stability.py's record at that Dirichlet α,
  ``first``'s measure is higher (lower) than ``second``'s, an exact two-sided sign-flip
  test over seeds.
- ``table1``: ``regime``, ``measure`` (``acc``, ``auc``, ``worst_site``: the worst site's
  accuracy, ``rounds``: rounds to target, or ``drop``: the accuracy lost from IID to the
  regime), ``first``, ``second``, optional ``seeds``, ``lower`` (true), ``part``
  (``clean``, the default, or ``attacked``: the record read) and ``first_attack`` /
  ``second_attack`` (``none``, the default, an attack of the attacked part, or ``worst``:
  per dataset and seed the lower of its attacks): in benchmarks/papers/fedlag_table1.py's
  record of that part, ``first``'s measure under its attack is higher (lower) than
  ``second``'s under its own, per seed the mean over the datasets, an exact two-sided
  sign-flip test over seeds (a halted run scored at chance). The same method under two
  attacks asks whether the one lowers it.
- ``convergence``: ``table`` (``pid-made-convergence-paired``), ``row`` (the attacker
  share as the table shows it, e.g. ``"0.1"``), ``fraction`` (the same share), ``first``,
  ``second``, ``lower`` or ``higher`` (true): in benchmarks/papers/pid_made_convergence.py's
  record, with that share of the 40 clients flipping labels, ``first``'s mean test loss
  over the rounds is lower (higher) than ``second``'s, an exact two-sided sign-flip test
  over seeds (the measure of :func:`benchmarks.evidence.tables.pid_made.convergence_by_seed`).

One multiple-testing policy. Every claim of the six test kinds (``better``, ``drop``,
``ablation``, ``stability``, ``convergence``, ``table1``) declares ``family`` (a name) and ``adjust``
(``holm`` or ``none``; ``none`` needs a one-line ``reason``). It holds when its effect
points the claimed way and its p, adjusted as declared, is below 0.05: for ``holm``,
Holm's step-down adjustment over every test of the family (statsmodels). A family is the
set of tests the reader saw:

- a claim read off a generated table takes that table as its family, every test of it,
  claims or not: a paired table (``table`` and ``row``, of
  :data:`benchmarks.evidence.tables.paired_tables.PAIRED_TABLES`; ``family`` is the table's name,
  and Holm adjusts over every test of the table);
  the ablation's McNemar table (``pid-made-ablation-paired``: its 28 tests, variants
  against the distance CUSUM); or, for a ``drop``, its record's table
  (``robustness-<record>``: the drop of every method under every attack at every fraction
  the record holds, seed by seed);
- any other name is a declared list: Holm over the raw p of the claims that share it.
  It is for claims stated as a set before their data, where those claims are every test
  asked, so only the pre-registration (benchmarks/preregistered.yaml) may declare one;
  the ledger's claims, written after their data, are each read off a generated table
  (a comparison picked from a table after seeing it belongs to the table). A family is
  thus a whole generated table or a declared list, never a subset chosen by hand.

``worst_case``, ``at_most_seeds`` and ``consortium`` declare no family (the loader refuses one): they
compare no two methods. A worst case is a 95 % logit-scale t-interval for one method's
level, held to a stated bound; an ``at_most_seeds`` claim is a count of the records, with no test at all.
Their bounds are guards against a changed record, each read on its own, and the text does
not combine them into a comparison; the intervals are per claim, not simultaneous.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from statsmodels.stats.multitest import multipletests

from benchmarks.evidence.tables.fedlag import STABILITY_MEASURES, fedlag_by_seed
from benchmarks.evidence.tables.paired_tables import PAIRED_TABLES, paired_table
from benchmarks.evidence.tables.pid_made import (
    ABLATION_REFERENCE,
    ablation_outcomes,
    ablation_rows,
    ablation_tests,
    convergence_by_seed,
    convergence_rows,
)
from benchmarks.evidence.tables.records import HEADLINE, load, results_json, with_halts
from benchmarks.evidence.tables.robustness_matrix import worst_by_seed, worst_differences
from benchmarks.papers import pid_made_ablation
from tasks.statistics import exact_mcnemar, seed_difference, share_interval, smallest_p

LEDGER = Path(__file__).resolve().parents[1] / "claims.yaml"
ALPHA = 0.05
TEST_KINDS = frozenset({"better", "drop", "ablation", "stability", "convergence", "table1"})
ADJUSTMENTS = ("holm", "none")
ABLATION_TABLE = "pid-made-ablation-paired"
CONVERGENCE_TABLE = "pid-made-convergence-paired"
STABILITY_TABLE = "fedlag-stability-paired"
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


def load_ledger(path: Path = LEDGER, declared_lists: bool = False) -> list[dict[str, Any]]:
    """The claims of ``path``, checked: unique ids, known kinds, each test claim's family
    and adjustment as the policy above allows (a family that is a list of claims only
    where ``declared_lists``: the pre-registration)."""
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
        try:
            problem = policy_problem(claim)
        except KeyError as missing:
            problem = f"lacks the field {missing}"
        if problem:
            raise LedgerError(f"{path.name}: claim {claim['id']} ({claim['kind']}) {problem}")
    lists = ledger_families(claims)
    if lists and not declared_lists:
        name, members = next(iter(lists.items()))
        raise LedgerError(
            f"{path.name}: claim {members[0]['id']} names family {name!r}, a list of claims; "
            "a claim written after its data is read off a generated table, whose name is "
            "its family (only benchmarks/preregistered.yaml declares lists)"
        )
    mixed = sorted(
        name for name, members in lists.items() if len({c["adjust"] for c in members}) > 1
    )
    if mixed:
        raise LedgerError(
            f"{path.name}: the claims of family {mixed[0]} must share one adjust (holm or none)"
        )
    return claims


def table_family(claim: dict[str, Any]) -> str | None:
    """The generated table a test claim is read from, or None where no table holds it."""
    if claim["kind"] == "drop":
        return f"robustness-{claim['record']}"
    if claim["kind"] == "ablation":
        return ABLATION_TABLE
    return claim.get("table")


def _names_a_table(family: str) -> bool:
    return family in PAIRED_TABLES or family == ABLATION_TABLE or family.startswith("robustness-")


def policy_problem(claim: dict[str, Any]) -> str | None:
    """What is wrong with a claim's declared family and adjustment, or None."""
    declared = sorted({"family", "adjust", "reason"} & claim.keys())
    if claim["kind"] not in TEST_KINDS:
        return (
            f"is a bound or a count, not a test: {', '.join(declared)} not allowed; "
            f"family and adjust are for {', '.join(sorted(TEST_KINDS))}"
            if declared else None
        )  # fmt: skip
    family, adjust, reason = claim.get("family"), claim.get("adjust"), claim.get("reason")
    if not isinstance(family, str) or not family or adjust not in ADJUSTMENTS:
        return (
            f"must declare family: (a name) and adjust: holm | none (with reason:), "
            f"got family {family!r}, adjust {adjust!r}"
        )
    if adjust == "none" and not (isinstance(reason, str) and reason.strip() and "\n" not in reason):
        return "has adjust: none, which needs reason: (one line saying why)"
    table = table_family(claim)
    if "table" in claim and family != table:
        return f"is read off table {table}, so its family is {table}, got {family!r}"
    if family != table and _names_a_table(family):
        allowed = f"{table} or " if table else ""
        return (
            f"names family {family!r}, a table that does not hold its test; allowed: "
            f"{allowed}a name of your own for a family of ledger claims"
        )
    return None


def ledger_families(claims: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The families made of ledger claims (not of a generated table), by name."""
    families: dict[str, list[dict[str, Any]]] = {}
    for claim in claims:
        if claim["kind"] in TEST_KINDS and claim["family"] != table_family(claim):
            families.setdefault(claim["family"], []).append(claim)
    return families


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
    """A method's worst case per seed, a share: held to its bound by the 95 % logit-scale
    t-interval over seeds (:func:`tasks.statistics.share_interval`), which stays in
    [0, 1]."""
    rows, metric = _matrix(claim)
    worst, _, _ = worst_by_seed(rows, claim["method"], claim["fraction"], metric)
    mean, low, high = share_interval(list(worst.values()))
    if math.isnan(low):
        low = high = mean
    if "at_least" in claim:
        bound, holds, test, threshold = low, low >= claim["at_least"], "≥", claim["at_least"]
    else:
        bound, holds, test, threshold = high, high <= claim["at_most"], "≤", claim["at_most"]
    return Verdict(
        claim["id"], claim["text"], f"{mean:.3f} [{low:.3f}, {high:.3f}] [{len(worst)} seeds]",
        f"95 % bound {bound:.3f} {test} {threshold:g}", bool(holds) and not math.isnan(mean),
    )  # fmt: skip


@dataclass(frozen=True)
class Tested:
    """A test claim recomputed, before its family's adjustment: the statistic as shown,
    the test's name, its raw p, whether the effect points the claimed way, and a note on
    what p the test can reach."""

    statistic: str
    test: str
    p: float
    in_direction: bool
    note: str = ""


def _seed_tested(
    measure: str, differences: Any, p: float, higher: bool, names: tuple[str, str]
) -> Tested:
    """A paired claim's raw result: the mean per-seed difference ``names[0] − names[1]``
    and the exact sign-flip p over seeds, the claim holding when the mean points the
    claimed way (above zero for ``higher``, below it otherwise)."""
    mean = float(differences.mean()) if len(differences) else math.nan
    return Tested(
        f"Δ {measure} ({names[0]} − {names[1]}) = {mean:+.3f} over {len(differences)} seeds",
        "sign-flip", p, bool(mean > 0 if higher else mean < 0),
        f" (smallest possible {smallest_p(len(differences)):.3g})",
    )  # fmt: skip


def better(claim: dict[str, Any]) -> Tested:
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
    names = (claim["first"], claim["second"])
    return _seed_tested(claim["statistic"], differences, p, not claim.get("lower"), names)


def _drop(
    rows: list[dict[str, Any]], metric: str, method: str, attack: str, fraction: float
) -> tuple[Any, float]:
    """``method``'s run without attack minus its run under ``attack`` at ``fraction``,
    seed by seed, and the exact sign-flip p (:func:`tasks.statistics.seed_difference`)."""
    clean, attacked = (
        {(method, int(r["seed"])): r[metric] for r in rows
         if r["method"] == method and r["attack"] == name
         and (name == "none" or r["fraction"] == fraction)}
        for name in ("none", attack)
    )  # fmt: skip
    return seed_difference(clean, attacked)


def drop(claim: dict[str, Any]) -> Tested:
    rows, metric = _matrix(claim)
    differences, p = _drop(rows, metric, claim["method"], claim["attack"], claim["fraction"])
    names = ("no attack", claim["attack"])
    return _seed_tested(f"drop of {claim['method']}", differences, p, True, names)


@cache
def drop_tests(record: str) -> tuple[tuple[tuple[str, str, float], float], ...]:
    """Every drop the record's table shows: per (method, attack, fraction) under attack,
    the exact sign-flip p of the method's clean run minus its attacked one, seed by seed."""
    rows, metric = _matrix({"record": record})
    cells = dict.fromkeys(
        (r["method"], r["attack"], r["fraction"]) for r in rows if r["attack"] != "none"
    )
    return tuple((cell, _drop(rows, metric, *cell)[1]) for cell in cells)


def ablation(claim: dict[str, Any]) -> Tested:
    rows = [r for r in ablation_rows() if int(r["seed"]) not in pid_made_ablation.TUNED_ON]
    outcome = claim["outcome"]
    first = ablation_outcomes(rows, claim["first"], claim["dataset"])[outcome]
    second = ablation_outcomes(rows, claim["second"], claim["dataset"])[outcome]
    only_first, only_second, p = exact_mcnemar(first, second)
    direction = only_first < only_second if "fewer" in claim else only_first > only_second
    return Tested(
        f"{sum(first.values())}/{len(first)} against {sum(second.values())}/{len(second)} "
        f"held-out seeds ({only_first} / {only_second} discordant)",
        "exact McNemar", p, bool(direction),
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


def pending(claim: dict[str, Any]) -> bool:
    """Whether a claim's records exist but do not yet hold what it counts: a consortium
    claim's defence not yet run at its dataset and size (the recommended one: any
    defence of the grid), while the record's other rows are committed; a table1 claim's
    runs not all in the record yet."""
    if claim["kind"] == "table1":  # judged on its whole design only: every dataset and seed
        from benchmarks.evidence.tables.table1 import table1_complete

        return not table1_complete(claim)
    if claim["kind"] != "consortium":
        return False
    from benchmarks.robustness import small_consortium

    family = consortium_family(claim)
    rows = small_consortium.rows_of(small_consortium.read_seed_rows(family.seeds_csv))
    ran = {r["defence"] for r in rows if (r["dataset"], r["sites"], r["attack"])
           == (claim["dataset"], int(claim["sites"]), claim["attack"])}  # fmt: skip
    wanted = set(family.defences) if claim["defence"] == "recommended" else {claim["defence"]}
    return not wanted <= ran


def consortium_family(claim: dict[str, Any]) -> Any:
    """The small consortium's family a consortium claim counts in: its ``model``'s."""
    from benchmarks.robustness import small_consortium

    model = claim.get("model", "logreg")
    if model not in small_consortium.FAMILIES:
        raise LedgerError(
            f"claim {claim['id']}: model {model!r} has no small consortium family; allowed: "
            f"{', '.join(small_consortium.FAMILIES)}"
        )
    return small_consortium.FAMILIES[model]


def consortium(claim: dict[str, Any]) -> Verdict:
    """Counted off benchmarks/small_consortium.py's per-run record of the claim's model
    (its rows and rule)."""
    from benchmarks.robustness import small_consortium

    family = consortium_family(claim)
    rows = small_consortium.rows_of(small_consortium.read_seed_rows(family.seeds_csv))
    sites, defence = int(claim["sites"]), claim["defence"]
    if defence == "recommended":
        defence = small_consortium.recommended(rows, sites)["defence"]
    wanted = (claim["dataset"], sites, claim["attack"], defence)
    row = next((r for r in rows
                if (r["dataset"], r["sites"], r["attack"], r["defence"]) == wanted), None)  # fmt: skip
    if row is None:
        raise ValueError(
            f"claim {claim['id']}: the small consortium's record holds no row {wanted}"
        )
    caught, banned = row["caught_by_round_seeds"], row["honest_banned_seeds"]
    bounds = [(caught >= claim["caught_at_least"], f"≥ {claim['caught_at_least']} out")
              if "caught_at_least" in claim
              else (caught <= claim["caught_at_most"], f"≤ {claim['caught_at_most']} out")]  # fmt: skip
    if "honest_banned_at_most" in claim:
        limit = claim["honest_banned_at_most"]
        bounds.append((banned <= limit, f"honest banned in ≤ {limit}"))
    return Verdict(
        claim["id"], claim["text"],
        f"{defence}: out by round {small_consortium.BY_ROUND} in {caught} of {row['seeds']} "
        f"seeds, an honest site banned in {banned}",
        ", ".join(text for _, text in bounds), not row["errors"] and all(ok for ok, _ in bounds),
    )  # fmt: skip


def stability(claim: dict[str, Any]) -> Tested:
    """Read off the stability table, whose rows are α and measure: ``row`` must name the
    claim's ``alpha`` and ``measure``, or its p could match a row that tests another."""
    table, row, alpha, measure = claim["table"], claim["row"], claim["alpha"], claim["measure"]
    label = STABILITY_MEASURES.get(measure, (None, None))[0]
    expected = f"{alpha:g}, {label}" if isinstance(alpha, int | float) and label else None
    if table != STABILITY_TABLE or row != expected:
        raise ValueError(
            f"claim {claim['id']}: a stability claim is read off {STABILITY_TABLE} at the row "
            f"of its α and measure (acc or wobble), got table {table!r}, row {row!r}, "
            f"alpha {alpha!r}, measure {measure!r}"
        )
    key = STABILITY_MEASURES[measure][1]
    rows = results_json("fedlag-stability")["rows"]
    first, second = (
        fedlag_by_seed(rows, claim["alpha"], m, key) for m in (claim["first"], claim["second"])
    )
    differences, p = seed_difference(first, second)
    names = (claim["first"], claim["second"])
    return _seed_tested(claim["measure"], differences, p, bool(claim.get("higher")), names)


def convergence(claim: dict[str, Any]) -> Tested:
    """Read off the convergence table, whose rows are attacker shares: ``row`` must name
    ``fraction``, or the claim's p (equal at every share the table tests) could match a
    row that tests another share."""
    table, row, fraction = claim["table"], claim["row"], claim["fraction"]
    share = f"{fraction:g}" if isinstance(fraction, int | float) else None
    if table != CONVERGENCE_TABLE or row != share:
        raise ValueError(
            f"claim {claim['id']}: a convergence claim is read off {CONVERGENCE_TABLE} at the "
            f"row of its attacker share, got table {table!r}, row {row!r}, fraction {fraction!r}"
        )
    rows = convergence_rows()
    first, second = (
        convergence_by_seed(rows, fraction, m) for m in (claim["first"], claim["second"])
    )
    differences, p = seed_difference(first, second)
    names = (claim["first"], claim["second"])
    measure = "mean test loss over rounds"
    return _seed_tested(measure, differences, p, bool(claim.get("higher")), names)


def _family_tests(claim: dict[str, Any], p: float) -> tuple[list[float], int]:
    """The raw p of every test of the generated table the claim is read from (within the
    family the table adjusts over), and the claim's place among them. The table must test
    the same records: its p at that place equals the claim's ``p``."""
    where = claim["family"]
    if claim["kind"] == "drop":
        wanted = (claim["method"], claim["attack"], claim["fraction"])
        what = "{} under {} at {}".format(*wanted)
        cells, ps = zip(*drop_tests(claim["record"]), strict=True)
        index = cells.index(wanted) if wanted in cells else None
    elif claim["kind"] == "ablation":
        wanted = (claim["dataset"], claim["outcome"], {claim["first"], claim["second"]})
        what = f"{claim['first']} with {claim['second']} ({claim['dataset']}, {claim['outcome']})"
        tests = ablation_tests()
        ps = tuple(t.p for t in tests)
        index = next((i for i, t in enumerate(tests)
                      if (t.dataset, t.outcome, {t.variant, ABLATION_REFERENCE}) == wanted), None)  # fmt: skip
    else:
        paired = paired_table(claim["table"])
        what = f"{claim['first']} with {claim['second']}"
        tested = {claim["first"], claim["second"]} - {paired.reference}
        row = paired.index_of(tested.pop(), claim["row"]) if len(tested) == 1 else None
        members = next((f for f in paired.families() if row in f), [])
        index = members.index(row) if row in members else None
        ps = tuple(paired.tests[i][2][1] for i in members)
        where = f"{claim['table']} row {claim['row']!r}"
    if index is None:
        raise ValueError(
            f"claim {claim['id']}: {where} holds no test of {what}; a claim read off a table "
            "must be one of its tests"
        )
    if not math.isclose(ps[index], p):
        raise ValueError(
            f"claim {claim['id']}: its p is {p:.3g} but {where}'s test of {what} has "
            f"{ps[index]:.3g}; they must test the same records"
        )
    return list(ps), index


def table1(claim: dict[str, Any]) -> Tested:
    """Paired off the Table 1 record (:mod:`benchmarks.evidence.tables.table1`), keyed
    (dataset, seed): per seed the mean difference over the three datasets."""
    from benchmarks.evidence.tables.table1 import (
        MEASURES,
        WORST,
        claim_attacks,
        table1_by_seed,
        table1_rows,
    )
    from benchmarks.papers.fedlag_table1 import ATTACKED

    measure, regime = claim["measure"], claim["regime"]
    if measure not in (*MEASURES, "drop"):
        raise ValueError(
            f"claim {claim['id']}: measure {measure!r}; allowed: {', '.join(MEASURES)}, drop"
        )
    attacks = claim_attacks(claim)
    unknown = [a for a in attacks if a not in ("none", *ATTACKED, WORST)]
    if unknown:
        raise ValueError(
            f"claim {claim['id']}: attack {unknown[0]!r}; allowed: none, {', '.join(ATTACKED)}, "
            f"{WORST}"
        )
    rows, seeds = table1_rows(claim.get("part", "clean")), seeds_of(claim)
    first, second = (
        {key: value for key, value in table1_by_seed(rows, regime, method, measure, attack).items()
         if seeds is None or key[1] in seeds}
        for method, attack in zip((claim["first"], claim["second"]), attacks, strict=True)
    )  # fmt: skip
    differences, p = seed_difference(first, second)
    names = tuple(
        method if attack == "none" else f"{method} under {attack}"
        for method, attack in zip((claim["first"], claim["second"]), attacks, strict=True)
    )
    where = f"{measure} at {regime}"
    return _seed_tested(where, differences, p, not claim.get("lower"), (names[0], names[1]))


@cache
def holm(ps: tuple[float, ...]) -> tuple[float, ...]:
    """Holm's step-down adjustment (statsmodels), once per family: statsmodels runs a full
    garbage collection on every call."""
    return tuple(float(p) for p in multipletests(list(ps), method="holm")[1])


def judged(claim: dict[str, Any], tested: Tested, family_ps: list[float], index: int) -> Verdict:
    """A test claim's verdict under its declared policy: the raw p, then Holm over its
    family (``family_ps``, the claim's own at ``index``) or no adjustment, with the reason."""
    size, family = len(family_ps), claim["family"]
    test = f"{tested.test} p = {tested.p:.3g}"
    if claim["adjust"] == "holm":
        p = holm(tuple(family_ps))[index]
        test += f", Holm over {size} test{'s' * (size != 1)} of {family} = {p:.3g}"
    else:
        p = tested.p
        test += f", not adjusted ({size} test{'s' * (size != 1)} of {family}: {claim['reason']})"
    test += f" {'<' if p < ALPHA else '≥'} {ALPHA:g}{tested.note}"
    if not tested.in_direction:
        test += "; the difference points the other way"
    return Verdict(
        claim["id"], claim["text"], tested.statistic, test, tested.in_direction and p < ALPHA
    )


KINDS: dict[str, Callable[[dict[str, Any]], Verdict | Tested]] = {
    "worst_case": worst_case,
    "better": better,
    "drop": drop,
    "ablation": ablation,
    "at_most_seeds": at_most_seeds,
    "consortium": consortium,
    "stability": stability,
    "convergence": convergence,
    "table1": table1,
}


def _recomputed(claim: dict[str, Any], path: Path) -> Verdict | Tested:
    try:
        return KINDS[claim["kind"]](claim)
    except KeyError as missing:
        raise LedgerError(
            f"{path.name}: claim {claim['id']} ({claim['kind']}) lacks the field {missing}"
        ) from None
    except ValueError as error:
        raise LedgerError(f"{path.name}: {error}") from None


def verdicts(
    path: Path = LEDGER, declared_lists: bool = False, only: set[str] | None = None
) -> list[Verdict]:
    """Every claim recomputed (of ``only``, where given: whole families, so that each is
    adjusted over all its members) and, for a test, judged under its declared family and
    adjustment; a claim missing a field its kind needs, or read off a table that does not
    hold its test, raises a one-line LedgerError naming the ledger and the claim."""
    ledger = load_ledger(path, declared_lists)
    if only is not None:
        ledger = [claim for claim in ledger if claim["id"] in only]
    found = {claim["id"]: _recomputed(claim, path) for claim in ledger}
    of_ledger = {
        c["id"]: (members, [found[m["id"]].p for m in members])
        for members in ledger_families(ledger).values() for c in members
    }  # fmt: skip
    judged_all = []
    for claim in ledger:
        result = found[claim["id"]]
        if isinstance(result, Verdict):
            judged_all.append(result)
            continue
        if claim["id"] in of_ledger:
            members, ps = of_ledger[claim["id"]]
            index = members.index(claim)
        else:
            try:
                ps, index = _family_tests(claim, result.p)
            except ValueError as error:
                raise LedgerError(f"{path.name}: {error}") from None
        judged_all.append(judged(claim, result, ps, index))
    return judged_all


def citation_problems(text: str, claims: list[dict[str, Any]]) -> list[str]:
    """Ids cited in ``text`` that the ledger lacks, and claims ``text`` never cites."""
    cited = {i for group in CITATION.findall(text) for i in re.split(r",\s+", group)}
    known = {c["id"] for c in claims}
    problems = [f"{i} is cited but not in the ledger" for i in sorted(cited - known)]
    problems += [f"{i} is in the ledger but no sentence cites it" for i in sorted(known - cited)]
    return problems
