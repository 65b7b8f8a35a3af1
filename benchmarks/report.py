"""docs/results.md's generated tables: the robustness matrix's, recomputed from the
committed per-seed records, and the EMA Monte Carlo's (seeded, recomputed from code).

    python -m benchmarks.report            # rewrite the generated blocks
    python -m benchmarks.report --check    # exit 1 naming every block that differs

A generated block sits between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->``
in docs/results.md; what is outside the markers (the reading of the numbers) is written
by hand. The records are ``benchmarks/results/robustness-<dataset>-seeds.csv``, one row
per cell and seed, written by ``python -m benchmarks.robustness``. A test regenerates
every block and fails on a difference, so no figure in those tables is typed by hand.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import ema_monte_carlo
from tasks.comparison import interval
from tasks.statistics import paired_differences, rate_interval, worst_per_seed

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOC = REPO / "docs" / "results.md"

# dataset -> the headline metric (BreastMNIST's accuracy sits near its majority share)
HEADLINE = {"digits": "test_acc", "breastmnist": "test_auc"}
LEARNS_BY = 0.02  # a baseline learns when its margin's interval lies above this
PAIRED_AT = (0.2, 0.4)
DIRICHLET = ("0.1", "0.5", "1")  # the label-skew regimes' α, as their files name them
BLOCK = re.compile(
    r"(<!-- report:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /report:(?P=name) -->)", re.S
)

Row = dict[str, Any]


def load(name: str) -> list[Row]:
    """The per-seed records of a matrix (``digits``, ``digits-dirichlet-0.1``...), numbers
    as numbers (None where empty)."""
    path = RESULTS / f"robustness-{name}-seeds.csv"
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        for key, value in row.items():
            if key not in ("method", "attack", "error", "acc_curve"):
                row[key] = None if value == "" else float(value)
        # triggered images sent to the target: the success rate's count
        row["asr_hits"] = None if row["asr"] is None else round(row["asr"] * row["trigger_images"])
    return rows


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
    rate, low, high = rate_interval(int(successes), int(trials))
    return "–" if math.isnan(rate) else f"{rate:.2f} [{low:.2f}, {high:.2f}]"


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
    lowest in most seeds named."""
    rows = finished(load(dataset))
    metric = HEADLINE[dataset]
    margins = baselines(rows, metric)
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


def worst_cell(rows: list[Row], method: str, fraction: float, metric: str) -> str:
    """``method``'s worst case at ``fraction`` over the attacks run there, per seed, the
    attack lowest in most seeds named, ‡ where the rule was told fewer attackers than
    there were."""
    at = [
        r
        for r in rows
        if r["method"] == method and r["fraction"] == fraction and r["attack"] != "none"
    ]
    attacks = {
        a: by_seed((r for r in at if r["attack"] == a), metric) for a in distinct(at, "attack")
    }
    worst, lowest = worst_per_seed(attacks)
    capped = any(r["f_told"] is not None and r["f_told"] < r["attackers"] for r in at)
    named = lowest.most_common(1)[0][0] if lowest else ""
    return f"{shown(worst.values())} {named}{' ‡' if capped else ''}".strip()


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


def paired_block(dataset: str) -> str:
    """At each fraction in ``PAIRED_AT``: the methods ranked by their mean over every
    (attack, seed) all ran, and how many others each is supported to beat or lose to
    (Wilcoxon signed-rank, Holm over all pairs at that fraction)."""
    rows = finished(load(dataset))
    metric = HEADLINE[dataset]
    learners = [m for m, (_, learns) in baselines(rows, metric).items() if learns]
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
        pairs = paired_differences(scores)
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
        ranked = sorted(scores, key=lambda m: -statistics.mean(scores[m].values()))
        lines = [
            f"At {fraction:g} ({len(shared)} paired (attack, seed) observations per method, "
            f"{len(pairs)} pairs):\n",
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
    clean model's, each pooled over seeds with a Wilson interval."""
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
        return shown_rate(sum(r[hits] for r in members), sum(trials(r) for r in members))

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


def recorded(name: str) -> bool:
    return (RESULTS / f"robustness-{name}-seeds.csv").exists()


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
    | {
        f"robustness-{dataset}-noniid": partial(regimes_block, dataset)
        for dataset in HEADLINE
        if any(recorded(f"{dataset}-dirichlet-{alpha}") for alpha in DIRICHLET)
    }
)


def regenerated(text: str) -> tuple[str, list[str]]:
    """``text`` with every generated block recomputed, and the names of those that
    changed. A block name no builder knows is an error."""
    changed = []

    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise KeyError(
                f"docs/results.md names an unknown generated block {name!r}; known: {', '.join(BLOCKS)}"
            )
        body = BLOCKS[name]()
        if body != match["body"]:
            changed.append(name)
        return f"{match[1]}{body}{match[4]}"

    return BLOCK.sub(fill, text), changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 on a difference"
    )
    args = parser.parse_args()
    text, changed = regenerated(DOC.read_text())
    if args.check:
        if changed:
            sys.exit(
                f"docs/results.md: generated blocks out of date: {', '.join(changed)} (run python -m benchmarks.report)"
            )
        print("docs/results.md: every generated block matches its records")
        return
    DOC.write_text(text)
    print(f"docs/results.md: {len(changed)} block(s) rewritten: {', '.join(changed) or 'none'}")


if __name__ == "__main__":
    main()
