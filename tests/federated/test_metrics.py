import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from federated.metrics import accuracy_auc, binary_auc, calibration, evaluate


def test_binary_auc_extremes_and_a_single_class():
    assert binary_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert binary_auc(np.array([0, 0, 1, 1]), np.array([0.9, 0.8, 0.2, 0.1])) == 0.0
    assert binary_auc(np.array([0, 1]), np.array([0.5, 0.5])) == 0.5
    assert math.isnan(binary_auc(np.array([1, 1, 1]), np.array([0.1, 0.2, 0.3])))


def test_multi_class_and_multi_label_auc_match_medmnists_scikit_learn_definition():
    rng = np.random.default_rng(1)
    probabilities = rng.dirichlet(np.ones(4), size=80)
    classes = rng.integers(0, 4, 80)
    acc, auc = accuracy_auc(probabilities, classes, multi_label=False)
    assert acc == pytest.approx(float((probabilities.argmax(1) == classes).mean()))
    assert auc == pytest.approx(roc_auc_score(classes, probabilities, multi_class="ovr"))

    label_scores = rng.random((80, 3))
    labels = (rng.random((80, 3)) < 0.4).astype(int)
    _, auc = accuracy_auc(label_scores, labels, multi_label=True)
    assert auc == pytest.approx(roc_auc_score(labels, label_scores, average="macro"))


def test_calibration_by_hand():
    # top-label confidences 0.9 (right), 0.6 (wrong), 0.8 (right), 0.55 (right); of 15
    # bins, 0.6 and 0.55 share bin 8 (0.6 sits on an edge: the lower bin, as scikit-learn
    # bins it), 0.8 is bin 11 and 0.9 bin 13: ECE = (|-0.6 + 0.45| + 0.2 + 0.1) / 4
    scores = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.55, 0.45]])
    targets = np.array([0, 1, 1, 0])

    out = calibration(scores, targets)

    assert out["ece"] == pytest.approx(0.1125)
    assert out["brier"] == pytest.approx((0.1**2 + 0.6**2 + 0.2**2 + 0.45**2) / 4)


def test_calibration_of_three_classes_and_a_perfectly_calibrated_model():
    scores = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]])
    # Brier summed over classes: (0.09 + 0.04 + 0.01 + 0.01 + 0.64 + 0.81) / 2
    assert calibration(scores, np.array([0, 2]))["brier"] == pytest.approx(0.8)
    rng = np.random.default_rng(0)
    confidence = rng.uniform(0.5, 1.0, 200_000)
    right = rng.uniform(size=confidence.size) < confidence  # right as often as confident
    scores = np.stack([confidence, 1 - confidence], axis=1)
    assert calibration(scores, np.where(right, 0, 1))["ece"] < 0.01


def test_evaluate_reports_calibration_for_single_label_tasks_only():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    images = torch.randn(32, 1, 2, 2, generator=torch.Generator().manual_seed(0))
    targets = torch.arange(32) % 3

    single = evaluate(model, images, targets, multi_label=False)
    multi = evaluate(model, images, (torch.rand(32, 3) > 0.5).float(), multi_label=True)

    assert {"ece", "brier"} <= set(single) and 0 <= single["ece"] <= 1
    assert "ece" not in multi and "brier" not in multi
