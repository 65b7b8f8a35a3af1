"""The one round loop: every training in the project (the train flow, a comparison grid's
cells, the benchmarks) runs its rounds through :func:`train`.

A run ends after ``rounds`` completed rounds, or earlier when a round left out more
clients than ``max_excluded`` allows (``state.halted`` says why; the caller fails the
run), when the next round would spend more privacy budget than the target (the run ends
cleanly with its last admissible model), or when ``should_stop`` says so before a round.
"""

from __future__ import annotations

from collections.abc import Callable

from federated.server import Federation, RoundReport, ServerState

__all__ = ["OnRound", "train"]

OnRound = Callable[[RoundReport, ServerState], None]  # after each round: track, checkpoint


def train(
    federation: Federation,
    state: ServerState,
    rounds: int,
    *,
    on_round: OnRound | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_client: Callable[[int], None] | None = None,
) -> ServerState:
    """Run rounds from ``state`` until ``rounds`` are complete or the run must end; the
    last state. ``on_round(report, state)`` sees every round as it ends (metrics,
    checkpoint); ``should_stop()`` is asked before each round (it may also raise to stop);
    ``on_client(client_id)`` is told as each client of a round is done (a progress bar)."""
    while state.round < rounds and state.halted is None:
        if federation.budget_spent(state) is not None:
            break
        if should_stop is not None and should_stop():
            break
        state, report = federation.run_round(state, on_client=on_client)
        if on_round is not None:
            on_round(report, state)
    return state
