"""Loss, accuracy and AUC as MedMNIST's evaluator computes them.

ACC: argmax for single-label tasks (for two classes the same as thresholding p(class 1)
at 0.5); per-label accuracy at 0.5, averaged, for multi-label tasks. AUC: scikit-learn's
``roc_auc_score`` of p(class 1) for binary tasks, the mean one-vs-rest AUC over classes
for multi-class tasks, the mean over labels for multi-label tasks (MedMNIST's
``evaluator.getAUC``). A class absent from the targets (no positives or no negatives) has
no AUC and is left out of the mean, where MedMNIST's evaluator would raise; NaN if none
is left.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional

__all__ = ["accuracy_auc", "binary_auc", "evaluate", "loss_function"]


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


@torch.no_grad()
def evaluate(
    model: nn.Module, images: Tensor, targets: Tensor, *, multi_label: bool, batch_size: int = 512
) -> dict[str, float]:
    """Mean loss, ACC and AUC of ``model`` on one split (model put in eval mode)."""
    model.eval()
    logits = torch.cat(
        [model(images[i : i + batch_size]) for i in range(0, len(images), batch_size)]
    )
    if multi_label:
        loss = functional.binary_cross_entropy_with_logits(logits, targets).item()
        probabilities = torch.sigmoid(logits)
    else:
        loss = functional.cross_entropy(logits, targets).item()
        probabilities = torch.softmax(logits, dim=1)
    acc, auc = accuracy_auc(
        probabilities.double().cpu().numpy(), targets.cpu().numpy(), multi_label=multi_label
    )
    return {"loss": float(loss), "acc": acc, "auc": auc}
