"""The robustness matrix's regimes: label-skewed clients (Dirichlet α), the regimes shown
as a method × attack grid (the small CNN, ALIE where its authors ran it) and the
history-aware filters, each with its paired table against a reference."""

from __future__ import annotations

from benchmarks.evidence.tables.cells import shown, shown_share
from benchmarks.evidence.tables.paired import Paired
from benchmarks.evidence.tables.records import (
    HEADLINE,
    Row,
    by_seed,
    distinct,
    finished,
    load,
    recorded,
    with_halts,
)
from benchmarks.evidence.tables.robustness_matrix import (
    baselines,
    stopped_count,
    worst_cell,
    worst_differences,
)
from benchmarks.robustness.matrix import FILTERED
from tasks.statistics import worst_per_seed

DIRICHLET = ("0.1", "0.5", "1")  # the label-skew regimes' α, as their files name them


# regimes shown as a method x attack table (each once its records exist)
GRID_REGIMES = ("cnn", "alie-paper", "dirichlet-0.5-cnn")


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
                shown_share(clean.values()) + ("" if learns else " †"),
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
            shown_share(per_attack[a].values()) + stopped_count(r for r in mine if r["attack"] == a)
            for a in attacks
        ]
        flag = ("" if margins[method][1] else " †") + (" ‡" if capped else "")
        stuck = [
            f"{sum(at_majority(r) for r in runs if not r['halted'])} of {len(runs)}"
            for runs in ([r for r in mine if r["attack"] == "none"],
                         [r for r in mine if r["attack"] != "none"])
        ]  # fmt: skip
        lines.append(
            f"| {method}{flag} | {shown_share(clean.values())} | {' | '.join(cells)} | {shown(drops)} "
            f"| {'; '.join(stuck)} |"
        )
    return "\n".join(lines) + "\n"


def filters_block(dataset: str) -> str:
    """The history-aware filters (``--regime filters``), each row's exact configuration:
    no attack and the worst case over every attack at 0.2 and 0.4, per seed, on the
    seeds the round cut was added on (0–4) and on held-out seeds (5–9) apart."""
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
                f"| {method} | `{spec}` | {label} | {shown_share(clean.values())} | {' | '.join(cells)} |"
            )
    return "\n".join(lines) + "\n"


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


def regime_paired(names: list[str], dataset: str, label: str) -> Paired:
    """Each method of a regime against FedAvg at the regime's fraction, seed by seed: the
    per-seed worst case over the regime's attacks, one test per method and record
    (``label`` names what tells the records apart; Holm over every test of the table)."""
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
    return Paired(tests, "fedavg", label)
