"""PID-MADE's tables: the paper's experiments (benchmarks/papers/pid_made_paper.py), its
convergence claim (benchmarks/papers/pid_made_convergence.py), the ablation of its exclusion test
(benchmarks/papers/pid_made_ablation.py) and the distance CUSUM's search."""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass
from functools import cache

import numpy as np
from statsmodels.stats.multitest import multipletests

from benchmarks.evidence.tables.cells import (
    shown,
    shown_counts,
    shown_rate,
    shown_seed_rates,
    shown_share,
)
from benchmarks.evidence.tables.paired import Paired
from benchmarks.evidence.tables.records import (
    HEADLINE,
    RESULTS,
    Row,
    chance,
    distinct,
    results_json,
)
from benchmarks.papers import pid_made_ablation as ablation
from benchmarks.papers import pid_made_convergence as convergence
from benchmarks.papers.pid_made_paper import EXPERIMENTS
from tasks.statistics import exact_mcnemar, seed_difference

PID_PAPER = {
    "table4": "poisoning rate",
    "figure4": "attackers",
    "ablation": "gains",
    "thresholds": "clients",
}  # experiment -> what its setting column shows; fmt: skip


def pid_paper_block(experiment: str) -> str:
    """One of PID-MADE's paper analogues (benchmarks/papers/pid_made_paper.py): per setting and
    method (with its reading of a banned client's later update), the test accuracy (mean
    [95 % logit-scale t-interval]), false positives and negatives as rates of honest and
    attacker client-rounds, honest clients ever banned and attackers caught as rates of
    clients, each per seed (:func:`shown_seed_rates`), and the round the last attacker
    was caught in runs that caught them all (median)."""
    rows = results_json("pid-made-paper")["rows"]
    lines = [
        f"| {PID_PAPER[experiment]} | method | banned updates | test ACC | FP rate | FN rate "
        "| honest clients banned | attackers caught | last caught in round (median, seeds) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = [m for setups in EXPERIMENTS.values() for *_, methods in setups for m in methods]
    readings = {
        name: spec.get("filters", [{}])[0].get("banned_updates", "–")
        for setups in EXPERIMENTS.values() for *_, methods in setups
        for name, spec in methods.items()
    }  # fmt: skip
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
            f"| {setting} | {row['method']} | {readings[row['method']]} "
            f"| {shown_share(row['acc'], 3)} "
            f"| {shown_seed_rates(row['fp'], row['honest_rounds'])} "
            f"| {shown_seed_rates(row['fn'], row['attacker_rounds'])} "
            f"| {shown_seed_rates(row['honest_excluded'], honest_clients)} "
            f"| {shown_seed_rates(row['attackers_caught'], row['attackers'])} | {last} |"
        )
    return "\n".join(lines) + "\n"


def ablation_block() -> str:
    """PID-MADE's exclusion tests side by side (benchmarks/papers/pid_made_ablation.py): per
    dataset, variant and seed group, how often a clean run banned an honest client, how
    often every attacker was out by round 5, and the score's detection ROC-AUC."""
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
                aucs = "".join(f"| {shown_share(numbers(attacked, f'auc_round_{t}'))} "
                               for t in ablation.AUC_ROUNDS)  # fmt: skip
                lines.append(
                    f"| {dataset} | {variant} | {label} "
                    f"| {banning}/{len(clean)}: {shown_rate(banning, len(clean))} "
                    f"| {caught}/{len(attacked)}: {shown_rate(caught, len(attacked))} "
                    f"| {shown_counts(numbers(attacked, 'honest_banned'))} {aucs}"
                    f"| {margins[0]} / {margins[1]} |"
                )
    return "\n".join(configurations) + "\n\n" + "\n".join(lines) + "\n"


def ablation_rows(name: str = "pid-made-ablation-seeds") -> list[Row]:
    with (RESULTS / f"{name}.csv").open(newline="") as handle:
        return [r for r in csv.DictReader(handle) if not r["error"]]


def ablation_outcomes(rows: list[Row], variant: str, dataset: str) -> dict[str, dict[int, bool]]:
    """Per seed: whether the clean run banned an honest client, and whether the attacked
    run had every attacker out by round 5."""
    mine = [r for r in rows if r["variant"] == variant and r["dataset"] == dataset]
    by = f"attackers_banned_by_{ablation.CAUGHT_BY}"
    return {
        "banning": {int(r["seed"]): int(r["honest_banned"]) > 0
                    for r in mine if r["attack"] == "none"},
        "caught": {int(r["seed"]): int(r[by]) == int(r["attackers"])
                   for r in mine if r["attack"] != "none"},
    }  # fmt: skip


ABLATION_REFERENCE = "distance_cusum"


@dataclass(frozen=True)
class AblationTest:
    """One variant against the distance CUSUM on the held-out seeds, paired by seed: how
    many seeds only it (only the reference) had the outcome, and the exact McNemar p."""

    dataset: str
    variant: str
    outcome: str  # "banning" (clean runs) or "caught" (attacked runs)
    only_it: int
    only_reference: int
    p: float


@cache
def ablation_tests() -> tuple[AblationTest, ...]:
    """Every test of the ablation's paired table, in its order: one family, which Holm
    adjusts together here and in the claims ledger."""
    rows = [r for r in ablation_rows() if int(r["seed"]) not in ablation.TUNED_ON]
    tests = []
    for dataset in distinct(rows, "dataset"):
        ours = ablation_outcomes(rows, ABLATION_REFERENCE, dataset)
        for variant in ablation.VARIANTS:
            if variant == ABLATION_REFERENCE:
                continue
            theirs = ablation_outcomes(rows, variant, dataset)
            for outcome in ("banning", "caught"):
                only_it, only_ours, p = exact_mcnemar(theirs[outcome], ours[outcome])
                tests.append(AblationTest(dataset, variant, outcome, only_it, only_ours, p))
    return tuple(tests)


def ablation_paired_block() -> str:
    """The thresholds compared on the held-out seeds alone, paired by seed: each variant
    against the distance CUSUM, in clean runs banning an honest client and in attacked
    runs with every attacker out by round 5 (seeds only one of the two had, the exact
    McNemar p-value and its Holm adjustment over every test of the table)."""
    tests = ablation_tests()
    holm = multipletests([t.p for t in tests], method="holm")[1]
    cells: dict[tuple[str, str], list[str]] = {}
    for test, p_holm in zip(tests, holm, strict=True):
        cells.setdefault((test.dataset, test.variant), []).append(
            f"{test.only_it} / {test.only_reference} (p = {test.p:.2g}; Holm {p_holm:.2g})"
        )
    reference = ABLATION_REFERENCE
    lines = [
        f"| dataset | variant | clean runs banning: only it / only {reference} (p; Holm) "
        f"| attacked runs all out by round {ablation.CAUGHT_BY}: only it / only {reference} "
        "(p; Holm) |",
        "|---|---|---|---|",
    ]
    lines += [f"| {dataset} | {variant} | {' | '.join(shown)} |"
              for (dataset, variant), shown in cells.items()]  # fmt: skip
    return "\n".join(lines) + "\n"


def chosen_cusum(rows: list[Row]) -> str:
    """The search's choice by its stated rule: the fewest clean runs banning an honest
    client over both datasets, then the most attacked runs with every attacker out by
    round 5, then the smallest drift + h."""

    def key(variant: str) -> tuple[int, int, float]:
        outcomes = [ablation_outcomes(rows, variant, d) for d in distinct(rows, "dataset")]
        banning = sum(sum(o["banning"].values()) for o in outcomes)
        caught = sum(sum(o["caught"].values()) for o in outcomes)
        return banning, -caught, ablation.SEARCH[variant]["drift"] + ablation.SEARCH[variant]["h"]

    return min(distinct(rows, "variant"), key=key)


def cusum_search_block() -> str:
    """The drift/h search of the distance CUSUM on seeds 0–9 (the seeds it was tuned on):
    per setting and dataset, clean runs banning an honest client and attacked runs with
    every attacker out by round 5, and the setting the stated rule picks."""
    rows = ablation_rows("pid-made-cusum-search")
    datasets = distinct(rows, "dataset")
    header = " | ".join(
        f"{d}: clean runs banning | {d}: all out by round {ablation.CAUGHT_BY}" for d in datasets
    )
    lines = [f"| drift | h | {header} |", "|---" * (2 + 2 * len(datasets)) + "|"]
    for variant, spec in ablation.SEARCH.items():
        cells = []
        for dataset in datasets:
            outcome = ablation_outcomes(rows, variant, dataset)
            for name in ("banning", "caught"):
                cells.append(f"{sum(outcome[name].values())}/{len(outcome[name])}")
        lines.append(f"| {spec['drift']:g} | {spec['h']:g} | {' | '.join(cells)} |")
    pick = ablation.SEARCH[chosen_cusum(rows)]
    lines.append(
        f"\nThe rule (fewest clean runs banning over both datasets, then most attacked runs "
        f"with every attacker out by round {ablation.CAUGHT_BY}, then the smallest drift + h) picks "
        f"drift {pick['drift']:g}, h {pick['h']:g}."
    )
    return "\n".join(lines) + "\n"


def rounds_to(losses: list[float], target: float) -> int | None:
    """The first round (counted from 1) whose test loss is at most ``target``; None where
    no round's is."""
    return next((t for t, loss in enumerate(losses, 1) if loss <= target), None)


def convergence_rows() -> list[Row]:
    """benchmarks/papers/pid_made_convergence.py's runs, curves as lists of floats (empty for a
    run that failed), each with the measures of its module docstring: ``mean_loss`` over
    the rounds and ``rounds_to_target``, the clean FedAvg run of its seed giving the
    target (NaN and None for a failed run)."""
    rows = [dict(r) for r in results_json(convergence.STEM.name)["rows"]]
    for row in rows:
        for key in ("loss_curve", "acc_curve"):
            row[key] = [float(v) for v in row[key].split()] if not row["error"] else []
    targets = {
        r["seed"]: (1 + convergence.TOLERANCE) * r["loss_curve"][-1]
        for r in rows
        if r["attack"] == "none" and r["method"] == convergence.CLEAN_REFERENCE and not r["error"]
    }
    for row in rows:
        losses = row["loss_curve"]
        row["mean_loss"] = float(np.mean(losses)) if losses else math.nan
        target = targets.get(row["seed"])
        row["rounds_to_target"] = None if target is None else rounds_to(losses, target)
    return rows


def convergence_groups(rows: list[Row]) -> dict[tuple[float, str], list[Row]]:
    """The runs by (attacker share, method): the clean runs first, then each share's in
    the order of :func:`benchmarks.papers.pid_made_convergence.method_specs`."""
    order = list(convergence.method_specs(0))
    groups: dict[tuple[float, str], list[Row]] = {}
    for row in sorted(rows, key=lambda r: (r["fraction"], order.index(r["method"]), r["seed"])):
        groups.setdefault((row["fraction"], row["method"]), []).append(row)
    return groups


def convergence_block() -> str:
    """PID-MADE's convergence claim (benchmarks/papers/pid_made_convergence.py): per attacker
    count and method, the runs that reached the clean target (10 % above the clean FedAvg
    run's final test loss, same seed) and the median round they reached it in, the mean
    test loss over the rounds and its per-seed difference from the clean FedAvg run (mean
    ± 95 % t-interval [seeds]), the final test loss and accuracy, and, for the method that
    bans (PID-MADE), the honest clients it banned and the attackers it caught (mean (range)
    [seeds])."""
    rows = convergence_rows()
    clean = {r["seed"]: r["mean_loss"] for r in rows
             if r["attack"] == "none" and r["method"] == convergence.CLEAN_REFERENCE}  # fmt: skip
    lines = [
        "| attackers | method | f told | reached the clean target (runs) "
        "| round reached (median, range) | mean test loss over rounds "
        f"| minus the clean {convergence.CLEAN_REFERENCE} run's | final test loss "
        "| final test ACC | honest clients banned | attackers caught |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    banning = {m for m, spec in convergence.method_specs(0).items() if spec.get("filters")}
    for (fraction, method), runs in convergence_groups(rows).items():
        attackers = round(fraction * convergence.CLIENTS)
        setting = f"{attackers} of {convergence.CLIENTS}" if attackers else "none"
        told = {r["f_told"] for r in runs if not r["error"]} - {None}
        reached = [r["rounds_to_target"] for r in runs if r["rounds_to_target"] is not None]
        rounds = (
            f"{statistics.median(reached):g} ({min(reached)}–{max(reached)})" if reached else "–"
        )
        done = [r for r in runs if not r["error"]]
        bans = [
            shown_counts([r[key] for r in done]) if method in banning else "–"
            for key in ("honest_excluded", "attackers_caught")
        ]
        lines.append(
            f"| {setting} | {method} | {', '.join(map(str, sorted(told))) or '–'} "
            f"| {len(reached)}/{len(runs)} | {rounds} "
            f"| {shown([r['mean_loss'] for r in done], 3)} "
            f"| {shown([r['mean_loss'] - clean[r['seed']] for r in done], 3)} "
            f"| {shown([r['loss_curve'][-1] for r in done], 3)} "
            f"| {shown_share([r['acc_curve'][-1] for r in done], 3)} | {' | '.join(bans)} |"
        )
    return "\n".join(lines) + "\n"


def convergence_by_seed(
    rows: list[Row], fraction: float, method: str
) -> dict[tuple[str, int], float]:
    """One method's mean test loss over the rounds per seed under the attackers at
    ``fraction``, keyed as :func:`tasks.statistics.seed_difference` pairs them: the paired
    table and the claims ledger test this one measure."""
    attack = convergence.ATTACK["name"]
    return {(attack, r["seed"]): r["mean_loss"] for r in rows
            if r["attack"] == attack and r["fraction"] == fraction and r["method"] == method}  # fmt: skip


def convergence_paired() -> Paired:
    """The paper's claim tested: per attacker share, PID-MADE's mean test loss over the
    rounds minus FedAvg's under the same attackers, seed by seed (exact sign-flip test),
    Holm over the shares. Negative: PID-MADE's loss fell sooner or lower."""
    rows = convergence_rows()
    tests = []
    for fraction in convergence.FRACTIONS:
        first, second = (convergence_by_seed(rows, fraction, m) for m in ("pid_made", "fedavg"))
        tests.append(("pid_made", f"{fraction:g}", seed_difference(first, second)))
    return Paired(tests, "fedavg", "attacker share of 40", "mean test loss over rounds")
