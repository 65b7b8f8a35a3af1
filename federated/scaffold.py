"""SCAFFOLD's control variates around the round (Karimireddy et al. 2020, "SCAFFOLD:
Stochastic Controlled Averaging for Federated Learning", ICML, arXiv:1910.06378,
Algorithm 1 with option II).

The server keeps c; each client its own c_i. A sampled client trains from x with every
step corrected by c − c_i (:func:`federated.client.train_client` with its
:class:`~federated.client.ControlVariates`), then sets c_i⁺ = c_i − c + (x − y)/(K·η_l)
and sends Δy and Δc_i. The model update goes through the round's defence as any other;
the server moves c by (1/N)·Σ Δc_i over the clients whose model update reached the rule
(the same kept set), N the whole population. In a simulation the clients' c_i live in the
run's :class:`~federated.parts.ServerState` by client id: they are the clients' half,
kept here because the clients are here, and checkpointed with the server's half. Real
sites keep their c_i on their own disks (:mod:`flowerapp.site_controls`): the hub is sent
each Δc_i, adds the counted ones into c, and keeps nothing else of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from federated.client import ClientUpdate, ControlVariates
from federated.defence import Aggregation
from federated.execution import (
    BatchedExecutor,
    ClientExecutor,
    ClientResult,
    ControlledExecutor,
    OnResult,
    SequentialExecutor,
)
from federated.parts import ServerState
from federated.trail import TrailRows

__all__ = ["LOCAL_EXECUTORS", "advance_controls", "client_controls", "train_with_variates"]

LOCAL_EXECUTORS = (SequentialExecutor, BatchedExecutor)  # the clients (and their c_i) here


def train_with_variates(
    executor: ClientExecutor, state: ServerState, round_number: int, client_ids: Sequence[int],
    on_result: OnResult | None,
) -> list[ClientResult]:  # fmt: skip
    """SCAFFOLD's round through ``executor``: clients simulated here train with c and their
    c_i from the state; sites keep their own c_i and are sent c only."""
    assert state.control is not None  # a SCAFFOLD state holds c from round 0
    vector = state.global_vector
    if isinstance(executor, LOCAL_EXECUTORS):
        controls = client_controls(state, list(client_ids))
        return executor.train_with_controls(vector, round_number, controls, on_result)
    assert isinstance(executor, ControlledExecutor)  # checked when the federation was built
    return executor.train_with_control(vector, round_number, client_ids, state.control, on_result)


def client_controls(state: ServerState, client_ids: list[int]) -> dict[int, ControlVariates]:
    """Each client's control variates: the server's c and its own c_i (0 until it first
    trains)."""
    assert state.control is not None  # a SCAFFOLD state holds c from round 0
    zero = torch.zeros_like(state.control)
    return {
        i: ControlVariates(state.control, state.client_controls.get(i, zero)) for i in client_ids
    }


def advance_controls(
    state: ServerState,
    updates: list[ClientUpdate],
    outcome: Aggregation,
    rows: TrailRows,
    min_clients: int,
    population: int,
    *,
    keep_clients: bool,
) -> None:
    """The variates after the round, into ``state``: every client that sent a finite
    Δc_i keeps c_i + Δc_i (its own business: kept in ``state`` only when the clients are
    simulated here, ``keep_clients``); the server's c moves by (1/N)·Σ Δc_i over the
    clients whose model update reached the rule, unless the round was skipped (fewer
    than ``min_clients``) or halted. Each row says whether its Δc_i counted."""
    aggregated = len(outcome.kept_ids) >= min_clients and state.halted is None
    counted = set(outcome.kept_ids) if aggregated else set()
    assert state.control is not None
    controls = dict(state.client_controls)
    total: Tensor = torch.zeros_like(state.control)
    for update in updates:
        change = update.control_delta
        if change is None or not bool(torch.isfinite(change).all()):
            continue
        if keep_clients:
            controls[update.client_id] = (
                controls.get(update.client_id, torch.zeros_like(total)) + change
            )
        rows[update.client_id]["control_counted"] = update.client_id in counted
        if update.client_id in counted:
            total = total + change
    state.control = state.control + total / population
    state.client_controls = controls
