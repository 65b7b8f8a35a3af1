"""Label flipping: exact rate, exact mapping, purity and seeding."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from federated.attacks import build_attack, flip_labels


def test_reverse_mapping_at_full_rate_is_exact() -> None:
    labels = torch.tensor([0, 1, 2, 2])

    out = build_attack("label_flip").poison_labels(labels, num_classes=3, seed=0)

    assert out.tolist() == [2, 1, 0, 0]
    assert labels.tolist() == [0, 1, 2, 2]  # input untouched


def test_rate_flips_exactly_that_share_of_labels() -> None:
    labels = np.zeros((100, 1), dtype=np.uint8)  # MedMNIST layout

    out = flip_labels(labels, num_classes=2, rate=0.3, mapping="reverse", seed=1)

    assert out.shape == (100, 1) and out.dtype == np.uint8
    assert int((out != labels).sum()) == 30
    assert set(np.unique(out[out != labels])) == {1}
    assert int(labels.sum()) == 0  # input untouched


def test_rate_rounds_half_up() -> None:
    out = flip_labels(np.zeros(10, dtype=np.int64), num_classes=2, rate=0.25, seed=0)

    assert int((out != 0).sum()) == 3


def test_random_mapping_changes_every_chosen_label_to_another_class() -> None:
    labels = torch.arange(5).repeat(200)  # 1000 labels, 5 classes

    out = flip_labels(labels, num_classes=5, rate=0.5, mapping="random", seed=7)

    changed = out != labels
    assert int(changed.sum()) == 500
    assert out.dtype == labels.dtype
    assert int(out.min()) >= 0 and int(out.max()) <= 4
    # each class's flips reach all four other classes
    for c in range(5):
        targets = set(out[changed & (labels == c)].tolist())
        assert targets == set(range(5)) - {c}


def test_same_seed_same_flips_other_seed_other_flips() -> None:
    labels = torch.arange(10).repeat(10)

    a = flip_labels(labels, num_classes=10, rate=0.5, mapping="random", seed=1)
    b = flip_labels(labels, num_classes=10, rate=0.5, mapping="random", seed=1)
    c = flip_labels(labels, num_classes=10, rate=0.5, mapping="random", seed=2)

    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_reverse_with_odd_classes_keeps_the_middle_class() -> None:
    out = flip_labels(np.array([0, 1, 2, 3, 4]), num_classes=5, seed=0)

    assert out.tolist() == [4, 3, 2, 1, 0]


@pytest.mark.parametrize(
    ("labels", "classes", "match"),
    [(np.array([0, 3]), 3, "labels must lie in"), (np.array([0]), 1, "num_classes >= 2")],
)
def test_bad_labels_are_refused(labels: np.ndarray, classes: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        flip_labels(labels, num_classes=classes, seed=0)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 300),
    classes=st.integers(2, 12),
    rate=st.floats(0.0, 1.0),
    mapping=st.sampled_from(["reverse", "random"]),
    seed=st.integers(0, 2**31),
)
def test_property_exact_count_and_valid_classes(
    size: int, classes: int, rate: float, mapping: str, seed: int
) -> None:
    labels = np.random.default_rng(seed).integers(0, classes, size=size)

    out = flip_labels(labels, num_classes=classes, rate=rate, mapping=mapping, seed=seed)

    chosen = math.floor(rate * size + 0.5 + 1e-9)
    changed = int((out != labels).sum())
    assert out.shape == labels.shape
    assert ((out >= 0) & (out < classes)).all()
    if mapping == "random" or classes % 2 == 0:
        assert changed == chosen  # every chosen label moves
    else:
        assert changed <= chosen  # reverse keeps the middle class of an odd C
