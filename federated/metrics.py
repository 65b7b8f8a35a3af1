"""Loss, accuracy and AUC as MedMNIST's evaluator computes them, and calibration.

ACC: argmax for single-label tasks (for two classes the same as thresholding p(class 1)
at 0.5); per-label accuracy at 0.5, averaged, for multi-label tasks. AUC: scikit-learn's
``roc_auc_score`` of p(class 1) for binary tasks, the mean one-vs-rest AUC over classes
for multi-class tasks, the mean over labels for multi-label tasks (MedMNIST's
``evaluator.getAUC``). A class absent from the targets (no positives or no negatives) has
no AUC and is left out of the mean, where MedMNIST's evaluator would raise; NaN if none
is left.

Calibration (single-label tasks): the expected calibration error over 15 equal-width
bins of the top-label confidence, ``ECE = Σ_b (n_b / N) |acc_b − conf_b|`` (Naeini,
Cooper and Hauskrecht, AAAI 2015; Guo, Pleiss, Sun and Weinberger, ICML 2017), with
scikit-learn's binning (``sklearn.calibration.calibration_curve``, strategy uniform: a
confidence on a bin edge falls in the lower bin); and scikit-learn's Brier score of the
class probabilities (``brier_score_loss``: for two classes the mean squared error of
p(class 1), for more the mean over samples of the squared error summed over classes).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional

__all__ = [
    "CALIBRATION_BINS",
    "accuracy_auc",
    "binary_auc",
    "calibration",
    "evaluate",
    "logits_of",
    "loss_function",
    "probabilities_of",
    "scores_of",
    "site_scores",
    "site_summary",
    "top_label",
]

CALIBRATION_BINS = 15


def loss_function(multi_label: bool) -> nn.Module:
    """Cross-entropy for single-label tasks, BCE on logits for multi-label ones (summing
    nothing: mean over the batch)."""
    return nn.BCEWithLogitsLoss() if multi_label else nn.CrossEntropyLoss()


def binary_auc(y_true: np.ndarray, y_score: np.ndarray) -> float:
    """scikit-learn's ROC AUC of ``y_score`` for the 0/1 labels ``y_true``; NaN when only
    one class is present (scikit-learn would raise). scikit-learn is imported on first use,
    so the stages that never score a model (partition, pretest) do not load it."""
    from sklearn.metrics import roc_auc_score

    positive = np.asarray(y_true).astype(bool)
    if positive.all() or not positive.any():
        return math.nan
    return float(roc_auc_score(positive, y_score))


def accuracy_auc(scores: np.ndarray, targets: np.ndarray, multi_label: bool) -> tuple[float, float]:
    """``scores``: probabilities ``(N, C)``; ``targets``: ``(N,)`` class ids or ``(N, L)`` 0/1."""
    if multi_label:
        acc = float(((scores > 0.5) == (targets > 0.5)).mean())
        per_label = [binary_auc(targets[:, j], scores[:, j]) for j in range(targets.shape[1])]
    elif scores.shape[1] == 2:
        acc = float((scores.argmax(axis=1) == targets).mean())
        per_label = [binary_auc(targets == 1, scores[:, 1])]
    else:
        acc = float((scores.argmax(axis=1) == targets).mean())
        per_label = [binary_auc(targets == c, scores[:, c]) for c in range(scores.shape[1])]
    finite = [a for a in per_label if not math.isnan(a)]
    return acc, float(np.mean(finite)) if finite else math.nan


def top_label(scores: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's top-label confidence and whether that label is right, ``(N,)`` each."""
    return scores.max(axis=1), (scores.argmax(axis=1) == targets).astype(float)


def calibration(
    scores: np.ndarray, targets: np.ndarray, bins: int = CALIBRATION_BINS
) -> dict[str, float]:
    """ECE (top label, ``bins`` equal-width bins) and the Brier score of ``scores``
    (probabilities ``(N, C)``) for class ids ``targets`` ``(N,)``."""
    from sklearn.metrics import brier_score_loss

    confidence, correct = top_label(scores, targets)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.searchsorted(edges[1:-1], confidence)  # calibration_curve's binning
    gap = np.bincount(which, weights=correct - confidence, minlength=bins)
    ece = float(np.abs(gap).sum() / len(targets))
    exact = scores / scores.sum(axis=1, keepdims=True)  # a float32 softmax sums to 1 ± 1e-7
    brier = float(brier_score_loss(targets, exact, labels=list(range(scores.shape[1]))))
    return {"ece": ece, "brier": brier}


@torch.no_grad()
def logits_of(model: nn.Module, images: Tensor, batch_size: int = 512) -> Tensor:
    """The model's outputs on ``images`` in batches (model put in eval mode)."""
    model.eval()
    return torch.cat([model(images[i : i + batch_size]) for i in range(0, len(images), batch_size)])


def probabilities_of(logits: Tensor, multi_label: bool) -> np.ndarray:
    """Class (softmax) or label (sigmoid) probabilities, float64 ``(N, C)``."""
    out = torch.sigmoid(logits) if multi_label else torch.softmax(logits, dim=1)
    return out.double().cpu().numpy()


def scores_of(
    logits: Tensor, targets: Tensor, *, multi_label: bool, full: bool = True
) -> dict[str, float]:
    """Mean loss, ACC and AUC of ``logits`` against ``targets``, and for single-label
    tasks the ECE and Brier score; with ``full=False`` the loss and ACC only (the AUC's
    per-class ROC curves cost tens of milliseconds a call, most of a cross-device round)."""
    if multi_label:
        loss = functional.binary_cross_entropy_with_logits(logits, targets).item()
    else:
        loss = functional.cross_entropy(logits, targets).item()
    if not full:
        hits = (logits > 0) == (targets > 0.5) if multi_label else logits.argmax(1) == targets
        return {"loss": float(loss), "acc": hits.sum().item() / hits.numel()}
    scores, labels = probabilities_of(logits, multi_label), targets.cpu().numpy()
    acc, auc = accuracy_auc(scores, labels, multi_label=multi_label)
    calibrated = {} if multi_label else calibration(scores, labels)
    return {"loss": float(loss), "acc": acc, "auc": auc, **calibrated}


def evaluate(
    model: nn.Module,
    images: Tensor,
    targets: Tensor,
    *,
    multi_label: bool,
    batch_size: int = 512,
    full: bool = True,
) -> dict[str, float]:
    """:func:`scores_of` the model on one split (model put in eval mode)."""
    logits = logits_of(model, images, batch_size)
    return scores_of(logits, targets, multi_label=multi_label, full=full)


def site_scores(
    model: nn.Module,
    sites: dict[int, tuple[Tensor, Tensor]],
    *,
    multi_label: bool,
    batch_size: int = 512,
) -> list[dict[str, float]]:
    """:func:`evaluate` on each site's local test split (``sites``: site id -> images,
    targets; empty splits left out), one row per site with its id and size."""
    return [
        {"site": site, "n": len(targets),
         **evaluate(model, images, targets, multi_label=multi_label, batch_size=batch_size)}
        for site, (images, targets) in sites.items()
        if len(targets)
    ]  # fmt: skip


def site_summary(rows: list[dict[str, float]], target_acc: float) -> dict[str, float]:
    """The spread of per-site results (``rows``: one per site, with ``site`` and ``acc``):
    the worst and best site's accuracy and which sites they are, the standard deviation
    and range of accuracy over sites, and the share of sites at or above ``target_acc``."""
    acc = np.array([row["acc"] for row in rows], dtype=float)
    worst, best = int(acc.argmin()), int(acc.argmax())
    return {
        "site_acc_worst": float(acc[worst]),
        "site_worst": int(rows[worst]["site"]),
        "site_acc_best": float(acc[best]),
        "site_best": int(rows[best]["site"]),
        "site_acc_std": float(acc.std()),
        "site_acc_range": float(acc[best] - acc[worst]),
        "sites_at_target": float((acc >= target_acc).mean()),
    }
