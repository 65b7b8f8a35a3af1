"""Mimic: copies of an honest row, the learned direction, and the state in the open."""

from __future__ import annotations

import io

import pytest
import torch

from federated.attacks import build_attack, learn_direction

ROUND = torch.tensor([[9.0, 9.0], [0.5, 3.0], [-2.0, 0.0], [1.0, 1.0]])
MASK = torch.tensor([True, False, False, False])


def test_after_learning_it_copies_the_row_largest_along_the_direction() -> None:
    attack = build_attack("mimic", warmup=3)
    learned = {"round": 3, "mean": torch.zeros(2), "direction": torch.tensor([1.0, 0.0])}

    out, state, diagnostics = attack.step(learned, ROUND, MASK)

    # |<x_i, z>| = 0.5, 2, 1 -> row 2
    assert out[0].tolist() == [-2.0, 0.0]
    assert torch.equal(out[1:], ROUND[1:])
    assert diagnostics == {"mimicked_row": 2.0}
    assert state["round"] == 4 and torch.equal(state["direction"], learned["direction"])


def test_while_learning_it_copies_the_first_benign_row() -> None:
    attack = build_attack("mimic", warmup=3)

    out, state, diagnostics = attack.step(
        attack.init_state(), ROUND, MASK, torch.Generator().manual_seed(0)
    )

    assert out[0].tolist() == [0.5, 3.0]
    assert diagnostics == {"mimicked_row": 1.0}
    assert state["round"] == 1
    assert float(state["direction"].norm()) == pytest.approx(1.0)


def test_one_learning_step_by_hand() -> None:
    honest = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])

    mean, direction = learn_direction(honest, torch.zeros(2), torch.tensor([0.6, 0.8]), 0)

    # deviations are the rows; <x_i, z> = 0.6, -0.6; pull = 0.6 [1, 0] + 0.6 [1, 0] -> [1, 0]
    assert mean.tolist() == [0.0, 0.0]
    assert direction.tolist() == pytest.approx([1.0, 0.0])


def test_learning_averages_the_new_direction_into_the_old_one() -> None:
    honest = torch.tensor([[1.0, 2.0], [1.0, 0.0]])  # mean [1, 1]

    mean, direction = learn_direction(honest, torch.tensor([1.0, 3.0]), torch.tensor([0.0, 1.0]), 1)

    # running mean (1 * [1, 3] + [1, 1]) / 2 = [1, 2]; deviations [0, 0], [0, -2];
    # pull = 0 + (-2) [0, -2] = [0, 4] -> unit [0, 1]; (1 * [0, 1] + [0, 1]) / 2 -> [0, 1]
    assert mean.tolist() == [1.0, 2.0]
    assert direction.tolist() == [0.0, 1.0]


def test_over_rounds_it_learns_the_direction_of_largest_variance() -> None:
    centres = torch.tensor([[0, 0.5, 0], [3.0, 0, 0], [-3.0, 0, 0], [0, -0.5, 0], [0, 0, 0]])
    attack = build_attack("mimic", warmup=5)
    state = attack.init_state()
    noise = torch.Generator().manual_seed(3)
    for round_number in range(6):
        honest = centres + 0.1 * torch.randn(5, 3, generator=noise)
        updates = torch.cat([torch.zeros(2, 3), honest])
        mask = torch.tensor([True, True, False, False, False, False, False])
        out, state, diagnostics = attack.step(
            state, updates, mask, torch.Generator().manual_seed(round_number)
        )

    assert abs(float(state["direction"][0])) > 0.99
    assert diagnostics["mimicked_row"] in (3.0, 4.0)  # the clients at +-3 on axis 0
    assert torch.equal(out[0], out[int(diagnostics["mimicked_row"])])


def test_without_warmup_it_always_copies_the_first_benign_row() -> None:
    attack = build_attack("mimic", warmup=None)

    out, state, _ = attack.step(attack.init_state(), ROUND, MASK)

    assert out[0].tolist() == [0.5, 3.0]
    assert state["direction"] is None


def test_the_first_learning_round_needs_a_generator() -> None:
    with pytest.raises(ValueError, match=r"needs a torch\.Generator"):
        build_attack("mimic").apply(ROUND, MASK)


def test_the_state_survives_a_weights_only_checkpoint() -> None:
    attack = build_attack("mimic", warmup=2)
    _, state, _ = attack.step(attack.init_state(), ROUND, MASK, torch.Generator().manual_seed(0))
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)

    restored = torch.load(buffer, weights_only=True)
    resumed, _, _ = attack.step(restored, ROUND, MASK)
    direct, _, _ = attack.step(state, ROUND, MASK)

    assert torch.equal(resumed, direct)
