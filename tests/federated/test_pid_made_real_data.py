"""PID-MADE and the distance CUSUM on real data: the issue's new-user scenario (20
clients, a fifth of them flipping every label, 10 rounds) on scikit-learn's digits."""

from __future__ import annotations

import pytest

from config.params import Params
from federated.data import load_digits
from federated.loop import train
from tasks.partition import split_partition
from tasks.training import federation_from_params


def first_exclusions(filt: dict) -> tuple[dict[int, int], set[int], set[str]]:
    """The round each client was first left out by ``filt``, the attackers, the notes."""
    params = Params.model_validate(
        {
            "data": {"dataset": "digits"},
            "partition": {"num_clients": 20},
            "model": {"name": "logreg"},  # training as params.yaml sets it
            "train": {"rounds": 10, "local_epochs": 2, "lr": 0.05, "device": "cpu"},
            "filters": [filt],
            "attack": {"name": "label_flip", "fraction": 0.2},
            "noniid": {"every": 0},
        }
    )
    data = load_digits()
    parts, root, _ = split_partition(data.train.targets, "iid", 20, params.seed, {}, 0)
    federation = federation_from_params(params, data, parts, root, validation_every_round=False)
    state = train(federation, federation.initial_state(), params.train.rounds)
    rows = [row for row in state.trail if row["reason"] == filt["name"]]
    first = {row["client"]: row["round"] for row in reversed(rows) if row["excluded"]}
    return first, set(federation.threat.malicious), {row["message"] for row in rows}


def test_the_papers_defaults_ban_every_label_flipper_in_the_first_round() -> None:
    first, attackers, notes = first_exclusions({"name": "pid_made"})

    assert len(attackers) == 4 and {first.get(a) for a in attackers} == {1}
    assert any(note.startswith("gaussian threshold mean + 1.64·std") for note in notes)


@pytest.mark.parametrize(
    ("filt", "note"),
    [
        ({"name": "pid_made", "threshold": "cusum"}, "cusum of the robust z of the PID score"),
        ({"name": "distance_cusum"}, "cusum of the robust z of the distance"),
    ],
)
def test_the_cusums_ban_every_label_flipper_early_and_no_honest_client(
    filt: dict, note: str
) -> None:
    first, attackers, notes = first_exclusions(filt)

    assert set(first) == attackers and len(attackers) == 4
    assert max(first.values()) <= 3
    assert any(message.startswith(note) for message in notes)
