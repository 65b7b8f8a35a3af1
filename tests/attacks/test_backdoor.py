"""Backdoor: the trigger, the seeded poisoning, model replacement, and a real federation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aggregation import build_aggregator
from federated.attacks import build_attack, client_seed
from federated.backdoor_eval import attack_success_rate, triggered_test_set
from federated.client import ClientData, LocalTraining
from federated.data import load_medmnist, to_tensors
from federated.partition import build_partitioner
from federated.seeding import seeded_init
from federated.server import Defence, EvaluationSets, Federation, FederationConfig, ThreatModel
from models import build_model


def test_trigger_by_hand_on_every_channel() -> None:
    images = torch.zeros(1, 3, 5, 5)

    out = build_attack("backdoor", size=2, margin=1, value=0.7).stamp(images)

    expected = torch.zeros(5, 5)
    expected[2:4, 2:4] = 0.7
    for channel in range(3):
        assert torch.equal(out[0, channel], expected)
    assert int(images.count_nonzero()) == 0  # input untouched


@pytest.mark.parametrize(
    ("position", "rows", "columns"),
    [("top_left", (0, 3), (0, 3)), ("top_right", (0, 3), (4, 7)), ("bottom_left", (3, 6), (0, 3)),
     ("bottom_right", (3, 6), (4, 7))],
)  # fmt: skip
def test_trigger_corners_on_a_grey_non_square_image(
    position: str, rows: tuple[int, int], columns: tuple[int, int]
) -> None:
    out = build_attack("backdoor", size=3, margin=0, position=position).stamp(torch.zeros(2, 6, 7))

    expected = torch.zeros(6, 7)
    expected[rows[0] : rows[1], columns[0] : columns[1]] = 1.0
    assert torch.equal(out[1], expected)


def test_poison_stamps_and_relabels_exactly_the_seeded_share() -> None:
    images = torch.full((10, 1, 8, 8), -1.0)
    labels = torch.arange(10) % 3
    attack = build_attack("backdoor", target_label=2, poison_fraction=0.25)

    poisoned, relabelled = attack.poison(images, labels, num_classes=3, seed=4)
    again, _ = attack.poison(images, labels, num_classes=3, seed=4)
    other, _ = attack.poison(images, labels, num_classes=3, seed=5)

    stamped = (poisoned != images).flatten(1).any(dim=1)
    assert int(stamped.sum()) == 3  # round(0.25 * 10) halves up
    assert bool((relabelled[stamped] == 2).all())
    assert torch.equal(relabelled[~stamped], labels[~stamped])
    assert torch.equal(poisoned[~stamped], images[~stamped])
    assert torch.equal(poisoned, again) and not torch.equal(poisoned, other)
    assert bool((images == -1.0).all()) and torch.equal(labels, torch.arange(10) % 3)


def test_poison_keeps_medmnist_numpy_labels_and_their_type() -> None:
    labels = np.zeros((4, 1), dtype=np.int64)

    _, relabelled = build_attack("backdoor", target_label=1, poison_fraction=1.0).poison(
        torch.zeros(4, 1, 4, 4), labels, num_classes=2, seed=0
    )

    assert isinstance(relabelled, np.ndarray) and relabelled.shape == (4, 1)
    assert relabelled.tolist() == [[1]] * 4 and labels.tolist() == [[0]] * 4


@pytest.mark.parametrize(
    ("params", "images", "labels", "match"),
    [
        ({"target_label": 2}, torch.zeros(2, 1, 8, 8), torch.zeros(2), "not a class of a 2-class"),
        ({"size": 8}, torch.zeros(2, 1, 8, 8), torch.zeros(2), "does not fit 8x8 images"),
        ({}, torch.zeros(2, 1, 8, 8), torch.zeros(2, 3), "single-label class ids"),
        ({}, torch.zeros(3, 1, 8, 8), torch.zeros(2), "3 images for 2 labels"),
    ],
)
def test_impossible_poisoning_is_refused(params, images, labels, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_attack("backdoor", **params).poison(images, labels, num_classes=2, seed=0)


def test_a_backdoor_does_not_poison_labels_alone() -> None:
    with pytest.raises(NotImplementedError, match="call poison"):
        build_attack("backdoor").poison_labels(torch.zeros(2), num_classes=2, seed=0)


def test_label_flip_poison_leaves_the_images_and_flips_the_labels() -> None:
    images, labels = torch.zeros(4, 1, 2, 2), torch.tensor([0, 1, 2, 2])
    attack = build_attack("label_flip")

    same, flipped = attack.poison(images, labels, num_classes=3, seed=0)

    assert same is images
    assert torch.equal(flipped, attack.poison_labels(labels, num_classes=3, seed=0))


def test_model_replacement_boosts_by_n_over_eta_or_the_given_boost() -> None:
    updates = torch.ones(10, 2)
    mask = torch.zeros(10, dtype=torch.bool)
    mask[3] = True

    paper, _, diagnostics = build_attack("backdoor", model_replacement=True, eta=0.5).step(
        {}, updates, mask
    )
    given = build_attack("backdoor", model_replacement=True, boost=3.0).apply(updates, mask)
    plain = build_attack("backdoor").apply(updates, mask)

    assert paper[3].tolist() == [20.0, 20.0] and diagnostics == {"boost": 20.0}
    assert given[3].tolist() == [3.0, 3.0]
    assert torch.equal(plain, updates)
    assert torch.equal(paper[~mask], updates[~mask])


def test_end_to_end_one_backdoored_client_of_five_plants_the_backdoor(
    medmnist_root, one_thread
) -> None:
    # 10 FedAvg rounds on BreastMNIST, 5 IID clients, client 0 backdoored. Target 0 (malignant,
    # the minority class): triggered benign images must turn malignant, untriggered must not.
    attack = build_attack("backdoor", target_label=0, poison_fraction=0.5)
    data = load_medmnist("breastmnist", medmnist_root)
    images, targets = to_tensors(data.train, data.info)
    test_images, test_targets = to_tensors(data.test, data.info)
    clients = []
    for client_id, part in enumerate(build_partitioner("iid")(data.train.targets, 5, seed=0)):
        x, y = images[part], targets[part]
        if client_id == 0:
            x, y = attack.poison(x, y, num_classes=2, seed=client_seed(0, client_id))
        clients.append(ClientData(client_id, x, y))
    federation = Federation(
        model=seeded_init(
            0, lambda: build_model("small_cnn", in_channels=1, num_classes=2, width=8, hidden=32)
        ),
        clients=clients,
        local=LocalTraining(lr=0.05, batch_size=16, epochs=2),
        config=FederationConfig(rounds=10, seed=0),
        defence=Defence(rule=build_aggregator("fedavg")),
        evaluation=EvaluationSets(test=(test_images, test_targets)),
        threat=ThreatModel(malicious=frozenset({0}), model_attack=attack),
    )
    state = federation.initial_state()
    for _ in range(10):
        state, report = federation.run_round(state)
    model = federation.global_model(state)

    triggered = triggered_test_set(test_images, test_targets, attack)
    untriggered = test_images[test_targets != attack.target_label]
    assert report.metrics["test_acc"] > 0.74  # above the majority share (0.73)
    assert attack_success_rate(model, untriggered, attack.target_label) < 0.2
    assert attack_success_rate(model, triggered, attack.target_label) > 0.7
