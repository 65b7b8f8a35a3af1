"""Pre-test stage (EMA paper, Section 2.2): are the clients' updates normal across
clients, coordinate by coordinate? Shapiro-Wilk and Anderson-Darling at ``pretest.alpha``,
reported overall and per layer in reports/pretest.json (the "Pre-Testing rate")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from federated.stats import qq_data, representative_coords
from fedsieve.config import Params
from fedsieve.plots_stats import pretest_figure
from fedsieve.reports import ProjectPaths, read_partition, write_json
from flows.common import stage_main
from tasks.data import load_verified_dataset
from tasks.stats import collect_client_updates, test_normality
from tasks.training import build_federation, train_round

__all__ = ["pretest_flow"]


@flow(name="pretest")
def pretest_flow(params: Params, workdir: Path) -> dict[str, Any]:
    logger = get_run_logger()
    paths = ProjectPaths(workdir)
    data = load_verified_dataset(params.data, workdir)
    federation = build_federation(params, data, read_partition(paths.partition))
    state = federation.initial_state()
    while state.round < params.pretest.round:  # the same rounds training would run
        state, _ = train_round(federation, state)
    updates = collect_client_updates(federation, state, params.pretest.mode)
    result = test_normality(
        federation,
        updates,
        alpha=params.pretest.alpha,
        max_tests=params.pretest.max_tests,
        seed=params.seed,
    )
    report = {
        "dataset": params.data.dataset,
        "mode": params.pretest.mode,
        "round": params.pretest.round,
        **result.to_dict(),
    }
    write_json(paths.pretest, report)
    values = updates.detach().cpu().double().numpy()
    figure = pretest_figure(result, qq_data(values, representative_coords(result, k=4)))
    paths.pretest_plot.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(paths.pretest_plot, dpi=100)
    logger.info(
        "pre-test of %d coordinates across %d clients: Shapiro-Wilk %.1f%% normal, "
        "Anderson-Darling %.1f%% normal (%d constant coordinates set aside)",
        result.n_tests,
        result.n_clients,
        100 * (result.shapiro_rate or 0),
        100 * (result.anderson_rate or 0),
        result.n_constant,
    )
    for name, rate in (
        ("Shapiro-Wilk", result.shapiro_rate),
        ("Anderson-Darling", result.anderson_rate),
    ):
        if rate == rate and rate < params.pretest.warn_below:
            logger.warning(
                "only %.1f%% of coordinates pass %s (below pretest.warn_below=%.0f%%): EMA's "
                "normality assumption is weak for this setup",
                100 * rate,
                name,
                100 * params.pretest.warn_below,
            )
    return report


main = stage_main("pretest")

if __name__ == "__main__":
    main()
