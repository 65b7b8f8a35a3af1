"""PID-MADE with its defaults on real data: the issue's new-user scenario (20 clients, a
fifth of them flipping every label, 10 rounds) on scikit-learn's handwritten digits."""

from __future__ import annotations

from config.params import Params
from federated.data import load_digits
from federated.loop import train
from tasks.partition import split_partition
from tasks.training import federation_from_params


def test_the_defaults_ban_every_label_flipper_early_and_no_honest_client() -> None:
    params = Params.model_validate(
        {
            "data": {"dataset": "digits"},
            "partition": {"num_clients": 20},
            "model": {"name": "logreg"},  # training as params.yaml sets it
            "train": {"rounds": 10, "local_epochs": 2, "lr": 0.05, "device": "cpu"},
            "filters": [{"name": "pid_made"}],
            "attack": {"name": "label_flip", "fraction": 0.2},
            "noniid": {"every": 0},
        }
    )
    data = load_digits()
    parts, root, _ = split_partition(data.train.targets, "iid", 20, params.seed, {}, 0)
    federation = federation_from_params(params, data, parts, root, validation_every_round=False)
    state = train(federation, federation.initial_state(), params.train.rounds)

    banned_in = {
        row["client"]: row["round"]
        for row in reversed(state.trail)
        if row["excluded"] and row["reason"] == "pid_made"
    }
    assert set(banned_in) == set(federation.threat.malicious) and len(banned_in) == 4
    assert max(banned_in.values()) <= 3
    pid_notes = {row["message"] for row in state.trail if row["reason"] == "pid_made"}
    assert any(note.startswith("cusum of the robust z") for note in pid_notes)
