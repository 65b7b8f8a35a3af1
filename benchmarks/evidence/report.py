"""docs/results.md's generated tables: the robustness matrix's, recomputed from the
committed per-seed records, and the EMA Monte Carlo's (seeded, recomputed from code).

    python -m benchmarks.evidence.report            # rewrite the generated blocks
    python -m benchmarks.evidence.report --check    # exit 1 naming every block that differs,
                                           # every claim of the ledger that fails and
                                           # every pre-registered claim out of order

A generated block sits between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->``
in docs/results.md; what is outside the markers (the reading of the numbers) is written
by hand. The records are ``benchmarks/results/robustness-<dataset>-seeds.csv``, one row
per cell and seed, written by ``python -m benchmarks.robustness.matrix``. A test regenerates
every block and fails on a difference, so no figure in those tables is typed by hand.

The blocks' builders live in :mod:`benchmarks.evidence.tables`, one module per kind of evidence;
this module names the blocks, fills them in and checks them, with the claims ledger
(:mod:`benchmarks.evidence.claims`), which reads the same records.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from benchmarks.evidence import claims, figures, preregistration, share_intervals
from benchmarks.evidence.claims import LedgerError
from benchmarks.evidence.tables.consortium import (
    CNN_RECORD,
    pilot_block,
    recommendation_block,
    small_consortium_block,
)
from benchmarks.evidence.tables.ema import ema_paper_block, ema_pretest_block, noniid_cv_block
from benchmarks.evidence.tables.faults import faults_block
from benchmarks.evidence.tables.federation import (
    federation_smoke_block,
    loopback_block,
    loopback_own_data_block,
    loopback_phases_block,
    loopback_restart_block,
)
from benchmarks.evidence.tables.fedlag import fedlag_block
from benchmarks.evidence.tables.fedstnn import (
    FEDSTNN_CURVES,
    fedstnn_block,
    fedstnn_image_block,
    fedstnn_jumps_block,
)
from benchmarks.evidence.tables.majority import MAJORITY_COUNTED, majority_block
from benchmarks.evidence.tables.paired_tables import PAIRED_TABLES, paired_block_of
from benchmarks.evidence.tables.pid_made import (
    PID_PAPER,
    ablation_block,
    ablation_paired_block,
    convergence_block,
    cusum_search_block,
    pid_paper_block,
)
from benchmarks.evidence.tables.pipeline_runs import (
    default_pipeline_block,
    privacy_block,
    resnet18_block,
)
from benchmarks.evidence.tables.readme import readme_results_block
from benchmarks.evidence.tables.records import HEADLINE, REPO, RESULTS, recorded, results_json
from benchmarks.evidence.tables.robustness_matrix import (
    headline_block,
    learning_block,
    paired_block,
    rates_block,
)
from benchmarks.evidence.tables.robustness_regimes import (
    DIRICHLET,
    GRID_REGIMES,
    filters_block,
    regime_grid_block,
    regimes_block,
)
from benchmarks.evidence.tables.service import (
    own_images_block,
    serving_block,
    signal_block,
    volume_read_block,
)
from benchmarks.evidence.tables.speed import (
    aggregation_block,
    cross_device_block,
    cross_device_profile_block,
    flower_race_block,
    grid_throughput_block,
    method_cost_block,
    overhead_block,
    pid_cost_block,
    round_speed_block,
    site_validation_cost_block,
    speed_notes_block,
)
from benchmarks.evidence.tables.table1 import table1_attacked_block, table1_block
from benchmarks.evidence.tables.volumes import (
    ACCURACY_RECORD,
    ROBUSTNESS_RECORD,
    accuracy_block,
    robustness_block,
    timing_block,
)
from benchmarks.papers import ema_monte_carlo
from benchmarks.papers.fedlag_table1 import ATTACKED_RECORD as TABLE1_ATTACKED_RECORD
from benchmarks.papers.fedlag_table1 import RECORD as TABLE1_RECORD

DOC = REPO / "docs" / "results.md"
BLOCK = re.compile(
    r"(<!-- report:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /report:(?P=name) -->)", re.S
)


def claims_block(ledger: Path | None = None, verdicts: list[claims.Verdict] | None = None) -> str:
    """Every claim of the ledger (benchmarks/claims.yaml) recomputed from the records, or
    its ``verdicts`` when they were just computed."""
    lines = ["| id | claim | statistic | test | holds |", "|---|---|---|---|---|"]
    if verdicts is None:
        verdicts = claims.verdicts(ledger or claims.LEDGER)
    for verdict in verdicts:
        lines.append(
            f"| {verdict.claim} | {verdict.text} | {verdict.statistic} | {verdict.test} "
            f"| {'yes' if verdict.holds else '**no**'} |"
        )
    return "\n".join(lines) + "\n"


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
    | {"ema-monte-carlo": ema_monte_carlo.table, "share-interval-coverage": share_intervals.block}
    | {"signal-in-write": signal_block, "own-images": own_images_block, "serving": serving_block}
    | {"volume-read": volume_read_block}
    | {"small-consortium": small_consortium_block}
    | {"small-consortium-cnn": partial(small_consortium_block, CNN_RECORD)}
    | {"consortium-pilot": pilot_block}
    | {"small-consortium-recommended": recommendation_block}
    | {"ema-paper": ema_paper_block, "ema-pretest": ema_pretest_block}
    | {"noniid-cv": noniid_cv_block, "fedlag-stability": fedlag_block}
    | ({"fedlag-table1": table1_block} if TABLE1_RECORD.exists() else {})
    | ({"fedlag-table1-attacked": table1_attacked_block} if TABLE1_ATTACKED_RECORD.exists() else {})
    | {"privacy-breastmnist": privacy_block, "default-pipeline": default_pipeline_block}
    | {"federation-loopback": loopback_block, "flower-race": flower_race_block}
    | {"federation-loopback-own-data": loopback_own_data_block}
    | {"federation-loopback-phases": loopback_phases_block}
    | {"federation-loopback-restart": loopback_restart_block}
    | {
        "pipeline-overhead": overhead_block,
        "federation-smoke": federation_smoke_block,
        "grid-throughput": grid_throughput_block,
        "aggregation-cpu": partial(aggregation_block, "cpu"),
        "aggregation-cuda": partial(aggregation_block, "cuda"),
        "pid-cost": pid_cost_block,
        "site-validation-cost": site_validation_cost_block,
        "method-cost-cpu": partial(method_cost_block, "cpu"),
        "round-speed-cuda": partial(round_speed_block, "cuda"),
        "round-speed-cpu": partial(round_speed_block, "cpu"),
        "speed-notes": speed_notes_block,
        "resnet18-breastmnist": resnet18_block,
    }
    | (
        {"adrenalmnist3d": accuracy_block, "adrenalmnist3d-timing": timing_block}
        if (RESULTS / f"{ACCURACY_RECORD}.json").exists()
        else {}
    )
    | ({f"robustness-{ROBUSTNESS_RECORD}": robustness_block} if recorded(ROBUSTNESS_RECORD) else {})
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
    | {
        f"robustness-{name}-majority": partial(majority_block, name)
        for name in MAJORITY_COUNTED
        if recorded(name)
    }
    | (
        {"fedstnn": fedstnn_block, "fedstnn-2d-jumps": fedstnn_jumps_block}
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
        {"pid-made-convergence": convergence_block}
        if (RESULTS / "pid-made-convergence.json").exists()
        else {}
    )
    | (
        {"pid-made-cusum-search": cusum_search_block}
        if (RESULTS / "pid-made-cusum-search.csv").exists()
        else {}
    )
    | {"claims": claims_block, "preregistered": preregistration.block}
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
    | {name: partial(paired_block_of, name) for name in PAIRED_TABLES}
)


# docs/operations.md's fault table, once `make container-faults --results` has recorded it
OPERATIONS = REPO / "docs" / "operations.md"
OPERATIONS_BLOCKS: dict[str, Callable[[], str]] = (
    {"container-faults": faults_block} if (RESULTS / "container-faults.json").exists() else {}
)
# README.md's results in short: its measured bullets
README = REPO / "README.md"
README_BLOCKS: dict[str, Callable[[], str]] = {"readme-results": readme_results_block}
# docs/configuration.md's choice of filter per size: the small consortium's rule
CONFIGURATION = REPO / "docs" / "configuration.md"
CONFIGURATION_BLOCKS: dict[str, Callable[[], str]] = {
    "small-consortium-recommended": recommendation_block
}
# the other documents with generated blocks, each with its builders
OTHER_DOCS: dict[Path, dict[str, Callable[[], str]]] = {
    OPERATIONS: OPERATIONS_BLOCKS,
    README: README_BLOCKS,
    CONFIGURATION: CONFIGURATION_BLOCKS,
}


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


FIGURED = (DOC, README)  # the documents whose every figure is generated or cited


def passing_claims(verdicts: list[claims.Verdict]) -> set[str]:
    """The ids a sentence may cite to back its figures: the ledger's claims that hold
    (``verdicts``) and the pre-registered ones that hold once their records exist."""
    held = preregistration.verdicts()
    return {v.claim for v in [*verdicts, *held] if v.holds}


def figure_problems(verdicts: list[claims.Verdict] | None = None) -> list[str]:
    """Every figure of docs/results.md and README.md that is neither in a generated block
    nor in a sentence citing a claim that holds (:mod:`benchmarks.evidence.figures`), by line."""
    passing = passing_claims(claims.verdicts() if verdicts is None else verdicts)
    return [
        str(finding)
        for path in FIGURED
        for finding in figures.unbacked(
            path.read_text(), path.relative_to(REPO).as_posix(), passing
        )
    ]


def problems(
    text: str,
    ledger: Path | None = None,
    order: preregistration.CommitOrder | None = None,
    with_figures: bool = False,
) -> list[str]:
    """What ``--check`` fails on: generated blocks out of date, claims that no longer
    hold, claim ids cited but not in the ledger, claims no sentence cites, pre-registered
    claims out of commit order (``order``, read from git when not given) and, with
    ``with_figures``, figures neither generated nor cited (tests/benchmarks/test_figures.py
    checks those on its own)."""
    ledger = ledger or claims.LEDGER
    order = order or preregistration.commit_order()
    verdicts = claims.verdicts(ledger)
    blocks = BLOCKS  # the ledger's block is the committed ledger's: its verdicts, once
    if ledger == claims.LEDGER:
        blocks = BLOCKS | {"claims": partial(claims_block, verdicts=verdicts)}
    _, changed = regenerated(text, blocks)
    found = [f"generated blocks out of date: {', '.join(changed)}"] if changed else []
    found += [f"claim {v.claim} no longer holds: {v.statistic}; {v.test}"
              for v in verdicts if not v.holds]  # fmt: skip
    found += claims.citation_problems(text, claims.load_ledger(ledger))
    found += figure_problems(verdicts) if with_figures and ledger == claims.LEDGER else []
    return found + order.problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 on a difference"
    )
    args = parser.parse_args()
    try:
        claims.load_ledger()  # a broken ledger is said before any table is made
        regenerate(check=args.check)
    except LedgerError as error:  # one line, and nothing written
        sys.exit(str(error))


def regenerate(check: bool) -> None:
    text = DOC.read_text()
    if check:
        order = preregistration.commit_order()  # git read once: shown, then checked
        print("\n".join(order.lines))
        found = problems(text, order=order, with_figures=True)
        if found:
            sys.exit(
                "docs/results.md: "
                + "; ".join(found)
                + " (run python -m benchmarks.evidence.report)"
            )
        for doc, blocks in OTHER_DOCS.items():
            _, stale = regenerated(doc.read_text(), blocks, doc)
            if stale:
                name = doc.relative_to(REPO).as_posix()
                sys.exit(f"{name}: generated blocks out of date: {', '.join(stale)}")
        print(
            "docs/results.md: every generated block matches its records, every claim holds "
            "and every figure is generated or cited"
        )
        return
    text, changed = regenerated(text)
    DOC.write_text(text)
    for doc, blocks in OTHER_DOCS.items():
        rewritten_text, rewritten = regenerated(doc.read_text(), blocks, doc)
        doc.write_text(rewritten_text)
        changed += rewritten
    print(f"docs: {len(changed)} block(s) rewritten: {', '.join(changed) or 'none'}")
    for problem in problems(text, with_figures=True):
        print(f"docs/results.md: {problem}")


if __name__ == "__main__":
    main()
