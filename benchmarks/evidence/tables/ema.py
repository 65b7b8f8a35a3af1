"""EMA's tables (the paper's experiments, benchmarks/papers/ema_paper.py): test accuracy per rule
and attack, the normality pre-tests, and the non-IID detection's CV of client losses
(benchmarks/papers/noniid_cv.py)."""

from __future__ import annotations

import statistics

from benchmarks.evidence.tables.cells import plain, shown_share
from benchmarks.evidence.tables.records import results_json

EMA_RULES = {"fedavg": "FedAvg", "median": "median", "trimmed_mean": "trimmed mean",
             "krum": "Krum", "zeno": "Zeno", "ema": "EMA"}  # fmt: skip


def ema_paper_block() -> str:
    """EMA's experiments (benchmarks/papers/ema_paper.py): test accuracy per rule, no attack and
    each attack and fraction, mean [95 % logit-scale t-interval] [seeds]."""
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
        lines.append(f"| {label} | {' | '.join(shown_share(cell[s], 3) for s in scenarios)} |")
    return "\n".join(lines) + "\n"


def ema_pretest_block() -> str:
    """The share of coordinates the pre-tests call normal, per seed, as an interval."""
    runs = results_json("ema-paper")["pretest"]
    return (
        "| test (α = 0.05) | coordinates tested | share called normal |\n|---|---|---|\n"
        + "".join(
            f"| {label} | {runs[0]['n_tests']:,} | {shown_share((r[key] for r in runs), 1, 100)} % |\n"
            for label, key in (
                ("Shapiro–Wilk", "shapiro_rate"),
                ("Anderson–Darling", "anderson_rate"),
            )
        )
    )


def noniid_cv_block() -> str:
    """The CV of client losses on the trained model (benchmarks/papers/noniid_cv.py) per
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
