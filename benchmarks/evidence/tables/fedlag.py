"""FedLag's stability claim (benchmarks/papers/fedlag_stability.py): its table and its paired
table against FedAvg."""

from __future__ import annotations

from benchmarks.evidence.tables.cells import plain, plain_share
from benchmarks.evidence.tables.paired import Paired
from benchmarks.evidence.tables.records import Row, results_json
from tasks.statistics import seed_difference

# A stability measure: its label in the paired table and its key in the record's rows
STABILITY_MEASURES = {"acc": ("ACC", "acc"), "wobble": ("wobble", "last_rounds_acc_std")}


def fedlag_block() -> str:
    """FedLag's stability claim (benchmarks/papers/fedlag_stability.py): final test accuracy and
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
            f"{plain_share(cell[m]['acc'])} / {plain(cell[m]['last_rounds_acc_std'])} [{len(cell[m]['acc'])}]"
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
    rows = results_json("fedlag-stability")["rows"]
    tests = [
        (
            method,
            f"{alpha:g}, {measure}",
            seed_difference(
                fedlag_by_seed(rows, alpha, method, key), fedlag_by_seed(rows, alpha, "fedavg", key)
            ),
        )
        for measure, key in STABILITY_MEASURES.values()
        for alpha in sorted({r["alpha"] for r in rows})
        for method in ("fedlag", "fedprox")
    ]
    return Paired(tests, "fedavg", "Dirichlet α, measure", "value")
