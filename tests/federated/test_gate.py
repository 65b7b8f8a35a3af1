"""The gate before registration and before champion: a diverged, constant or
majority-class model is not registered, each with its reason; a champion that scores
better on the same held-out images is kept."""

from __future__ import annotations

import math

import numpy as np
import pytest

from federated.gate import champion_decision, majority_share, registration_decision

GOOD = {"test_loss": 0.48, "test_acc": 0.78, "test_auc": 0.81, "test_ece": 0.1}


def test_a_model_above_a_constant_and_a_majority_class_predictor_is_registered() -> None:
    decision = registration_decision(GOOD, majority=0.73)

    assert decision.passed
    assert decision.scores == GOOD | {"majority_acc": 0.73}


@pytest.mark.parametrize(
    ("results", "majority", "reason"),
    [
        (GOOD | {"test_loss": 4666.0, "test_auc": 0.5, "test_acc": 0.73}, 0.73,
         "test AUC 0.500 is no better than a constant predictor's 0.5"),
        (GOOD | {"test_loss": math.nan}, 0.73, "test_loss not finite: the model diverged"),
        (GOOD | {"test_auc": math.inf, "test_ece": math.nan}, None,
         "test_auc, test_ece not finite: the model diverged"),
        (GOOD | {"test_acc": 0.70}, 0.73,
         "test accuracy 0.700 is below the majority class's share 0.730"),
        ({"val_auc": 0.9}, 0.73, "no test scores: the model was not scored on held-out data"),
    ],
)  # fmt: skip
def test_a_model_no_better_than_a_trivial_one_is_refused_with_its_reason(
    results: dict, majority: float | None, reason: str
) -> None:
    decision = registration_decision(results, majority)

    assert not decision.passed and decision.reason == reason


def test_the_majority_share_is_that_of_single_label_targets_only() -> None:
    assert majority_share(np.array([0, 1, 1, 1])) == 0.75
    assert majority_share(np.array([[1, 0], [0, 1]])) is None  # multi-label
    assert majority_share(np.array([], dtype=int)) is None


def test_the_champion_is_replaced_only_by_a_model_no_worse_on_the_same_images() -> None:
    assert champion_decision(0.80, None).passed  # no champion yet
    assert champion_decision(0.80, 0.80).passed
    kept = champion_decision(0.79, 0.81)
    assert not kept.passed
    assert kept.reason.startswith("the champion is kept: its test AUC 0.8100 on the same")
    assert kept.scores == {"candidate_test_auc": 0.79, "champion_test_auc": 0.81}
    other = champion_decision(0.9, None, "its schema (classes, channels, size) differs")
    assert not other.passed and other.reason.endswith("differs")
