"""The run's driver, the one both runtimes run around the round loop: each round recorded,
then checkpointed, then said in one line; a run the privacy budget ends says why."""

from __future__ import annotations

from typing import Any

from config.params import Params, privacy_budget
from federated.data import load_digits
from federated.driver import RunDriver, round_line
from federated.partition import build_partitioner
from federated.server import RoundReport, ServerState
from tasks.training import federation_from_params

BASE: dict[str, Any] = {
    "data": {"dataset": "digits"},
    "model": {"name": "logreg"},
    "partition": {"num_clients": 3},
    "train": {"rounds": 3, "device": "cpu", "backend": "sequential"},
    "noniid": {"every": 0, "final": False},
    "eval": {"round_scores": "accuracy"},  # the test AUC only on the last round
}


def budget_for_one_round() -> Params:
    """Central DP whose ε target admits round 1 and not round 2."""
    private = BASE | {"privacy": {"mode": "central", "noise_multiplier": 1.0}}
    budget = privacy_budget(Params.model_validate(private))
    target = (budget.epsilon(1) + budget.epsilon(2)) / 2
    return Params.model_validate(
        private | {"privacy": private["privacy"] | {"target_epsilon": target}}
    )


def test_a_round_is_recorded_then_checkpointed_then_said_and_the_budget_says_why_it_ended():
    params = budget_for_one_round()
    data = load_digits()
    parts = build_partitioner("iid")(data.train.targets, 3, seed=0)
    federation = federation_from_params(params, data, parts)
    events: list[tuple[str, int]] = []
    lines: list[str] = []

    def record(report: RoundReport) -> None:
        events.append(("record", report.round))

    def checkpoint(state: ServerState) -> None:
        events.append(("checkpoint", state.round))

    driver = RunDriver(rounds=3, record=record, checkpoint=checkpoint, say=lines.append)
    end = driver.run(federation, federation.initial_state())

    assert end.state.round == 1 and events == [("record", 1), ("checkpoint", 1)]
    assert end.stopped_early is not None and end.stopped_early.startswith("privacy budget: round 2")
    assert lines[0].startswith("round 1/3: test loss ") and "auc" not in lines[0]
    assert lines[0].endswith("0 of 3 clients left out")


def test_the_round_line_shows_the_scores_a_round_has():
    clients = [{"client": 0, "excluded": True}, {"client": 1, "excluded": False}]
    full = RoundReport(4, {"test_loss": 0.5, "test_acc": 0.75, "test_auc": 0.8125}, clients)
    accuracy = RoundReport(2, {"test_loss": 0.5, "test_acc": 0.75}, clients)

    assert round_line(full, 4) == (
        "round 4/4: test loss 0.5000 acc 0.7500 auc 0.8125, 1 of 2 clients left out"
    )
    assert (
        round_line(accuracy, 4) == "round 2/4: test loss 0.5000 acc 0.7500, 1 of 2 clients left out"
    )


def test_the_round_line_says_when_the_round_was_skipped():
    clients = [{"client": 0, "excluded": True}, {"client": 1, "excluded": True}]
    skipped = RoundReport(1, {"test_acc": 0.5, "round_skipped": 1.0}, clients)

    assert round_line(skipped, 3) == (
        "round 1/3: test acc 0.5000, 2 of 2 clients left out; too few clients kept: round "
        "skipped, the model unchanged"
    )
