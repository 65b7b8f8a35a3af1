"""The gate a trained model passes before it is registered, and before it becomes the
champion that hospitals load (TFX's Evaluator "blesses" a candidate the same way).

Registration: every final test score is finite, the test AUC is above 0.5 (what a
constant or majority-class predictor scores), and the test accuracy is at least the
majority class's share of the test split (what always answering that class scores),
when that share is known.

Champion: registered, and no worse than the current champion scored on the same
held-out images now: its test AUC at least the champion's. A champion whose schema
differs (classes, channels, size) is kept, and the decision says so; one registered by an
older fedsieve, which takes no image files, is replaced as if there were none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["GateDecision", "champion_decision", "majority_share", "registration_decision"]

CONSTANT_AUC = 0.5  # a predictor that gives every image the same score


@dataclass(frozen=True)
class GateDecision:
    """Whether the model passed, why (one line), and the scores the decision read."""

    passed: bool
    reason: str
    scores: dict[str, float] = field(default_factory=dict)


def majority_share(targets: np.ndarray) -> float | None:
    """The share of the most frequent class among single-label ``targets`` ``(N,)``
    (None for multi-label targets ``(N, L)`` or an empty split)."""
    targets = np.asarray(targets)
    if targets.size == 0 or targets.ndim != 1:
        return None
    counts = np.bincount(targets.astype(np.int64))
    return float(counts.max() / counts.sum())


def registration_decision(results: Mapping[str, object], majority: float | None) -> GateDecision:
    """Whether a model with final ``results`` (``test_*`` scores) may be registered."""
    tested = {k: v for k, v in results.items() if k.startswith("test_") and v is not None}
    scores = {k: float(v) for k, v in tested.items() if isinstance(v, int | float)}
    if majority is not None:
        scores["majority_acc"] = majority
    if "test_auc" not in scores or "test_acc" not in scores:
        return GateDecision(
            False, "no test scores: the model was not scored on held-out data", scores
        )
    broken = sorted(k for k, v in scores.items() if not math.isfinite(v))
    if broken:
        return GateDecision(False, f"{', '.join(broken)} not finite: the model diverged", scores)
    if scores["test_auc"] <= CONSTANT_AUC:
        return GateDecision(
            False,
            f"test AUC {scores['test_auc']:.3f} is no better than a constant predictor's 0.5",
            scores,
        )
    if majority is not None and scores["test_acc"] < majority:
        return GateDecision(
            False,
            f"test accuracy {scores['test_acc']:.3f} is below the majority class's share "
            f"{majority:.3f}",
            scores,
        )
    return GateDecision(
        True, "finite scores, above a constant and a majority-class predictor", scores
    )


def champion_decision(
    candidate_auc: float, champion_auc: float | None, champion_note: str = ""
) -> GateDecision:
    """Whether the registered candidate replaces the champion (``champion_auc``: its test
    AUC on the same held-out images; None with ``champion_note`` saying why it has none,
    or an empty note when there is no champion)."""
    scores = {"candidate_test_auc": candidate_auc}
    if champion_auc is None:
        if champion_note:
            return GateDecision(False, f"the champion is kept: {champion_note}", scores)
        return GateDecision(True, "no champion yet", scores)
    scores["champion_test_auc"] = champion_auc
    if candidate_auc < champion_auc:
        return GateDecision(
            False,
            f"the champion is kept: its test AUC {champion_auc:.4f} on the same held-out "
            f"images is above this model's {candidate_auc:.4f}",
            scores,
        )
    return GateDecision(
        True,
        f"test AUC {candidate_auc:.4f} on the same held-out images, the champion's "
        f"{champion_auc:.4f}",
        scores,
    )
