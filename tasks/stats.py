"""Statistics tasks: collect the clients' updates at a global model, test their normality,
write the pre-test report."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from config.params import Params
from federated.client import client_gradient, train_client
from federated.seeding import SHUFFLE, derive_seed
from federated.server import Federation, ServerState
from federated.stats import (
    PretestResult,
    pretest_normality,
    qq_data,
    representative_coords,
    sample_coordinates,
)
from federated.vectors import layout_of
from tasks.plots import plot_note
from tasks.plots_stats import pretest_figure
from tasks.reports import ProjectPaths, write_json

__all__ = [
    "NOT_RUN_UNDER_LOCAL_DP",
    "collect_client_updates",
    "test_normality",
    "write_pretest_not_run",
    "write_pretest_report",
]

NOT_RUN_UNDER_LOCAL_DP = (
    "not run: privacy.mode is local, and only noised updates leave the sites (the "
    "pre-test needs their raw gradients or updates)"
)


@task(name="collect-client-updates", cache_policy=NO_CACHE)
def collect_client_updates(federation: Federation, state: ServerState, mode: str) -> torch.Tensor:
    """Every client's gradient (``gradient``) or one-epoch update (``delta``) at the
    state's global model, stacked ``(n_clients, d)``."""
    rows = []
    for client in federation.clients:
        if mode == "gradient":
            rows.append(
                client_gradient(federation.model, state.global_vector, client, federation.loss_fn)
            )
        else:
            local = dataclasses.replace(federation.local, epochs=1)
            seed = derive_seed(federation.config.seed, state.round + 1, client.client_id, SHUFFLE)
            rows.append(
                train_client(
                    federation.model,
                    state.global_vector,
                    client,
                    local,
                    federation.loss_fn,
                    seed=seed,
                ).delta
            )
    return torch.stack(rows)


@task(name="test-normality", cache_policy=NO_CACHE)
def test_normality(
    model: torch.nn.Module, updates: torch.Tensor, *, alpha: float, max_tests: int | None,
    seed: int,
) -> PretestResult:  # fmt: skip
    """Shapiro-Wilk and Anderson-Darling on a seeded sample of coordinates of ``updates``
    (one row per client), reported per layer of ``model``."""
    coords = sample_coordinates(updates.shape[1], max_tests, seed)
    return pretest_normality(
        updates.detach().cpu().double().numpy(),
        alpha=alpha,
        layer_slices=layout_of(model).slices(),
        coords=coords,
    )


test_normality.__test__ = False  # not a pytest test despite its name


@task(name="write-pretest-report", cache_policy=NO_CACHE)
def write_pretest_report(
    paths: ProjectPaths, params: Params, result: PretestResult, updates: torch.Tensor,
    held_at: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``reports/pretest.json`` (rates overall and per layer) and its figure (p-value
    histograms, QQ plots); says so plainly when a normal share is below
    ``pretest.warn_below``. ``held_at``: where the updates came from (real sites: which
    answered), added to the report."""
    report = {
        "dataset": params.data.dataset,
        "mode": params.pretest.mode,
        "round": params.pretest.round,
        **(held_at or {}),
        **result.to_dict(),
    }
    write_json(paths.pretest, report)
    values = updates.detach().cpu().double().numpy()
    figure = pretest_figure(result, qq_data(values, representative_coords(result, k=4)))
    paths.pretest_plot.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(paths.pretest_plot, dpi=100)
    _log_rates(result, params.pretest.warn_below)
    return report


@task(name="pretest-not-run", cache_policy=NO_CACHE)
def write_pretest_not_run(paths: ProjectPaths, reason: str) -> dict[str, Any]:
    """A pre-test stage at real sites that could not run: its report and figure say so,
    and why; no rates."""
    report = {"runtime": "flower", "ran": False, "reason": reason}
    write_json(paths.pretest, report)
    plot_note(f"pre-test {reason}", paths.pretest_plot)
    get_run_logger().warning("pre-test %s", reason)
    return report


def _log_rates(result: PretestResult, warn_below: float) -> None:
    logger = get_run_logger()
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
        if rate == rate and rate < warn_below:
            logger.warning(
                "only %.1f%% of coordinates pass %s (below pretest.warn_below=%.0f%%): EMA's "
                "normality assumption is weak for this setup",
                100 * rate,
                name,
                100 * warn_below,
            )
