"""The run's driver around the one round loop, for the simulated and the real federation
alike: what a round ends with, and how a run that stops early says why.

After each round of :func:`federated.loop.train` the driver hands the round's report to
the run's record (MLflow in the train stage; the hub's journal on a Flower hub, which the
hub's pipeline follows into MLflow through the same record), then checkpoints the state
(a kill in between re-runs, and re-records, that round identically on resume: no round
goes missing), then says the round in one line (:func:`round_line`). A run the privacy
budget ends before its rounds says why (:attr:`RunEnd.stopped_early`: the MLflow run's
``stopped_early`` tag). The engine writes nothing itself: the record, the checkpoint and
the log are the caller's callables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from federated.loop import train
from federated.server import Federation, RoundReport, ServerState

__all__ = ["RunDriver", "RunEnd", "round_line", "stopped_early"]

Record = Callable[[RoundReport], None]  # the run's tracking of one round
Checkpoint = Callable[[ServerState], None]  # the state after a round, kept for --resume
Say = Callable[[str], None]  # a logger's method

# the scores a round's line shows, as (shown name, metric): the test AUC is not scored
# every round under eval.round_scores: accuracy, so each is shown only when present
SHOWN = (("loss", "test_loss"), ("acc", "test_acc"), ("auc", "test_auc"))


def round_line(report: RoundReport, rounds: int) -> str:
    """The one log line of a round, wherever it ran."""
    metrics = report.metrics
    scores = " ".join(f"{name} {metrics[key]:.4f}" for name, key in SHOWN if key in metrics)
    left_out = sum(bool(row.get("excluded")) for row in report.clients)
    skipped = (
        "; too few clients kept: round skipped, the model unchanged"
        if metrics.get("round_skipped")
        else ""
    )
    return (
        f"round {report.round}/{rounds}: test {scores or '(not scored)'}, "
        f"{left_out} of {len(report.clients)} clients left out{skipped}"
    )


def stopped_early(federation: Federation, state: ServerState, rounds: int) -> str | None:
    """Why a run that ended before ``rounds`` ended there, when the privacy budget ended it."""
    return federation.budget_spent(state) if state.round < rounds else None


@dataclass(frozen=True)
class RunEnd:
    """How a run ended: its last state, and the privacy budget's reason when it stopped
    the run early (None otherwise)."""

    state: ServerState
    stopped_early: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunDriver:
    """Every round's record, checkpoint and log line, then the run's end.

    ``record`` (tracking), ``checkpoint`` and ``say`` are each optional: a comparison cell
    tracks its rounds at the end instead, untracked rounds need no line."""

    rounds: int
    record: Record | None = None
    checkpoint: Checkpoint | None = None
    say: Say | None = None
    warn: Say | None = None

    def round_ended(self, report: RoundReport, state: ServerState) -> None:
        """Record the round, then checkpoint it, then say it."""
        if self.record is not None:
            self.record(report)
        if self.checkpoint is not None:
            self.checkpoint(state)
        self.said(report)

    def journaled(self, report: RoundReport) -> None:
        """A round that another process ran and checkpointed (a Flower hub's ServerApp,
        which journals it), recorded and said here."""
        if self.record is not None:
            self.record(report)
        self.said(report)

    def said(self, report: RoundReport) -> None:
        if self.say is not None:
            self.say(round_line(report, self.rounds))

    def run(
        self,
        federation: Federation,
        state: ServerState,
        *,
        should_stop: Callable[[], bool] | None = None,
        on_client: Callable[[int], None] | None = None,
        on_round: Callable[[RoundReport, ServerState], None] | None = None,
    ) -> RunEnd:
        """The rounds from ``state`` to ``rounds`` (:func:`federated.loop.train`), each
        ended by :meth:`round_ended` and then ``on_round`` (a progress bar)."""

        def ended(report: RoundReport, new_state: ServerState) -> None:
            self.round_ended(report, new_state)
            if on_round is not None:
                on_round(report, new_state)

        state = train(
            federation, state, self.rounds, on_round=ended, should_stop=should_stop,
            on_client=on_client,
        )  # fmt: skip
        reason = stopped_early(federation, state, self.rounds)
        if reason is not None and self.warn is not None:
            self.warn(reason)
        return RunEnd(state, reason)
