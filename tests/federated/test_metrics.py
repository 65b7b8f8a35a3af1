import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from federated.metrics import accuracy_auc, binary_auc


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
