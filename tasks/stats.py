"""Statistics tasks: collect the clients' updates at a global model, test their normality."""

from __future__ import annotations

import dataclasses

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from federated.client import client_gradient, train_client
from federated.seeding import SHUFFLE, derive_seed
from federated.server import Federation, ServerState
from federated.stats import PretestResult, pretest_normality, sample_coordinates
from federated.vectors import layout_of

__all__ = ["collect_client_updates", "test_normality"]


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
    federation: Federation, updates: torch.Tensor, *, alpha: float, max_tests: int | None, seed: int
) -> PretestResult:
    coords = sample_coordinates(updates.shape[1], max_tests, seed)
    return pretest_normality(
        updates.detach().cpu().double().numpy(),
        alpha=alpha,
        layer_slices=layout_of(federation.model).slices(),
        coords=coords,
    )


test_normality.__test__ = False  # not a pytest test despite its name
