"""docs/results.md's generated tables: the robustness matrix's, recomputed from the
committed per-seed records, and the EMA Monte Carlo's (seeded, recomputed from code).

    python -m benchmarks.report            # rewrite the generated blocks
    python -m benchmarks.report --check    # exit 1 naming every block that differs and
                                           # every claim of the ledger that fails

A generated block sits between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->``
in docs/results.md; what is outside the markers (the reading of the numbers) is written
by hand. The records are ``benchmarks/results/robustness-<dataset>-seeds.csv``, one row
per cell and seed, written by ``python -m benchmarks.robustness``. A test regenerates
every block and fails on a difference, so no figure in those tables is typed by hand.
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import ema_monte_carlo
from benchmarks.robustness import BINARY
from tasks.comparison import interval
from tasks.statistics import (
    exact_mcnemar,
    rate_interval,
    seed_blocked_differences,
    smallest_p,
    worst_per_seed,
)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOC = REPO / "docs" / "results.md"

# dataset -> the headline metric (the benchmark's binary datasets: AUC, their accuracy sits
# near the majority share)
HEADLINE = {d: "test_auc" if d in BINARY else "test_acc" for d in ("digits", "breastmnist")}
LEARNS_BY = 0.02  # a baseline learns when its margin's interval lies above this
PAIRED_AT = (0.2, 0.4)
DIRICHLET = ("0.1", "0.5", "1")  # the label-skew regimes' α, as their files name them
GRID_REGIMES = ("cnn", "alie-paper")  # regimes shown as a method x attack table
BLOCK = re.compile(
    r"(<!-- report:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /report:(?P=name) -->)", re.S
)

Row = dict[str, Any]


def load(name: str) -> list[Row]:
    """The per-seed records of a matrix (``digits``, ``digits-dirichlet-0.1``...), numbers
    as numbers (None where empty). Each call gets rows of its own (blocks may add keys);
    the file is parsed once while it is unchanged."""
    path = RESULTS / f"robustness-{name}-seeds.csv"
    return [dict(row) for row in _parsed(path, path.stat().st_mtime_ns)]


@functools.lru_cache(maxsize=32)
def _parsed(path: Path, _changed: int) -> tuple[Row, ...]:
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        for key, value in row.items():
            if key not in ("method", "attack", "error", "acc_curve"):
                row[key] = None if value == "" else float(value)
        # triggered images sent to the target: the success rate's count
        row["asr_hits"] = None if row["asr"] is None else round(row["asr"] * row["trigger_images"])
    return tuple(rows)


def distinct(rows: Iterable[Row], key: str = "method") -> list[Any]:
    """The values of ``key`` in the rows, in first-seen order."""
    return list(dict.fromkeys(r[key] for r in rows))


def finished(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if not r["error"]]


def by_seed(rows: Iterable[Row], metric: str) -> dict[int, float]:
    return {int(r["seed"]): r[metric] for r in rows if r[metric] is not None}


def chance(row: Row, metric: str) -> float:
    """What a model that learnt nothing scores: the majority share (accuracy) or 0.5."""
    return row["majority_share"] if metric == "test_acc" else 0.5


def shown(values: Iterable[float], digits: int = 2) -> str:
    """Mean ± 95 % t half-width with n: ``0.62 ± 0.05 [5]``."""
    values = list(values)
    mean, _, half = interval(values)
    if math.isnan(mean):
        return "–"
    spread = "" if math.isnan(half) else f" ± {half:.{digits}f}"
    return f"{mean:.{digits}f}{spread} [{len(values)}]"


def shown_rate(successes: float, trials: float) -> str:
    """k of n independent runs (one per seed) as a rate with its exact interval."""
    rate, low, high = rate_interval(int(successes), int(trials))
    return "–" if math.isnan(rate) else f"{rate:.2f} [{low:.2f}, {high:.2f}]"


def shown_seed_rates(hits: Iterable[float], trials: Iterable[float]) -> str:
    """A rate taken at the level it was sampled: one rate per seed (events over that
    seed's client-rounds or images, which share its partition and model), their mean ±
    95 % t half-width over seeds, and in how many seeds it happened at all."""
    rates = [h / t for h, t in zip(hits, trials, strict=True) if t > 0]
    if not rates:
        return "–"
    seeds_with = sum(rate > 0 for rate in rates)
    return f"{shown(rates)}; {seeds_with} of {len(rates)} seeds"


def with_halts(rows: list[Row]) -> list[Row]:
    """Every run, a halted one (its rule raised, e.g. told more attackers than it can take
    once the non-finite rows are dropped, or its model diverged: ``ModelDiverged``) scored
    at chance and marked ``halted`` (and ``diverged``): a deployment that halts gets no
    model from the run, so it counts as a loss."""
    majority = next(r["majority_share"] for r in rows if r["majority_share"] is not None)
    out = []
    for row in rows:
        if row["error"]:
            diverged = row["error"].startswith("ModelDiverged")
            row = {**row, "majority_share": majority, "halted": True, "diverged": diverged}
            row |= {metric: chance(row, metric) for metric in ("test_acc", "test_auc")}
        else:
            row = {**row, "halted": False}
        out.append(row)
    return out


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
        lines.append(f"| {method}{flag} | {shown(clean.values())} | {' | '.join(cells)} |")
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
    return f"{shown(worst.values())} {named}{' ‡' if capped else ''}".strip()


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


def regimes_block(dataset: str) -> str:
    """Label-skewed clients (Dirichlet α over classes): per method and α, no attack and
    the worst case at a fifth of attackers."""
    metric = HEADLINE[dataset]
    alphas = [a for a in DIRICHLET if recorded(f"{dataset}-dirichlet-{a}")]
    regimes = {alpha: finished(load(f"{dataset}-dirichlet-{alpha}")) for alpha in alphas}
    methods = distinct(next(iter(regimes.values())))
    header = " | ".join(f"α = {a}: no attack | α = {a}: worst at 0.2" for a in alphas)
    lines = [f"| method | {header} |", "|---" * (2 * len(alphas) + 1) + "|"]
    for method in methods:
        cells = []
        for rows in regimes.values():
            learns = baselines(rows, metric)[method][1]
            clean = by_seed(
                (r for r in rows if r["method"] == method and r["attack"] == "none"), metric
            )
            cells += [
                shown(clean.values()) + ("" if learns else " †"),
                worst_cell(rows, method, 0.2, metric),
            ]
        lines.append(f"| {method} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def at_majority(row: Row) -> bool:
    """The run ends predicting one class for (nearly) every test image: its accuracy is
    the majority share to the record's four digits. Such a run says nothing of a rule."""
    return abs(row["test_acc"] - row["majority_share"]) < 5e-5


def regime_grid_block(name: str, dataset: str) -> str:
    """A regime's subset (``robustness-<dataset>-<regime>``): per method, no attack, each
    attack at the regime's fraction, the drop to the worst of them, paired by seed, and
    how many of its runs ended at the majority class (:func:`at_majority`). A run that
    halted or diverged is scored at chance, as in the paired tests, and counted beside."""
    rows = with_halts(load(name))
    metric = HEADLINE[dataset]
    margins = baselines(finished(rows), metric)
    attacks = [a for a in distinct(rows, "attack") if a != "none"]
    fraction = next(r["fraction"] for r in rows if r["attack"] != "none")
    header = " | ".join(f"{a} at {fraction:g}" for a in attacks)
    lines = [
        f"| method | no attack | {header} | drop to the worst, paired by seed "
        "| runs at the majority class (no attack; attacked) |",
        "|---" * (len(attacks) + 4) + "|",
    ]
    for method in distinct(rows):
        mine = [r for r in rows if r["method"] == method]
        clean = by_seed((r for r in mine if r["attack"] == "none"), metric)
        per_attack = {a: by_seed((r for r in mine if r["attack"] == a), metric) for a in attacks}
        worst, _ = worst_per_seed(per_attack)
        drops = [clean[seed] - worst[seed] for seed in clean if seed in worst]
        capped = any(r["f_told"] is not None and r["f_told"] < r["attackers"] for r in mine)
        cells = [
            shown(per_attack[a].values()) + stopped_count(r for r in mine if r["attack"] == a)
            for a in attacks
        ]
        flag = ("" if margins[method][1] else " †") + (" ‡" if capped else "")
        stuck = [
            f"{sum(at_majority(r) for r in runs if not r['halted'])} of {len(runs)}"
            for runs in ([r for r in mine if r["attack"] == "none"],
                         [r for r in mine if r["attack"] != "none"])
        ]  # fmt: skip
        lines.append(
            f"| {method}{flag} | {shown(clean.values())} | {' | '.join(cells)} | {shown(drops)} "
            f"| {'; '.join(stuck)} |"
        )
    return "\n".join(lines) + "\n"


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


def ablation_block() -> str:
    """PID-MADE's exclusion tests side by side (benchmarks/pid_made_ablation.py): per
    dataset, variant and seed group, how often a clean run banned an honest client, how
    often every attacker was out by round 5, and the score's detection ROC-AUC."""
    from benchmarks import pid_made_ablation as ablation

    rows = ablation_rows()
    by = f"attackers_banned_by_{ablation.CAUGHT_BY}"
    configurations = ["| exclusion test | configuration (before FedAvg) |", "|---|---|"] + [
        f"| {name} | `{', '.join(f'{k}: {v}' for k, v in spec.items())}` |"
        for name, spec in ablation.VARIANTS.items()
    ]

    def numbers(group: list[Row], key: str) -> list[float]:
        return [float(r[key]) for r in group if r[key] != ""]

    lines = [
        "| dataset | exclusion test | seeds | clean runs banning an honest client "
        f"| attacked runs with every attacker out by round {ablation.CAUGHT_BY} "
        "| honest clients banned, attacked runs "
        + "".join(f"| detection ROC-AUC, round {t} " for t in ablation.AUC_ROUNDS)
        + "| headline margin over chance: clean / attacked |",
        "|---" * (7 + len(ablation.AUC_ROUNDS)) + "|",
    ]
    for dataset in distinct(rows, "dataset"):
        for variant in ablation.VARIANTS:
            for label, tuned in (("0–9 (tuning)", True), ("10–19 (held out)", False)):
                group = [
                    r for r in rows
                    if r["dataset"] == dataset and r["variant"] == variant
                    and (int(r["seed"]) in ablation.TUNED_ON) == tuned
                ]  # fmt: skip
                clean = [r for r in group if r["attack"] == "none"]
                attacked = [r for r in group if r["attack"] != "none"]
                if not clean or not attacked:
                    continue
                banning = sum(int(r["honest_banned"]) > 0 for r in clean)
                caught = sum(int(r[by]) == int(r["attackers"]) for r in attacked)
                metric = HEADLINE[dataset]
                margins = [
                    shown(
                        float(r[metric])
                        - chance({**r, "majority_share": float(r["majority_share"])}, metric)
                        for r in runs
                    )
                    for runs in (clean, attacked)
                ]
                aucs = "".join(f"| {shown(numbers(attacked, f'auc_round_{t}'))} "
                               for t in ablation.AUC_ROUNDS)  # fmt: skip
                lines.append(
                    f"| {dataset} | {variant} | {label} "
                    f"| {banning}/{len(clean)}: {shown_rate(banning, len(clean))} "
                    f"| {caught}/{len(attacked)}: {shown_rate(caught, len(attacked))} "
                    f"| {shown(numbers(attacked, 'honest_banned'), 1)} {aucs}"
                    f"| {margins[0]} / {margins[1]} |"
                )
    return "\n".join(configurations) + "\n\n" + "\n".join(lines) + "\n"


def ablation_rows(name: str = "pid-made-ablation-seeds") -> list[Row]:
    with (RESULTS / f"{name}.csv").open(newline="") as handle:
        return [r for r in csv.DictReader(handle) if not r["error"]]


def ablation_outcomes(rows: list[Row], variant: str, dataset: str) -> dict[str, dict[int, bool]]:
    """Per seed: whether the clean run banned an honest client, and whether the attacked
    run had every attacker out by round 5."""
    from benchmarks.pid_made_ablation import CAUGHT_BY

    mine = [r for r in rows if r["variant"] == variant and r["dataset"] == dataset]
    by = f"attackers_banned_by_{CAUGHT_BY}"
    return {
        "banning": {int(r["seed"]): int(r["honest_banned"]) > 0
                    for r in mine if r["attack"] == "none"},
        "caught": {int(r["seed"]): int(r[by]) == int(r["attackers"])
                   for r in mine if r["attack"] != "none"},
    }  # fmt: skip


def ablation_paired_block() -> str:
    """The thresholds compared on the held-out seeds alone, paired by seed: each variant
    against the distance CUSUM, in clean runs banning an honest client and in attacked
    runs with every attacker out by round 5 (seeds only one of the two had, and the exact
    McNemar p-value)."""
    from benchmarks import pid_made_ablation as ablation

    rows = [r for r in ablation_rows() if int(r["seed"]) not in ablation.TUNED_ON]
    reference = "distance_cusum"
    lines = [
        f"| dataset | variant | clean runs banning: only it / only {reference} (p) "
        f"| attacked runs all out by round {ablation.CAUGHT_BY}: only it / only {reference} (p) |",
        "|---|---|---|---|",
    ]
    for dataset in distinct(rows, "dataset"):
        ours = ablation_outcomes(rows, reference, dataset)
        for variant in ablation.VARIANTS:
            if variant == reference:
                continue
            theirs = ablation_outcomes(rows, variant, dataset)
            cells = []
            for outcome in ("banning", "caught"):
                only_it, only_ours, p = exact_mcnemar(theirs[outcome], ours[outcome])
                cells.append(f"{only_it} / {only_ours} (p = {p:.2g})")
            lines.append(f"| {dataset} | {variant} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def chosen_cusum(rows: list[Row]) -> str:
    """The search's choice by its stated rule: the fewest clean runs banning an honest
    client over both datasets, then the most attacked runs with every attacker out by
    round 5, then the smallest drift + h."""
    from benchmarks.pid_made_ablation import SEARCH

    def key(variant: str) -> tuple[int, int, float]:
        outcomes = [ablation_outcomes(rows, variant, d) for d in distinct(rows, "dataset")]
        banning = sum(sum(o["banning"].values()) for o in outcomes)
        caught = sum(sum(o["caught"].values()) for o in outcomes)
        return banning, -caught, SEARCH[variant]["drift"] + SEARCH[variant]["h"]

    return min(distinct(rows, "variant"), key=key)


def cusum_search_block() -> str:
    """The drift/h search of the distance CUSUM on seeds 0–9 (the seeds it was tuned on):
    per setting and dataset, clean runs banning an honest client and attacked runs with
    every attacker out by round 5, and the setting the stated rule picks."""
    from benchmarks.pid_made_ablation import CAUGHT_BY, SEARCH

    rows = ablation_rows("pid-made-cusum-search")
    datasets = distinct(rows, "dataset")
    header = " | ".join(
        f"{d}: clean runs banning | {d}: all out by round {CAUGHT_BY}" for d in datasets
    )
    lines = [f"| drift | h | {header} |", "|---" * (2 + 2 * len(datasets)) + "|"]
    for variant, spec in SEARCH.items():
        cells = []
        for dataset in datasets:
            outcome = ablation_outcomes(rows, variant, dataset)
            for name in ("banning", "caught"):
                cells.append(f"{sum(outcome[name].values())}/{len(outcome[name])}")
        lines.append(f"| {spec['drift']:g} | {spec['h']:g} | {' | '.join(cells)} |")
    pick = SEARCH[chosen_cusum(rows)]
    lines.append(
        f"\nThe rule (fewest clean runs banning over both datasets, then most attacked runs "
        f"with every attacker out by round {CAUGHT_BY}, then the smallest drift + h) picks "
        f"drift {pick['drift']:g}, h {pick['h']:g}."
    )
    return "\n".join(lines) + "\n"


def filters_block(dataset: str) -> str:
    """The history-aware filters (``--regime filters``), each row's exact configuration:
    no attack and the worst case over every attack at 0.2 and 0.4, per seed, on the
    seeds the round cut was added on (0–4) and on held-out seeds (5–9) apart."""
    from benchmarks.robustness import FILTERED

    rows = with_halts(load(f"{dataset}-filters"))
    metric = HEADLINE[dataset]
    fractions = sorted({r["fraction"] for r in rows if r["attack"] != "none"})
    header = " | ".join(f"worst at {f:g}" for f in fractions)
    lines = [
        f"| method | configuration | seeds | no attack | {header} |",
        "|---" * (len(fractions) + 4) + "|",
    ]
    for method in distinct(rows):
        spec = ", ".join(f"{k}: {v}" for k, v in FILTERED[method].items())
        for label, seeds in (("0–4", range(5)), ("5–9 (held out)", range(5, 10))):
            mine = [r for r in rows if r["method"] == method and int(r["seed"]) in seeds]
            if not mine:
                continue
            clean = by_seed((r for r in mine if r["attack"] == "none"), metric)
            cells = [worst_cell(mine, method, fraction, metric) for fraction in fractions]
            lines.append(
                f"| {method} | `{spec}` | {label} | {shown(clean.values())} | {' | '.join(cells)} |"
            )
    return "\n".join(lines) + "\n"


FEDSTNN_CURVES = {
    "1d_iid": "1-D IID", "1d_noniid_110": "1-D non-IID, 110 points",
    "1d_noniid_60": "1-D non-IID, 60 points", "2d": "2-D piecewise",
}  # fmt: skip


def fedstnn_runs(name: str) -> dict[str, list[Row]]:
    """Per trainer, the finished runs of a FedStNN experiment's per-seed records."""
    with (RESULTS / f"fedstnn-{name}-seeds.csv").open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if not r["error"]]
    return {t: [r for r in rows if r["trainer"] == t] for t in distinct(rows, "trainer")}


def plain(values: Iterable[Any], digits: int = 3, scale: float = 1.0) -> str:
    """Mean ± 95 % t half-width, without n (the row's seeds column gives it)."""
    mean, _, half = interval([float(v) * scale for v in values])
    return f"{mean:.{digits}f}" + ("" if math.isnan(half) else f" ± {half:.{digits}f}")


def fedstnn_block() -> str:
    """The function-fitting experiments: fit, predicted noise, coverage, per trainer."""
    lines = [
        "| experiment | trainer | seeds | MSE / σ² | predicted σ̂ | σ̂ error | 2σ coverage "
        "| local model MSE / σ² |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, label in FEDSTNN_CURVES.items():
        for trainer, runs in sorted(fedstnn_runs(name).items()):
            values = {key: [r[key] for r in runs] for key in runs[0]}
            lines.append(
                f"| {label} | {trainer} | {len(runs)} | {plain(values['mse_over_sigma2'])} "
                f"| {plain(values['sigma_pred'])} (true {float(runs[0]['sigma_true']):g}) "
                f"| {plain(values['sigma_rel_error'], 1, 100)} % "
                f"| {plain(values['coverage_2sigma'])} | {plain(values['local_mse_over_sigma2'])} |"
            )
    return "\n".join(lines) + "\n"


def fedstnn_image_block() -> str:
    """The letters image: IoU of the global model and of each group's model alone."""
    lines = [
        "| trainer | seeds | global model | local models alone (F / S / U) | global − best local |",
        "|---|---|---|---|---|",
    ]
    for trainer, runs in sorted(fedstnn_runs("image").items()):
        local = " / ".join(
            plain(r[f"group_{i}_{letter}_iou"] for r in runs) for i, letter in enumerate("FSU")
        )
        lines.append(
            f"| {trainer} | {len(runs)} | {plain(r['global_iou'] for r in runs)} | {local} "
            f"| {plain(r['iou_margin_over_best_local'] for r in runs)} |"
        )
    return "\n".join(lines) + "\n"


PID_PAPER = {
    "table4": "poisoning rate",
    "figure4": "attackers",
    "ablation": "gains",
    "thresholds": "clients",
}  # experiment -> what its setting column shows; fmt: skip


def pid_paper_block(experiment: str) -> str:
    """One of PID-MADE's paper analogues (benchmarks/pid_made_paper.py): per setting and
    method, the test accuracy (mean ± t-interval), false positives and negatives as rates
    of honest and attacker client-rounds, honest clients ever banned and attackers
    caught as rates of clients, each per seed (:func:`shown_seed_rates`), and the round
    the last attacker was caught in runs that caught them all (median)."""
    rows = results_json("pid-made-paper")["rows"]
    lines = [
        f"| {PID_PAPER[experiment]} | method | test ACC | FP rate | FN rate "
        "| honest clients banned | attackers caught | last caught in round (median, seeds) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    from benchmarks.pid_made_paper import EXPERIMENTS

    order = [m for setups in EXPERIMENTS.values() for *_, methods in setups for m in methods]
    mine = [r for r in rows if r["experiment"].partition(".")[0] == experiment]
    mine.sort(key=lambda r: (r["fraction"], r["attackers"][0], order.index(r["method"])))
    for row in mine:
        label = row["experiment"].partition(".")[2]
        rounds = row["attacker_rounds"][0] / row["attackers"][0]
        honest_clients = [h / rounds for h in row["honest_rounds"]]
        if experiment == "table4":
            setting = f"{float(label.removeprefix('rate')) * 100:g} %"
        elif experiment == "thresholds":
            setting = label.removeprefix("n")
        elif experiment == "ablation":
            setting = f"{row['attackers'][0]} of 20"
        else:
            setting = f"{row['fraction']:g}"
        all_caught = [
            last for last, caught, attackers in
            zip(row["last_caught_round"], row["attackers_caught"], row["attackers"], strict=True)
            if caught == attackers and last == last
        ]  # fmt: skip
        last = (
            f"{statistics.median(all_caught):g} ({len(all_caught)}/{len(row['acc'])})"
            if all_caught
            else f"– (0/{len(row['acc'])})"
        )
        lines.append(
            f"| {setting} | {row['method']} | {shown(row['acc'], 3)} "
            f"| {shown_seed_rates(row['fp'], row['honest_rounds'])} "
            f"| {shown_seed_rates(row['fn'], row['attacker_rounds'])} "
            f"| {shown_seed_rates(row['honest_excluded'], honest_clients)} "
            f"| {shown_seed_rates(row['attackers_caught'], row['attackers'])} | {last} |"
        )
    return "\n".join(lines) + "\n"


def results_json(name: str) -> dict[str, Any]:
    import json

    return json.loads((RESULTS / f"{name}.json").read_text())


EMA_RULES = {"fedavg": "FedAvg", "median": "median", "trimmed_mean": "trimmed mean",
             "krum": "Krum", "zeno": "Zeno", "ema": "EMA"}  # fmt: skip


def ema_paper_block() -> str:
    """EMA's experiments (benchmarks/ema_paper.py): test accuracy per rule, no attack and
    each attack and fraction, mean ± t-interval [seeds]."""
    rows = results_json("ema-paper")["rows"]
    scenarios = sorted(
        {(r["attack"], r["fraction"]) for r in rows}, key=lambda a: (a[0] != "none", a)
    )
    names = [
        ("no attack" if a == "none" else f"{a.replace('_', ' ')}, {f:.0%}") for a, f in scenarios
    ]
    lines = [f"| test ACC | {' | '.join(names)} |", "|---" * (len(scenarios) + 1) + "|"]
    for rule, label in EMA_RULES.items():
        cell = {(r["attack"], r["fraction"]): r["acc"] for r in rows if r["rule"] == rule}
        lines.append(f"| {label} | {' | '.join(shown(cell[s], 3) for s in scenarios)} |")
    return "\n".join(lines) + "\n"


def ema_pretest_block() -> str:
    """The share of coordinates the pre-tests call normal, per seed, as an interval."""
    runs = results_json("ema-paper")["pretest"]
    return (
        "| test (α = 0.05) | coordinates tested | share called normal |\n|---|---|---|\n"
        + "".join(
            f"| {label} | {runs[0]['n_tests']:,} | {shown((r[key] * 100 for r in runs), 1)} % |\n"
            for label, key in (
                ("Shapiro–Wilk", "shapiro_rate"),
                ("Anderson–Darling", "anderson_rate"),
            )
        )
    )


def noniid_cv_block() -> str:
    """The CV of client losses on the trained model (benchmarks/noniid_cv.py) per
    dataset, partition and client count, and how many seeds the threshold calls
    non-IID."""
    record = results_json("noniid-cv")
    runs = [r for r in record["runs"] if r.get("cv_mse") is not None]
    lines = [
        "| data | partition | clients (median size) | CV, MSE loss | CV, cross-entropy "
        f"| seeds called non-IID at {record['threshold']:g} |",
        "|---|---|---|---|---|---|",
    ]
    groups = sorted({(r["dataset"], r["partition"], r["clients"]) for r in runs},
                    key=lambda g: (g[0], g[1] != "iid", g[1], g[2]))  # fmt: skip
    for dataset, partition, clients in groups:
        mine = [
            r
            for r in runs
            if (r["dataset"], r["partition"], r["clients"]) == (dataset, partition, clients)
        ]
        sizes = statistics.median(r["median_client_size"] for r in mine)
        called = sum(r["cv_mse"] > record["threshold"] for r in mine)
        lines.append(
            f"| {dataset} | {partition} | {clients} ({sizes:g}) | {plain(r['cv_mse'] for r in mine)} "
            f"| {plain(r['cv_cross_entropy'] for r in mine)} | {called} of {len(mine)} |"
        )
    return "\n".join(lines) + "\n"


def fedlag_block() -> str:
    """FedLag's stability claim (benchmarks/fedlag_stability.py): final test accuracy and
    its wobble over the last rounds, per Dirichlet α and method."""
    rows = results_json("fedlag-stability")["rows"]
    methods = {"fedavg": "FedAvg", "fedprox": "FedProx (μ = 0.01)", "fedlag": "FedLag"}
    lines = [
        "| Dirichlet α | " + " | ".join(f"{m}: ACC / wobble" for m in methods.values()) + " |",
        "|---" * (len(methods) + 1) + "|",
    ]
    for alpha in sorted({r["alpha"] for r in rows}):
        cell = {r["method"]: r for r in rows if r["alpha"] == alpha}
        shown_methods = [
            f"{plain(cell[m]['acc'])} / {plain(cell[m]['last_rounds_acc_std'])} [{len(cell[m]['acc'])}]"
            for m in methods
        ]
        lines.append(f"| {alpha:g} | {' | '.join(shown_methods)} |")
    return "\n".join(lines) + "\n"


def fedlag_by_seed(
    rows: list[Row], alpha: float, method: str, key: str
) -> dict[tuple[str, int], float]:
    """One method's ``key`` values at ``alpha`` from FedLag's stability record, keyed as
    :func:`tasks.statistics.seed_difference` pairs them: ``(key, seed)``."""
    cell = next(r for r in rows if r["alpha"] == alpha and r["method"] == method)
    return {(key, seed): v for seed, v in zip(cell["seed"], cell[key], strict=True)}


def fedlag_paired() -> Paired:
    """FedLag and FedProx against FedAvg per α, seed by seed (a seed fixes the partition
    and initial model of all three): final test accuracy and the wobble (lower is
    steadier), Holm over the whole table."""
    from tasks.statistics import seed_difference

    rows = results_json("fedlag-stability")["rows"]
    tests = [
        (
            method,
            f"{alpha:g}, {measure}",
            seed_difference(
                fedlag_by_seed(rows, alpha, method, key), fedlag_by_seed(rows, alpha, "fedavg", key)
            ),
        )
        for measure, key in (("ACC", "acc"), ("wobble", "last_rounds_acc_std"))
        for alpha in sorted({r["alpha"] for r in rows})
        for method in ("fedlag", "fedprox")
    ]
    return Paired(tests, "fedavg", "Dirichlet α, measure", "value")


def privacy_block() -> str:
    """Central DP-FedAvg at several noise multipliers, per model (benchmarks/privacy.py):
    ε, test scores and per-site scores, mean ± t-interval [seeds]."""
    cells = results_json("privacy-breastmnist")["cells"]
    lines = [
        "| model | noise multiplier | ε after 20 rounds | test ACC | test AUC "
        "| worst-site ACC | site ACC std |",
        "|---|---|---|---|---|---|---|",
    ]
    models = {"small_cnn": "small CNN", "logreg": "logistic"}
    settings = distinct(({"key": (c["model"], c["noise_multiplier"])} for c in cells), "key")
    for model, noise in settings:
        runs = [
            c["metrics"] for c in cells if (c["model"], c["noise_multiplier"]) == (model, noise)
        ]
        epsilon = runs[0]["privacy_epsilon"]
        scores = [
            shown((r[k] for r in runs), 3)
            for k in ("test_acc", "test_auc", "site_acc_worst", "site_acc_std")
        ]
        lines.append(
            f"| {models.get(model, model)} | {'off' if noise is None else f'{noise:g}'} "
            f"| {'–' if epsilon is None else f'{epsilon:.4g}'} | {' | '.join(scores)} |"
        )
    return "\n".join(lines) + "\n"


def default_pipeline_block() -> str:
    """The committed DVC baseline (``make run``: reports/metrics.json), as a table."""
    import json

    metrics = json.loads((REPO / "reports" / "metrics.json").read_text())
    lines = ["| split | AUC | ACC | ECE (15 bins) | Brier |", "|---|---|---|---|---|"]
    for split in ("test", "val"):
        values = " | ".join(
            f"{metrics[f'{split}_{k}']:.3f}" for k in ("auc", "acc", "ece", "brier")
        )
        lines.append(f"| {'validation' if split == 'val' else split} | {values} |")
    lines += [
        "",
        "| per site (its own held-out split) | figure |",
        "|---|---|",
        f"| worst ACC | {metrics['site_acc_worst']:.3f} (site {metrics['site_worst']}) |",
        f"| best ACC | {metrics['site_acc_best']:.3f} (site {metrics['site_best']}) |",
        f"| ACC std over sites | {metrics['site_acc_std']:.3f} |",
        f"| sites at the 0.8 target | {metrics['sites_at_target']:.0%} |",
        f"| rounds to the target (pooled test ACC) | {metrics['rounds_to_target']} |",
    ]
    return "\n".join(lines) + "\n"


def table(header: tuple[str, ...], rows: Iterable[tuple[Any, ...]]) -> str:
    """A markdown table of ``rows`` under ``header``."""
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def loopback_block() -> str:
    """Real sites on loopback beside Flower's FedAvg and the simulation
    (benchmarks/federation_loopback.py)."""
    r = results_json("federation-loopback")
    mb = r["mb_per_site_round"]
    rows = [
        (f"max \\|sites − simulation\\| (final global model, {r['rounds']} rounds)",
         f"**{r['max_abs_diff_vs_simulation']:.1g}**" + (" (bit-identical)" if r["max_abs_diff_vs_simulation"] == 0 else ""), "≤ 1e-6"),
        (f"{r['sites']} sites × {r['rounds']} rounds end to end: at the sites / simulated",
         f"{r['end_to_end_s']:.0f} s / {r['simulated_end_to_end_s']:.1f} s", ""),
        ("fedsieve, seconds per round", f"{r['round_s']:.1f}", ""),
        ("Flower's FedAvg, seconds per round", f"{r['flower_fedavg_round_s']:.1f}", ""),
        ("`round_time_over_flower_fedavg`", f"**{r['round_time_over_flower_fedavg']:.2f}**",
         ratio_check(r["round_time_over_flower_fedavg"], 0.1, at_most=True)),
        ("the same round simulated in-process", f"{r['simulated_round_s']:.2f} s", ""),
        ("`round_overhead_s` (sites − simulated)", f"{r['round_overhead_s']:.1f} s",
         ratio_check(r["round_overhead_s"], 5, at_most=True)),
        ("MB per site and round, hub → site (train + scoring) / site → hub",
         f"{mb['to_site']:.2f} / {mb['from_site']:.2f}", ""),
        ("an unregistered key", "refused" if r["unregistered_refused"] else "**accepted**", ""),
        (f"a ResNet-50-sized vector ({r['transport_94mb']['megabytes']:g} MB) to "
         f"{r['transport_94mb']['sites']} sites and back",
         f"{r['transport_94mb']['round_trip_s']:.1f} s, "
         + ("intact" if r["transport_94mb"]["echoed_intact"] else "**damaged**"), "crosses"),
    ]  # fmt: skip
    return table(("measure", "figure", "goal"), rows)


def loopback_own_data_block() -> str:
    """The pilot on the sites' own image folders with a hub that holds no data
    (benchmarks/federation_loopback.py, ``own_data``)."""
    r = results_json("federation-loopback")["own_data"]
    kinds = ", ".join(f"{name} {kind.upper()}" for name, kind in r["sites"].items())
    rows = [
        ("sites and their images", kinds, ""),
        ("`hub_data_files_opened` (its data root holds the dataset's files)",
         f"**{r['hub_data_files_opened']}**", "0"),
        ("the count's control: one open of a data-root file by a process of the hub's environment",
         "counted" if r["audit_hook_counted_a_control_open"] else "**not counted**", "counted"),
        (f"`max_abs_diff_vs_simulation` (final global model, {r['rounds']} rounds)",
         f"**{r['max_abs_diff_vs_simulation']:.1g}**", "≤ 1e-6"),
        ("`pooled_auc_error` (pooled histograms vs the pooled predictions' AUC)",
         f"**{r['pooled_auc_error']:.1g}**", "≤ 1e-3"),
        ("`second_run_ok` (the same run again, its own rounds only)",
         "yes" if r["second_run_ok"] else "**no**", "yes"),
        (f"`site_restart_rejoined_s` (SIGKILL, restarted {r['site_restart_after_s']:g} s later)",
         f"{r['site_restart_rejoined_s']:.0f} s", ""),
    ]  # fmt: skip
    return table(("measure", "figure", "goal"), rows)


# Flower 1.32.1's SuperNode looks for work every 3 s, hard-coded
# (flwr/supernode/start_client_internal.py), and starts a process per message
SUPERNODE_POLL_S = 3.0


def flower_floor(phases: dict[str, float]) -> float:
    """What one exchange cannot come under with Flower's design, whatever the site does:
    the SuperNode's poll, the message's own process start (measured) and the work itself."""
    return SUPERNODE_POLL_S + phases["start_s"] + phases["work_s"]


def loopback_phases_block() -> str:
    """A round at real sites timed by phase, at 3 and 10 sites (benchmarks/
    federation_loopback.py ``--phases-only``, ``by_phase``): per exchange, the medians of
    each site process's phases and of the hub's wall time."""
    by_phase = results_json("federation-loopback")["by_phase"]
    names = {
        "start_s": "process start, Python and Flower's runtime",
        "imports_s": "the ClientApp's imports (without a warm trainer: torch, the engine)",
        "flower_s": "Flower: the app loaded, the message handed over",
        "handoff_s": "to the site's warm trainer and back (Unix socket)",
        "data_s": "the task checked, the site's data at hand",
        "work_s": "training / scoring",
        "outside_s": "outside any site process (polls, spawn, TLS, serialisation)",
        "wall_s": "**the exchange, at the hub**",
    }
    columns = [(n, kind) for n in by_phase for kind in by_phase[n]["phases"]]
    header = ("seconds (median)", *(f"{n} sites, {kind}" for n, kind in columns))
    rows = [
        (label, *(f"{by_phase[n]['phases'][kind].get(key, 0.0):.2f}" for n, kind in columns))
        for key, label in names.items()
    ]
    rows.append((
        "answers from a warm trainer",
        *(f"{by_phase[n]['phases'][kind].get('warm_share', 0.0):.0%}" for n, kind in columns),
    ))  # fmt: skip
    floors = {(n, kind): flower_floor(by_phase[n]["phases"][kind]) for n, kind in columns}
    rows.append((
        f"Flower's floor: the SuperNode's {SUPERNODE_POLL_S:g} s poll + the process start + the work",
        *(f"{floors[column]:.2f}" for column in columns),
    ))  # fmt: skip
    rows.append((
        "**the exchange over that floor**",
        *(f"{by_phase[n]['phases'][kind]['wall_s'] - floors[n, kind]:.2f}" for n, kind in columns),
    ))  # fmt: skip
    totals = [
        ("a round at the sites (`round_s`)", "round_s"),
        ("the same round simulated here (`simulated_round_s`)", "simulated_round_s"),
        ("Flower's FedAvg on the same SuperNodes (`flower_fedavg_round_s`)", "flower_fedavg_round_s"),
        ("`round_time_over_flower_fedavg`", "round_time_over_flower_fedavg"),
    ]  # fmt: skip
    for label, key in totals:  # a round's figures, under each count's train column
        rows.append(
            (label, *(f"{by_phase[n][key]:.2f}" if kind == "train" else "" for n, kind in columns))
        )
    return table(header, rows)


def ratio_check(value: float, goal: float, *, at_most: bool) -> str:
    met = value <= goal if at_most else value >= goal
    return f"{'≤' if at_most else '≥'} {goal:g} " + ("✓" if met else "✗")


def cross_device_block(device: str = "cpu") -> str:
    """The cross-device runs (benchmarks/cross_device.py) against their goals: process
    wall time and the rounds' own time, both sides, and the large federations."""
    r = results_json(f"cross-device-{device}")
    lr, goals = r["lr_mnist"], r["targets"]
    rows = [
        ("LR-MNIST shape, fedsieve, process start to exit",
         f"**{lr['fedsieve_s']:.2f} s**", ratio_check(lr["fedsieve_s"], goals["lr_mnist_fedsieve_s"], at_most=True)),
        ("... of which its 100 rounds", f"{lr['fedsieve_rounds_s']:.2f} s", ""),
    ]  # fmt: skip
    if "flower_s" in lr:
        rows += [
            ("LR-MNIST shape, Flower, process start to exit", f"{lr['flower_s']:.2f} s", ""),
            ("... of which its 100 rounds", f"{lr['flower_rounds_s']:.2f} s", ""),
            ("`flower_over_fedsieve` (processes)", f"**{lr['flower_over_fedsieve']:.1f}**",
             ratio_check(lr["flower_over_fedsieve"], goals["flower_over_fedsieve"], at_most=False)),
            ("Flower over fedsieve, the rounds alone", f"{lr['flower_over_fedsieve_rounds']:.1f}", ""),
            ("accuracy, round 1 → 100 (fedsieve / Flower)",
             f"{lr['fedsieve_acc'][0]:.3f} → {lr['fedsieve_acc'][-1]:.3f} / "
             f"{lr['flower_acc'][0]:.3f} → {lr['flower_acc'][-1]:.3f}", ""),
            ("largest accuracy difference in any round", f"{lr['max_abs_acc_difference']:.1g}", "sampling noise"),
        ]  # fmt: skip
    for key, label, goal in (
        ("ten_thousand_clients", "10,000 clients, 50 rounds of 100, small CNN", "ten_thousand"),
        ("hundred_thousand_clients", "100,000 clients, partition + 1 round of 100", "hundred_thousand"),
    ):  # fmt: skip
        if key not in r:
            continue
        run = r[key]
        rows += [
            (f"{label}: process start to exit", f"**{run['wall_s']:.1f} s**",
             ratio_check(run["wall_s"], goals[f"{goal}_wall_s"], at_most=True)),
            ("... partition / rounds", f"{run['partition_s']:.2f} s / {run['rounds_s']:.1f} s", ""),
            ("... peak resident memory", f"{run['peak_rss_gb']:.2f} GB",
             ratio_check(run["peak_rss_gb"], goals[f"{goal}_peak_gb"], at_most=True)),
        ]  # fmt: skip
        if "peak_gpu_gb" in run:
            rows.append(("... peak GPU memory (allocated)", f"{run['peak_gpu_gb']:.2f} GB", ""))
        if "floor" in run:
            floor = run["floor"]
            rows += [
                ("... its 50 rounds' arithmetic at this CPU's best measured rate "
                 f"({floor['gflop_per_s']:g} GFLOP/s, a {floor['scoring_gflop']:g}-GFLOP scoring pass)",
                 f"{floor['fifty_rounds_floor_s']:.1f} s", ""),
                (f"... the same, each client's step timed alone ({1000 * floor['client_step_s']:.1f} ms, "
                 f"{floor['client_step_gflop_per_s']:g} GFLOP/s)",
                 f"{floor['fifty_rounds_client_by_client_s']:.1f} s", ""),
            ]  # fmt: skip
    return table(("measure", "figure", "goal"), rows)


def cross_device_profile_block() -> str:
    """Where a cross-device run's time goes, by phase (cProfile, benchmarks/cross_device.py)."""
    profiles = results_json("cross-device-cpu")["profile"]
    names = {
        "lr_mnist": "LR-MNIST, 100 rounds",
        "ten_thousand_10_rounds": "10,000 clients, 10 rounds",
    }
    present = [k for k in names if k in profiles]
    rows = [
        (phase, *(f"{profiles[k]['seconds'][phase]:.2f} s ({100 * profiles[k]['share'][phase]:.0f} %)"
                  for k in present))
        for phase in profiles[present[0]]["seconds"]
    ]  # fmt: skip
    rows.append(("profiled run", *(f"{profiles[k]['profiled_s']:.2f} s" for k in present)))
    return table(("phase", *(names[k] for k in present)), rows)


def flower_race_block() -> str:
    """The Flower race (benchmarks/flower_race.py): per contestant, the process's time
    from start to exit and a round's time, medians over the repeats."""
    import statistics

    r = results_json("flower-race-cpu")
    contestants = {f"fedsieve engine ({b})": e for b, e in r["fedsieve_engine"].items()}
    contestants["Flower 1.32 `run_simulation`"] = r["flower"]
    rows = []
    for name, entry in contestants.items():
        runs = entry["runs"]
        flower = "before_first_client_s" in runs[0]
        # Flower's first round also starts Ray's client actors: its rounds from the second on
        rounds = [t for run in runs for t in (run["round_s"][1:] if flower else run["round_s"])]
        before = [run["before_first_client_s" if flower else "startup_s"] for run in runs]
        rows.append((name, f"{statistics.median(run['wall_s'] for run in runs):.2f} s",
                     f"{statistics.median(rounds):.3f} s", f"{statistics.median(before):.2f} s"))  # fmt: skip
    kinds = {"warm": "own server, warm", "running_server": "against a running server"}
    for kind, label in kinds.items():
        walls = r["fedsieve_run"][kind]["walls_s"]
        rows.append((f"`fedsieve run` ({label})", f"{statistics.median(walls):.2f} s "
                     f"({min(walls):.1f}–{max(walls):.1f})", "", ""))  # fmt: skip
    header = ("contestant", "process, start to exit", "a round (median)", "before the first round")
    return table(header, rows) + (
        f"\n{len(runs)} repeats; `flower_over_fedsieve` (processes, the faster engine backend): "
        f"**{r['flower_over_fedsieve']}** by the medians, "
        f"{r['flower_over_fedsieve_min_of_repeats']} by the fastest runs (goal ≥ 4).\n"
    )


def overhead_block() -> str:
    """What a user waits for beside the training (benchmarks/overhead.py)."""
    r = results_json("overhead-cpu")
    run, dvc = r["attribution_fedsieve_run"], r["dvc"]
    goal = run["target_overhead_s"]
    return table(("measure", "figure", "goal"), [
        ("`make run` (`fedsieve dvc repro`: all DVC stages, one Prefect server)",
         f"{dvc['make_run_fedsieve_dvc_repro_s']:.1f} s", "≤ 60 s " + ("✓" if dvc["make_run_fedsieve_dvc_repro_s"] <= 60 else "✗")),
        (f"`fedsieve run` ({r['rounds']} rounds), own temporary server: wall", f"{run['wall_s']:.1f} s", ""),
        ("of which training and evaluation", f"{run['compute_s']:.1f} s", ""),
        ("overhead beside the compute", f"**{run['overhead_s']:.1f} s**", ratio_check(run["overhead_s"], goal, at_most=True)),
        ("the same against an already running Prefect server", f"{run['running_server_wall_s']:.1f} s", ""),
        ("importing torch / Prefect / MLflow / the pipeline's flows",
         " / ".join(f"{r['imports'][k]:.1f} s" for k in ("import_torch_s", "import_prefect_s", "import_mlflow_s", "import_flows.pipeline_s")), ""),
        ("starting a Prefect server", f"{r['prefect']['server_start_s']:.1f} s", ""),
        ("MLflow: store and run created / model logged and registered",
         f"{r['mlflow_tracker']['store_and_run_created']:.1f} s / {r['mlflow_tracker']['log_and_register_model']:.1f} s", ""),
    ])  # fmt: skip


def federation_smoke_block() -> str:
    """The hub's compose stack and three site containers (scripts/federation_smoke.py)."""
    r = results_json("federation-smoke")
    steps = list(r["steps_s"].items())
    site, hub = r["images"]["fedsieve-site:cpu"], r["images"]["fedsieve:cpu"]
    rows = [
        ("site image", f"{site['gb']} GB: environment layer {site['layers_mb']['environment']:,.0f} MB, "
         f"source layer {site['layers_mb']['source']} MB (what a source edit ships)"),
        ("hub image", f"{hub['gb']} GB: environment {hub['layers_mb']['environment']:,.0f} MB, "
         f"Flower's CLI {hub['layers_mb']['flower_cli']:.0f} MB, source {hub['layers_mb']['source']} MB"),
        *((step, f"{seconds:.0f} s") for step, seconds in steps),
        ("the whole smoke", f"{r['total_s']:.0f} s"),
        ("max \\|sites in containers − in-process simulation\\|", f"**{r['max_abs_diff_vs_simulation']}**"),
        *((check, "yes" if ok else "**no**") for check, ok in r["checks"].items()),
    ]  # fmt: skip
    return table(("measure", "figure"), rows)


def grid_throughput_block() -> str:
    """A comparison grid's cells against the engine alone (benchmarks/grid_throughput.py)."""
    r = results_json("grid-throughput-cpu")
    one, goals = r["one_cell"], r["targets"]
    return table(("measure", "figure", "goal"), [
        ("grid wall time / engine-only wall time for the same cells",
         f"{r['grid_wall_s']} s / {r['engine_only_s']} s = **{r['grid_over_engine']}**",
         ratio_check(r["grid_over_engine"], goals["grid_over_engine"], at_most=True)),
        ("cells per hour", f"**{r['cells_per_hour']}**", ratio_check(r["cells_per_hour"], goals["cells_per_hour"], at_most=False)),
        ("compute floor: training images / best measured local throughput",
         f"{r['compute_floor']['floor_cells_per_hour']} cells/h", ""),
        ("one cell: time beside local training (screen, aggregation, evaluation, tracking)",
         f"{100 * one['beside_training_share_of_training']:.0f} %", "< 30 % " + ("✓" if one["beside_training_share_of_training"] < 0.3 else "✗")),
        *((f"engine only, {k.replace('x', ' cells × ')} thread(s)", f"{v['wall_s']} s ({v['cells_per_hour']} cells/h)", "")
          for k, v in r["engine_only_by_cells_x_threads"].items()),
        *((f"local training images/s, {k.replace('x', ' cells × ')} thread(s)", f"{v:,.0f}", "")
          for k, v in r["local_training_images_per_s"].items()),
    ])  # fmt: skip


RULE_NAMES = {"fedavg": "FedAvg", "ema": "EMA", "krum": "Krum", "multi_krum": "Multi-Krum",
              "fedlag": "FedLag (exact)", "zeno": "Zeno", "bulyan": "Bulyan"}  # fmt: skip


def aggregation_block(device: str) -> str:
    """Per rule, the median time of a call per client count (benchmarks/aggregation.py),
    with the memory floor's multiple and the goal where one was set."""
    r = results_json(f"aggregation-{device}")
    rows = r["results"]
    counts = sorted({row["n"] for row in rows})
    rules = sorted({row["rule"] for row in rows}, key=lambda rule: min(
        row["median_ms"] for row in rows if row["rule"] == rule))  # fmt: skip
    cell = {(row["rule"], row["n"]): row for row in rows}
    goal_n = 50 if 50 in counts else counts[-1]
    out = []
    for rule in rules:
        times = [f"{cell[rule, n]['median_ms']:,.1f}" if (rule, n) in cell else "–" for n in counts]
        at = cell.get((rule, goal_n), {})
        goal = at.get("target_ms")
        check = ratio_check(at["median_ms"], goal, at_most=True) if goal else ""
        floor = f"{at['x_floor']:.1f}×" if at else "–"
        out.append((RULE_NAMES.get(rule, rule.replace("_", " ")), *times, floor, check))
    header = (
        "rule",
        *(f"n = {n} (ms)" for n in counts),
        f"× floor at n = {goal_n}",
        f"goal at n = {goal_n} (ms)",
    )
    return table(header, out)  # fmt: skip


def pid_cost_block() -> str:
    """PID-MADE's scoring cost beside Krum and the geometric median (benchmarks/pid_cost.py)."""
    r = results_json("pid-cost-cpu")

    def ms(value: float) -> str:
        return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.1f} ms"

    rows = [(row["n"], *(ms(row[k]["median_ms"]) for k in ("pid_made", "krum", "geometric_median")))
            for row in r["results"]]  # fmt: skip
    fits = r["fits"]
    rows.append(("log-log slope, n ≥ 20",
                 *(f"{fits[k]['n_ge_20']['loglog_slope']:.2f}" for k in ("pid_made", "krum", "geometric_median"))))  # fmt: skip
    return table(("clients", "PID-MADE", "Krum", "geometric median"), rows)


def round_speed_block(device: str) -> str:
    """Batched against sequential client training (benchmarks/round_speed.py)."""
    r = results_json("round-speed-cuda" if device == "cuda" else "round-speed-cpu-quick")
    cnn = r["small_cnn_round"]
    rows = [(f"small-CNN round, {cnn['clients']} clients, batched vs sequential",
             f"**{cnn['batched']['median_s']} s vs {cnn['sequential']['median_s']} s: {cnn['batched_speedup']}×**",
             f"≥ {cnn['target_speedup_h100']:g}× on an H100 " + ("✓" if cnn["batched_speedup"] >= cnn["target_speedup_h100"] else "✗") if device == "cuda" else "")]  # fmt: skip
    resnet = r.get("resnet18_round_vs_centralized_epoch")
    if resnet:  # the goals were set for an H100
        rows.append(("ResNet-18 batched round vs one centralized epoch",
                     f"**{resnet['batched_round']['median_s']} s vs {resnet['centralized_epoch']['median_s']} s: {resnet['round_over_epoch']}×**",
                     ratio_check(resnet["round_over_epoch"], resnet["target_round_over_epoch"], at_most=True) if device == "cuda" else ""))  # fmt: skip
    memory = r.get("resnet18_100_clients_memory", {})
    if "peak_allocated_gb" in memory or "deltas_gb" in memory:
        rows.append((f"{memory['clients']}-client ResNet-18 batched round: the updates kept",
                     f"{memory['deltas_gb']} GB, {memory['round_s']} s", ""))  # fmt: skip
    return table(("figure", "measured", "goal"), rows)


def speed_notes_block() -> str:
    """The single measurements of the pre-test and the portable-numerics pin."""
    pre, pin = results_json("pretest-cpu"), results_json("portable-numerics")
    pinned, unpinned = pin["results"]["pinned"], pin["results"]["unpinned"]
    return table(("measure", "figure", "goal"), [
        (f"normality pre-test, {pre['n_coords']:,} coordinates × {pre['n_clients']} clients, both tests",
         f"**{pre['seconds']:.1f} s wall**, {pre['cpu_seconds']:.1f} s CPU", ratio_check(pre["seconds"], pre["target_seconds"], at_most=True)),
        ("the default pipeline's round, portable numerics pinned / not pinned (median)",
         f"{pinned['seconds_per_round_median']:.2f} s / {unpinned['seconds_per_round_median']:.2f} s "
         f"({pin['slowdown_median']:.2f}×; best rounds {pin['slowdown_best']:.2f}×)", ""),
        ("weights hashes over the processes, pinned / not pinned",
         f"{len(pinned['weights_sha256'])} / {len(unpinned['weights_sha256'])}", "1 each"),
    ])  # fmt: skip


def resnet18_block() -> str:
    """The ResNet-18 federation (``make bench-resnet18``): the selected round, the last
    round and the swing of test accuracy, from its JSON and per-round CSV."""
    import csv

    r = results_json("resnet18-breastmnist-cpu")
    m = r["metrics"]
    with (RESULTS / "resnet18-breastmnist-rounds.csv").open() as handle:
        rounds = [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(handle)]
    last, late = rounds[-1], [row["test_acc"] for row in rounds if row["round"] >= 10]
    return table(("measure", "figure"), [
        (f"selected round (best validation AUC of {int(m['rounds'])})", f"**{int(m['selected_round'])}**"),
        ("its test ACC / AUC", f"**{m['test_acc']:.3f} / {m['test_auc']:.3f}**"),
        ("its validation ACC / AUC", f"{m['val_acc']:.3f} / {m['val_auc']:.3f}"),
        (f"the last round's test ACC / AUC (round {int(last['round'])})", f"{last['test_acc']:.3f} / {last['test_auc']:.3f}"),
        ("test ACC from round 10 on, lowest – highest", f"{min(late):.3f} – {max(late):.3f}"),
        ("wall time, 2-core CPU", f"{r['wall_s'] / 60:.0f} min ({r['note']})"),
    ])  # fmt: skip


PAPER_FILTER = "pid_made_fedavg"  # PID-MADE as the paper writes it, in front of FedAvg


def filters_paired(dataset: str) -> Paired:
    """Each filter that no choice was made on with these seeds (no round cut) against the
    paper's PID-MADE, seed by seed over all ten, Holm over the table."""
    rows = with_halts(load(f"{dataset}-filters"))
    methods = [m for m in distinct(rows) if m != PAPER_FILTER and not m.endswith("_cut_fedavg")]
    fractions = sorted({r["fraction"] for r in rows if r["attack"] != "none"})
    return Paired(
        [
            (
                method,
                f"{fraction:g}",
                worst_differences(rows, method, PAPER_FILTER, fraction, HEADLINE[dataset]),
            )
            for method in methods
            for fraction in fractions
        ],
        PAPER_FILTER,
        "fraction",
    )


def worst_differences(
    rows: list[Row], method: str, reference: str, fraction: float, metric: str
) -> tuple[Any, float]:
    """``method``'s per-seed worst case at ``fraction`` minus ``reference``'s, and the
    exact sign-flip p-value over seeds (:func:`tasks.statistics.seed_difference`)."""
    from tasks.statistics import seed_difference

    mine, theirs = (
        {("worst", s): v for s, v in worst_by_seed(rows, m, fraction, metric)[0].items()}
        for m in (method, reference)
    )
    return seed_difference(mine, theirs)


@dataclass(frozen=True)
class Paired:
    """Methods against one reference, seed by seed: per test (method, ``label``'s value,
    (per-seed differences, sign-flip p)). Holm adjusts over the table, or over each
    value's tests where ``family_per_value`` (separate regimes, separate questions); the
    claims ledger reads its verdicts from the same adjustment the table shows."""

    tests: list[tuple[str, str, tuple[Any, float]]]
    reference: str
    label: str
    statistic: str = "worst case"
    family_per_value: bool = False

    def families(self) -> list[list[int]]:
        """The tests' indices, one list per family Holm adjusts over."""
        families: dict[str, list[int]] = {}
        for index, (_, value, _) in enumerate(self.tests):
            families.setdefault(value if self.family_per_value else "", []).append(index)
        return list(families.values())

    def index_of(self, method: str, value: str) -> int | None:
        """The index of ``method``'s test at ``value``, or None where the table has none."""
        for index, (tested, tested_value, _) in enumerate(self.tests):
            if (tested, tested_value) == (method, value):
                return index
        return None

    def family_size(self, index: int) -> int:
        """How many tests Holm adjusts test ``index`` with."""
        return next(len(family) for family in self.families() if index in family)

    def holm(self) -> list[float]:
        """Each test's p, Holm-adjusted within its family (statsmodels)."""
        from statsmodels.stats.multitest import multipletests

        adjusted = [1.0] * len(self.tests)
        for members in self.families():
            holm = multipletests([self.tests[i][2][1] for i in members], method="holm")[1]
            for i, p_holm in zip(members, holm, strict=True):
                adjusted[i] = float(p_holm)
        return adjusted


def against_block(paired: Paired) -> str:
    """A paired table: per test the mean difference ± t-interval, the exact p, Holm's
    adjustment (:meth:`Paired.holm`), and, where the adjusted p is not below 0.05, the
    smallest difference the test had an 80 % chance to detect (statsmodels' one-sample
    t power, from the differences' spread)."""
    from statsmodels.stats.power import TTestPower

    lines = [
        f"| method | {paired.label} | {paired.statistic} minus {paired.reference}'s "
        "| p (sign-flip over seeds) | p, Holm | smallest detectable difference (80 % power) |",
        "|---|---|---|---|---|---|",
    ]
    for (method, value, (differences, p)), p_holm in zip(paired.tests, paired.holm(), strict=True):
        _, std, _ = interval(list(differences))
        if p_holm < 0.05:
            detectable = "–"
        elif not std > 0:
            detectable = "none: equal in every seed"
        else:
            d = TTestPower().solve_power(nobs=len(differences), alpha=0.05, power=0.8)
            detectable = f"{d * std:.2f}"
        lines.append(
            f"| {method} | {value} | {shown(differences, 3)} | {p:.3g} | {p_holm:.3g} "
            f"| {detectable} |"
        )
    return "\n".join(lines) + "\n"


def regime_paired(names: list[str], dataset: str, label: str) -> Paired:
    """Each method of a regime against FedAvg at the regime's fraction, seed by seed: the
    per-seed worst case over the regime's attacks, one test per method and record
    (``label`` names what tells the records apart; Holm within each record)."""
    tests = []
    for name in names:
        rows = with_halts(load(name))
        fraction = next(r["fraction"] for r in rows if r["attack"] != "none")
        value = name.rsplit("-", 1)[-1] if len(names) > 1 else f"{fraction:g}"
        tests += [
            (method, value, worst_differences(rows, method, "fedavg", fraction, HEADLINE[dataset]))
            for method in distinct(rows)
            if method != "fedavg"
        ]
    return Paired(tests, "fedavg", label, family_per_value=len(names) > 1)


def faults_block() -> str:
    """docs/operations.md's fault table, from ``make container-faults``' JSON record
    (scripts/container_faults.py): one row per fault, in the order they ran."""
    record = results_json("container-faults")
    rows = [
        (name, _injected(fault), _flow_run(fault), _mlflow_run(fault), _afterwards(fault))
        for name, fault in record.items()
        if isinstance(fault, dict)
    ]
    return table(("fault", "injected at", "flow run", "MLflow run", "afterwards"), rows)


def _injected(fault: dict[str, Any]) -> str:
    if "injected_at_round" not in fault:
        return "round 3" if "crashed_after_s" in fault else "round 12 (training done)"
    pace = f", {fault['round_s_before']:.1f} s a round" if "round_s_before" in fault else ""
    return f"round {fault['injected_at_round']}{pace}"


def _flow_run(fault: dict[str, Any]) -> str:
    if "crashed_after_s" in fault:
        return f"Crashed after {fault['crashed_after_s']:.0f} s"
    return str(fault.get("flow_run", "COMPLETED")).capitalize()


def _mlflow_run(fault: dict[str, Any]) -> str:
    if "mlflow_killed_after_s" in fault:
        return f"KILLED after {fault['mlflow_killed_after_s']:.0f} s"
    if fault.get("mlflow_run") not in (None, "FINISHED"):
        return f"{fault['mlflow_run']}, {fault.get('rounds_before_resume', '?')} rounds"
    return "FINISHED, every round, model version"


def _afterwards(fault: dict[str, Any]) -> str:
    said = []
    if "unhealthy_after_s" in fault:
        shown = ", ".join(f"{name} {after:.0f} s" if after is not None else f"{name} never"
                          for name, after in fault["unhealthy_after_s"].items())  # fmt: skip
        said.append(f"Docker showed the servers unhealthy after: {shown}")
    if "started_again_by_its_restart_policy" in fault:
        said.append("came back by itself" if fault["started_again_by_its_restart_policy"]
                    else "still down 10 s later; started again then")  # fmt: skip
    if fault.get("away_for_good_s"):
        said.append(f"MLflow down {fault['away_for_good_s']} s, then started again")
    if "subflow_runs" in fault:
        said.append("subflow runs " + ", ".join(sorted(set(fault["subflow_runs"].values()))))
    if "closing_runs" in fault:
        states = list(fault["closing_runs"].values())
        said.append(
            f"{len(states)} closing run(s) on the operations worker: "
            + ", ".join(f"{states.count(s)} {s.lower()}" for s in sorted(set(states)))
        )
    if fault.get("tracking_failed_midway"):
        said.append(
            "tracking failed midway and the lost rounds were logged when the store answered"
        )
    if "model_version_after_the_run" in fault:
        if not fault["model_version_after_the_run"]:
            said.append("no model version after the run (it failed in one line)")
        elif fault.get("tracking_failed_then_recovered"):
            said.append(
                "tracking failed in the evaluate stage; once MLflow answered, the final "
                "results and the model were logged again in the same run and registered"
            )
        else:
            said.append("model version registered by the run itself")
    if any(key.startswith("resumed") for key in fault):
        said.append("resumed into the same MLflow run: FINISHED, every round, model version")
    if "rounds_logged_after_outage" in fault:
        said.append(
            f"{fault['rounds_logged_after_outage']} round(s) logged after the store came back"
        )
    return "; ".join(said)


def claims_block(ledger: Path | None = None) -> str:
    """Every claim of the ledger (benchmarks/claims.yaml) recomputed from the records."""
    from benchmarks import claims

    lines = ["| id | claim | statistic | test | holds |", "|---|---|---|---|---|"]
    for verdict in claims.verdicts(ledger or claims.LEDGER):
        lines.append(
            f"| {verdict.claim} | {verdict.text} | {verdict.statistic} | {verdict.test} "
            f"| {'yes' if verdict.holds else '**no**'} |"
        )
    return "\n".join(lines) + "\n"


def recorded(name: str) -> bool:
    return (RESULTS / f"robustness-{name}-seeds.csv").exists()


# The paired tables of docs/results.md by block name; the claims ledger names them too
PAIRED_TABLES: dict[str, Callable[[], Paired]] = (
    {"fedlag-stability-paired": fedlag_paired}
    | {
        f"robustness-{dataset}-{regime}-paired": partial(
            regime_paired, [f"{dataset}-{regime}"], dataset, "fraction"
        )
        for dataset in HEADLINE
        for regime in GRID_REGIMES
        if recorded(f"{dataset}-{regime}")
    }
    | {
        f"robustness-{dataset}-filters-paired": partial(filters_paired, dataset)
        for dataset in HEADLINE
        if recorded(f"{dataset}-filters")
    }
    | {
        f"robustness-{dataset}-noniid-paired": partial(
            regime_paired,
            [f"{dataset}-dirichlet-{a}" for a in DIRICHLET if recorded(f"{dataset}-dirichlet-{a}")],
            dataset,
            "α",
        )
        for dataset in HEADLINE
        if any(recorded(f"{dataset}-dirichlet-{alpha}") for alpha in DIRICHLET)
    }
)


def paired_block_of(build: Callable[[], Paired]) -> str:
    return against_block(build())


# Every matrix with per-seed records has its tables in docs/results.md (a test checks it)
BLOCKS: dict[str, Callable[[], str]] = (
    {
        f"robustness-{dataset}-{kind}": partial(builder, dataset)
        for dataset in HEADLINE
        if recorded(dataset)
        for kind, builder in (
            ("learning", learning_block),
            ("headline", headline_block),
            ("paired", paired_block),
            ("rates", rates_block),
        )
    }
    | {"ema-monte-carlo": ema_monte_carlo.table}
    | {"ema-paper": ema_paper_block, "ema-pretest": ema_pretest_block}
    | {"noniid-cv": noniid_cv_block, "fedlag-stability": fedlag_block}
    | {"privacy-breastmnist": privacy_block, "default-pipeline": default_pipeline_block}
    | {"federation-loopback": loopback_block, "flower-race": flower_race_block}
    | {"federation-loopback-own-data": loopback_own_data_block}
    | {"federation-loopback-phases": loopback_phases_block}
    | {
        "pipeline-overhead": overhead_block,
        "federation-smoke": federation_smoke_block,
        "grid-throughput": grid_throughput_block,
        "aggregation-cpu": partial(aggregation_block, "cpu"),
        "aggregation-cuda": partial(aggregation_block, "cuda"),
        "pid-cost": pid_cost_block,
        "round-speed-cuda": partial(round_speed_block, "cuda"),
        "round-speed-cpu": partial(round_speed_block, "cpu"),
        "speed-notes": speed_notes_block,
        "resnet18-breastmnist": resnet18_block,
    }
    | (
        {"cross-device": cross_device_block, "cross-device-profile": cross_device_profile_block}
        if "profile" in results_json("cross-device-cpu")
        else {}
    )
    | (
        {"cross-device-cuda": partial(cross_device_block, "cuda")}
        if (RESULTS / "cross-device-cuda.json").exists()
        else {}
    )
    | {
        f"robustness-{dataset}-{regime}": partial(regime_grid_block, f"{dataset}-{regime}", dataset)
        for dataset in HEADLINE
        for regime in GRID_REGIMES
        if recorded(f"{dataset}-{regime}")
    }
    | (
        {"fedstnn": fedstnn_block}
        if all((RESULTS / f"fedstnn-{n}-seeds.csv").exists() for n in FEDSTNN_CURVES)
        else {}
    )
    | (
        {"fedstnn-image": fedstnn_image_block}
        if (RESULTS / "fedstnn-image-seeds.csv").exists()
        else {}
    )
    | {
        f"pid-made-paper-{experiment}": partial(pid_paper_block, experiment)
        for experiment in PID_PAPER
    }
    | (
        {"pid-made-ablation": ablation_block, "pid-made-ablation-paired": ablation_paired_block}
        if (RESULTS / "pid-made-ablation-seeds.csv").exists()
        else {}
    )
    | (
        {"pid-made-cusum-search": cusum_search_block}
        if (RESULTS / "pid-made-cusum-search.csv").exists()
        else {}
    )
    | {"claims": claims_block}
    | {
        f"robustness-{dataset}-filters": partial(filters_block, dataset)
        for dataset in HEADLINE
        if recorded(f"{dataset}-filters")
    }
    | {
        f"robustness-{dataset}-noniid": partial(regimes_block, dataset)
        for dataset in HEADLINE
        if any(recorded(f"{dataset}-dirichlet-{alpha}") for alpha in DIRICHLET)
    }
    | {name: partial(paired_block_of, build) for name, build in PAIRED_TABLES.items()}
)


# docs/operations.md's fault table, once `make container-faults --results` has recorded it
OPERATIONS = REPO / "docs" / "operations.md"
OPERATIONS_BLOCKS: dict[str, Callable[[], str]] = (
    {"container-faults": faults_block} if (RESULTS / "container-faults.json").exists() else {}
)


def regenerated(
    text: str, blocks: dict[str, Callable[[], str]] | None = None, doc: Path = DOC
) -> tuple[str, list[str]]:
    """``text`` (of ``doc``) with every generated block recomputed, and the names of those
    that changed. A block name no builder knows is an error."""
    blocks = BLOCKS if blocks is None else blocks
    changed = []

    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in blocks:
            raise KeyError(
                f"{doc.relative_to(REPO)} names an unknown generated block {name!r}; "
                f"known: {', '.join(blocks)}"
            )
        body = blocks[name]()
        if body != match["body"]:
            changed.append(name)
        return f"{match[1]}{body}{match[4]}"

    return BLOCK.sub(fill, text), changed


def problems(text: str, ledger: Path | None = None) -> list[str]:
    """What ``--check`` fails on: generated blocks out of date, claims that no longer
    hold, claim ids cited but not in the ledger and claims no sentence cites."""
    from benchmarks import claims

    ledger = ledger or claims.LEDGER
    _, changed = regenerated(text)
    found = [f"generated blocks out of date: {', '.join(changed)}"] if changed else []
    found += [f"claim {v.claim} no longer holds: {v.statistic}; {v.test}"
              for v in claims.verdicts(ledger) if not v.holds]  # fmt: skip
    return found + claims.citation_problems(text, claims.load_ledger(ledger))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 on a difference"
    )
    args = parser.parse_args()
    from benchmarks.claims import LedgerError

    try:
        regenerate(check=args.check)
    except LedgerError as error:  # one line, and nothing written
        sys.exit(str(error))


def regenerate(check: bool) -> None:
    text = DOC.read_text()
    operations = OPERATIONS.read_text()
    if check:
        found = problems(text)
        if found:
            sys.exit("docs/results.md: " + "; ".join(found) + " (run python -m benchmarks.report)")
        _, stale = regenerated(operations, OPERATIONS_BLOCKS, OPERATIONS)
        if stale:
            sys.exit(f"docs/operations.md: generated blocks out of date: {', '.join(stale)}")
        print("docs/results.md: every generated block matches its records and every claim holds")
        return
    text, changed = regenerated(text)
    DOC.write_text(text)
    operations, rewritten = regenerated(operations, OPERATIONS_BLOCKS, OPERATIONS)
    OPERATIONS.write_text(operations)
    changed += rewritten
    print(f"docs: {len(changed)} block(s) rewritten: {', '.join(changed) or 'none'}")
    for problem in problems(text):
        print(f"docs/results.md: {problem}")


if __name__ == "__main__":
    main()
