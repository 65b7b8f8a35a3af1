"""Pre-test stage (EMA paper, Section 2.2): are the clients' updates normal across
clients, coordinate by coordinate? Shapiro-Wilk and Anderson-Darling at ``pretest.alpha``,
reported overall and per layer in reports/pretest.json (the "Pre-Testing rate"). At real
sites the stage does not run: its report says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from config.params import Params
from tasks.data import load_verified_dataset
from tasks.reports import (
    ProjectPaths,
    check_partitioned_images,
    read_local_tests,
    read_partition,
    read_root,
)
from tasks.stats import (
    collect_client_updates,
    test_normality,
    write_pretest_not_run,
    write_pretest_report,
)
from tasks.training import build_federation, train_rounds

__all__ = ["pretest_flow"]


@flow(name="pretest")
def pretest_flow(params: Params, workdir: Path) -> dict[str, Any]:
    paths = ProjectPaths(workdir)
    if params.federation.runtime == "flower":
        return write_pretest_not_run(paths)
    data = load_verified_dataset(params.data, workdir)
    check_partitioned_images(paths, data)
    split = paths.partition  # the local test splits: where eval.where: sites scores rounds
    federation = build_federation(
        params, data, read_partition(split), read_root(split), read_local_tests(split)
    )
    # the same rounds training would run
    state = train_rounds(federation, federation.initial_state(), params.pretest.round)
    updates = collect_client_updates(federation, state, params.pretest.mode)
    result = test_normality(
        federation,
        updates,
        alpha=params.pretest.alpha,
        max_tests=params.pretest.max_tests,
        seed=params.seed,
    )
    return write_pretest_report(paths, params, result, updates)
