"""The robustness matrix's tables (``robustness-<dataset>-*`` blocks): which methods learn,
the worst case per seed over the attacks with halted runs counted, the methods ranked by
paired tests blocked by seed, and the exclusion and backdoor rates."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from typing import Any

from benchmarks.evidence.tables.cells import shown, shown_seed_rates, shown_share
from benchmarks.evidence.tables.records import (
    HEADLINE,
    Row,
    by_seed,
    chance,
    distinct,
    finished,
    load,
    with_halts,
)
from tasks.comparison import interval
from tasks.statistics import (
    seed_blocked_differences,
    seed_difference,
    smallest_p,
    worst_per_seed,
)

LEARNS_BY = 0.02  # a baseline learns when its margin's interval lies above this


PAIRED_AT = (0.2, 0.4)


def baselines(rows: list[Row], metric: str) -> dict[str, tuple[list[float], bool]]:
    """Per method: its no-attack margins over chance per seed, and whether it learns
    (the lower end of the margin's 95 % interval above ``LEARNS_BY``)."""
    out = {}
    for method in distinct(rows):
        clean = [r for r in finished(rows) if r["method"] == method and r["attack"] == "none"]
        margins = [r[metric] - chance(r, metric) for r in clean]
        mean, _, half = interval(margins)
        lower = mean - (0.0 if math.isnan(half) else half)
        out[method] = (margins, not math.isnan(mean) and lower > LEARNS_BY)
    return out


def learning_block(dataset: str) -> str:
    """Which methods learn without attack, by how much, and how many attack cells end
    at the majority class."""
    rows = load(dataset)
    done = finished(rows)
    metric = HEADLINE[dataset]
    margins = baselines(rows, metric)
    by_auc = metric == "test_auc"  # then the accuracy's margin is shown beside it
    lines = [
        "| method | no attack: " + ("AUC − 0.5 | ACC − majority share" if by_auc else "ACC − majority share")
        + " | seeds reaching the target accuracy (median round) | learns |",
        "|---" * (5 if by_auc else 4) + "|",
    ]  # fmt: skip
    for method, (values, learns) in margins.items():
        clean = [r for r in done if r["method"] == method and r["attack"] == "none"]
        shown_margins = [shown(values)]
        if by_auc:
            shown_margins.append(shown(r["test_acc"] - r["majority_share"] for r in clean))
        reached = [r["rounds_to_target"] for r in clean if r["rounds_to_target"] >= 0]
        target = f"{len(reached)}/{len(clean)}" + (
            f" ({statistics.median(reached):g})" if reached else ""
        )
        verdict = "yes" if learns else "**no**"
        lines.append(f"| {method} | {' | '.join(shown_margins)} | {target} | {verdict} |")
    groups: dict[tuple[str, str, float], list[Row]] = {}
    for r in done:
        if r["attack"] != "none":
            groups.setdefault((r["method"], r["attack"], r["fraction"]), []).append(r)
    at_majority = sum(
        1 for members in groups.values()
        if abs(statistics.mean(r["test_acc"] for r in members) - members[0]["majority_share"]) <= 0.01
    )  # fmt: skip
    lines.append(
        f"\n{len(groups)} attack cells (method × attack × fraction, over seeds); in "
        f"{at_majority} the mean final accuracy is within 0.01 of the majority share "
        f"({done[0]['majority_share']:.3f}). {len(rows) - len(done)} runs failed by design "
        "(listed in the summary file)."
    )
    return "\n".join(lines) + "\n"


def headline_block(dataset: str) -> str:
    """Per method: no attack, then the worst case over every attack run at each fraction,
    estimated per seed (the lowest score of each seed over the attacks), with the attack
    lowest in most seeds named. A run that halted counts at chance ("halts")."""
    rows = with_halts(load(dataset))
    metric = HEADLINE[dataset]
    margins = baselines(finished(rows), metric)
    fractions = sorted({r["fraction"] for r in rows if r["attack"] != "none"})
    header = " | ".join(f"worst at {f:g}" for f in fractions)
    lines = [f"| method | no attack | {header} |", "|---" * (len(fractions) + 2) + "|"]
    for method in distinct(rows):
        clean = by_seed(
            (r for r in rows if r["method"] == method and r["attack"] == "none"), metric
        )
        cells = [worst_cell(rows, method, fraction, metric) for fraction in fractions]
        flag = "" if margins[method][1] else " †"
        lines.append(f"| {method}{flag} | {shown_share(clean.values())} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def worst_by_seed(
    rows: list[Row], method: str, fraction: float, metric: str
) -> tuple[dict[int, float], str, list[Row]]:
    """``method``'s worst score per seed at ``fraction`` over the attacks run there, the
    attack lowest in most seeds, and the rows it was taken over."""
    at = [
        r
        for r in rows
        if r["method"] == method and r["fraction"] == fraction and r["attack"] != "none"
    ]
    attacks = {
        a: by_seed((r for r in at if r["attack"] == a), metric) for a in distinct(at, "attack")
    }
    worst, lowest = worst_per_seed(attacks)
    return worst, (lowest.most_common(1)[0][0] if lowest else ""), at


def worst_cell(rows: list[Row], method: str, fraction: float, metric: str) -> str:
    """``method``'s worst case at ``fraction`` over the attacks run there, per seed, the
    attack lowest in most seeds named ("halts" where its runs halted and were scored at
    chance), ‡ where the rule was told fewer attackers than there were."""
    worst, named, at = worst_by_seed(rows, method, fraction, metric)
    capped = any(r["f_told"] is not None and r["f_told"] < r["attackers"] for r in at)
    named += stopped(r for r in at if r["attack"] == named)
    return f"{shown_share(worst.values())} {named}{' ‡' if capped else ''}".strip()


def stopped(rows: Iterable[Row]) -> str:
    """ " diverges" or " halts" when some of ``rows`` (:func:`with_halts`'s) stopped so: the
    note beside a worst case that was scored at chance."""
    halted = [r for r in rows if r.get("halted")]
    return " diverges" if any(r["diverged"] for r in halted) else " halts" if halted else ""


def stopped_count(rows: Iterable[Row]) -> str:
    """How many of ``rows`` diverged or halted, as a table cell's note (" (3 diverged)")."""
    halted = [r for r in rows if r.get("halted")]
    diverged = sum(r["diverged"] for r in halted)
    counts = {"diverged": diverged, "halted": len(halted) - diverged}
    notes = [f"{count} {how}" for how, count in counts.items() if count]
    return f" ({', '.join(notes)})" if notes else ""


def paired_block(dataset: str) -> str:
    """At each fraction in ``PAIRED_AT``: the methods ranked by their mean over every
    (attack, seed) all ran, and how many others each is supported to beat or lose to,
    compared seed by seed (:func:`tasks.statistics.seed_blocked_differences`: an exact
    sign-flip test over seeds, Holm over all pairs at that fraction). A halted run counts
    at chance: a loss, never dropped."""
    rows = with_halts(load(dataset))
    metric = HEADLINE[dataset]
    learners = [m for m, (_, learns) in baselines(finished(rows), metric).items() if learns]
    parts = []
    for fraction in PAIRED_AT:
        at = [r for r in rows if r["fraction"] == fraction and r["method"] in learners]
        scores = {
            m: {(r["attack"], int(r["seed"])): r[metric] for r in at if r["method"] == m}
            for m in learners
        }
        shared = set.intersection(*(set(s) for s in scores.values()))
        if not shared:
            continue
        scores = {m: {k: v for k, v in s.items() if k in shared} for m, s in scores.items()}
        pairs = seed_blocked_differences(scores)
        beats = {m: 0 for m in scores}
        loses = {m: 0 for m in scores}
        for pair in pairs:
            if pair.supported:
                better, worse = (
                    (pair.first, pair.second)
                    if pair.mean_difference > 0
                    else (pair.second, pair.first)
                )
                beats[better] += 1
                loses[worse] += 1
        seeds = len({seed for _, seed in shared})
        ranked = sorted(scores, key=lambda m: -statistics.mean(scores[m].values()))
        lines = [
            f"At {fraction:g} ({len(shared)} (attack, seed) pairs per method over {seeds} "
            f"seeds, {len(pairs)} pairs of methods; smallest p a {seeds}-seed test can give: "
            f"{smallest_p(seeds):.3g}):\n",
            "| method | mean | better than (supported) | worse than (supported) | not separated |",
            "|---|---|---|---|---|",
        ]
        for m in ranked:
            ties = len(scores) - 1 - beats[m] - loses[m]
            lines.append(
                f"| {m} | {statistics.mean(scores[m].values()):.3f} | {beats[m]} | {loses[m]} | {ties} |"
            )
        top = [m for m in ranked if loses[m] == 0]
        lines.append(f"\nNot shown worse than any other: {', '.join(top)}.\n")
        parts.append("\n".join(lines))
    return "\n".join(parts)


def rates_block(dataset: str) -> str:
    """Exclusion error rates (honest client-rounds left out without attack; attacker
    client-rounds kept under label flipping) and the backdoor's success rate beside the
    clean model's, each per seed (:func:`shown_seed_rates`)."""
    rows = finished(load(dataset))

    def pooled(
        method: str, attack: str, fraction: float, hits: str, trials: Callable[[Row], float]
    ) -> str:
        members = [
            r
            for r in rows
            if r["method"] == method
            and r["attack"] == attack
            and (attack == "none" or r["fraction"] == fraction)
        ]
        if not members or any(r[hits] is None for r in members):
            return "–"
        return shown_seed_rates([r[hits] for r in members], [trials(r) for r in members])

    # left out by the method itself (every method drops non-finite updates: not counted)
    excluding = [m for m in distinct(rows) if any(
        r["fp"] > 0 or r["fn"] < r["attacker_rounds"]
        for r in rows if r["method"] == m and r["attack"] in ("none", "label_flip")
    )]  # fmt: skip
    lines = [
        "| method | honest left out, no attack | attackers kept, label flip 0.2 | attackers kept, label flip 0.4 |",
        "|---|---|---|---|",
    ]
    for m in excluding:
        lines.append(
            f"| {m} | {pooled(m, 'none', 0, 'fp', lambda r: r['honest_rounds'])} | "
            f"{pooled(m, 'label_flip', 0.2, 'fn', lambda r: r['attacker_rounds'])} | "
            f"{pooled(m, 'label_flip', 0.4, 'fn', lambda r: r['attacker_rounds'])} |"
        )
    lines += [
        "",
        "| method | trigger → target, clean model | backdoor at 0.2 | backdoor at 0.4 |",
        "|---|---|---|---|",
    ]
    for m in distinct(rows):
        cells = [pooled(m, attack, f, "asr_hits", trigger_images) for attack, f in
                 (("none", 0), ("backdoor", 0.2), ("backdoor", 0.4))]  # fmt: skip
        lines.append(f"| {m} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def trigger_images(row: Row) -> float:
    return row["trigger_images"]


def worst_differences(
    rows: list[Row], method: str, reference: str, fraction: float, metric: str
) -> tuple[Any, float]:
    """``method``'s per-seed worst case at ``fraction`` minus ``reference``'s, and the
    exact sign-flip p-value over seeds (:func:`tasks.statistics.seed_difference`)."""
    mine, theirs = (
        {("worst", s): v for s, v in worst_by_seed(rows, m, fraction, metric)[0].items()}
        for m in (method, reference)
    )
    return seed_difference(mine, theirs)
