"""docs/results.md's paired tables by block name: the robustness regimes', FedLag's and
PID-MADE's convergence claim's. The claims ledger names them too (a claim read off one is
held to its Holm adjustment)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial

from benchmarks.evidence.tables.fedlag import fedlag_paired
from benchmarks.evidence.tables.paired import Paired, against_block
from benchmarks.evidence.tables.pid_made import convergence_paired
from benchmarks.evidence.tables.records import HEADLINE, RESULTS, recorded
from benchmarks.evidence.tables.robustness_regimes import (
    DIRICHLET,
    GRID_REGIMES,
    filters_paired,
    regime_paired,
)

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
    | (
        {"pid-made-convergence-paired": convergence_paired}
        if (RESULTS / "pid-made-convergence.json").exists()
        else {}
    )
)


@cache
def paired_table(name: str) -> Paired:
    """Table ``name``, built once per process however many blocks and claims read it."""
    return PAIRED_TABLES[name]()


def paired_block_of(name: str) -> str:
    """A paired table written out (docs/results.md's ``*-paired`` blocks)."""
    return against_block(paired_table(name))
