"""Pre-test stage (EMA paper, Section 2.2): are the clients' updates normal across
clients, coordinate by coordinate? Shapiro-Wilk and Anderson-Darling at ``pretest.alpha``,
reported overall and per layer in reports/pretest.json (the "Pre-Testing rate"). At real
sites the sites compute the same gradients or one-epoch updates on their own data and send
them to the hub, which tests them (never under local DP: its report says why not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from config.assembly import build_global_model, dataset_info_of
from config.params import Params
from tasks.data import data_root, load_verified_dataset
from tasks.reports import (
    ProjectPaths,
    check_partitioned_images,
    read_local_tests,
    read_partition,
    read_root,
)
from tasks.sites import pretest_updates_at_sites
from tasks.stats import (
    NOT_RUN_UNDER_LOCAL_DP,
    collect_client_updates,
    test_normality,
    write_pretest_not_run,
    write_pretest_report,
)
from tasks.training import build_federation, train_rounds

__all__ = ["pretest_flow"]

MIN_SITES = 3  # Shapiro-Wilk's least sample


@flow(name="pretest")
def pretest_flow(params: Params, workdir: Path) -> dict[str, Any]:
    paths = ProjectPaths(workdir)
    if params.federation.runtime == "flower":
        return _pretest_at_sites(params, paths, workdir)
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
        federation.model,
        updates,
        alpha=params.pretest.alpha,
        max_tests=params.pretest.max_tests,
        seed=params.seed,
    )
    return write_pretest_report(paths, params, result, updates)


def _pretest_at_sites(params: Params, paths: ProjectPaths, workdir: Path) -> dict[str, Any]:
    """The sites' gradients or updates, tested at the hub as a simulation tests its own."""
    if params.privacy.mode == "local":
        return write_pretest_not_run(paths, NOT_RUN_UNDER_LOCAL_DP)
    if params.eval.where == "hub":  # the pre-test's rounds are scored on the hub's splits
        load_verified_dataset(params.data, workdir)
    root = data_root(params.data.root, workdir)
    updates, answered = pretest_updates_at_sites(params, paths, data_root=root)
    if len(answered) < MIN_SITES:
        return write_pretest_not_run(
            paths, f"not run: {len(answered)} sites answered, the tests need {MIN_SITES}"
        )
    result = test_normality(
        build_global_model(params, dataset_info_of(params.data)),
        updates,
        alpha=params.pretest.alpha,
        max_tests=params.pretest.max_tests,
        seed=params.seed,
    )
    held_at = {
        "runtime": "flower",
        "sites": [params.federation.sites[i].name for i in answered],
    }
    return write_pretest_report(paths, params, result, updates, held_at)
