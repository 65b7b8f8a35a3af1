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

Federated evaluation (``eval.where: sites``): each site scores the global model on its
own held-out split and returns a :class:`SplitSummary`, aggregates only: its count, mean
loss, ACC and Brier score, the ECE's per-bin sums of (correct − confidence), and per
class the counts of its positives' and negatives' scores in :data:`AUC_BINS` fixed bins
(never a per-example value). :func:`pooled_scores` weights loss, ACC and Brier by the
sites' counts, sums the ECE's bins (the pooled ECE is the ECE of the pooled
predictions), and takes each class's AUC from the summed histograms (scikit-learn's
``roc_auc_score`` of the bins, weighted by their counts: a positive and a negative in one
bin count one half, as tied scores do).

The AUC bins are equal-width in asinh of the score's log-odds, l = log p − log(1 − p),
with l clipped to :data:`AUC_LOG_ODDS` (every float32 probability: the smallest is
1.4e-45, l = −103.3; the largest below 1 is 1 − 6e-8, l = 16.6; 0 and 1 fall in the end
bins): fine near p = 0.5 (a bin of l is 0.0011 wide there), relative far out (0.05 wide at
l = −50). Equal-width bins of p lose a class whose probabilities are all small (a rare
RetinaMNIST class, every score below 1e-17: one bin, AUC 0.5 for 0.54); equal-width
bins of l lose a model whose scores sit in a sliver near 0.5 (a small CNN after two
rounds: 3.3e-3 off). The pooled AUC is off by at most half the share of
positive-negative pairs in one bin (:func:`auc_bin_bound`). At 8,000 bins it was within
5.4e-5 of the AUC of the pooled predictions for logistic regression on digits,
BreastMNIST and RetinaMNIST after 1 to 200 epochs, 6.3e-4 untrained, and within 5.8e-4
for a small CNN on BreastMNIST after two and three rounds (1.2e-3 once after one round,
its scores all within 0.13 of one log-odds); tests/ hold it to 1e-3 on trained models.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional

__all__ = [
    "AUC_BINS",
    "AUC_LOG_ODDS",
    "CALIBRATION_BINS",
    "ModelDiverged",
    "SplitSummary",
    "accuracy_auc",
    "auc_bin_bound",
    "binary_auc",
    "calibration",
    "calibration_gaps",
    "evaluate",
    "histogram_auc",
    "logits_of",
    "loss_function",
    "pooled_scores",
    "probabilities_of",
    "score_histograms",
    "scores_of",
    "site_scores",
    "site_summary",
    "summarise",
    "summary_from",
    "summary_values",
    "top_label",
]

CALIBRATION_BINS = 15
AUC_BINS = 8000  # a site's AUC histograms: bins of asinh(the score's log-odds)
AUC_LOG_ODDS = (-105.0, 20.0)  # the log-odds they cover: every float32 probability


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

    gap = calibration_gaps(scores, targets, bins)
    ece = float(np.abs(gap).sum() / len(targets))
    exact = scores / scores.sum(axis=1, keepdims=True)  # a float32 softmax sums to 1 ± 1e-7
    brier = float(brier_score_loss(targets, exact, labels=list(range(scores.shape[1]))))
    return {"ece": ece, "brier": brier}


def calibration_gaps(
    scores: np.ndarray, targets: np.ndarray, bins: int = CALIBRATION_BINS
) -> np.ndarray:
    """Per confidence bin, the sum over its samples of (correct − top-label confidence),
    ``(bins,)``: the ECE is ``|gaps|.sum() / N``, and sites' gaps add up to the pooled ones."""
    confidence, correct = top_label(scores, targets)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.searchsorted(edges[1:-1], confidence)  # calibration_curve's binning
    return np.bincount(which, weights=correct - confidence, minlength=bins)


class ModelDiverged(ValueError):
    """The model's outputs are NaN or infinite: its training diverged (weights so large
    that the logits overflow). No score of such a model means anything, and no later
    round can bring it back, so scoring stops the run with this reason instead of
    scikit-learn's "Input contains NaN"."""


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
    per-class ROC curves cost tens of milliseconds a call, most of a cross-device round).
    Raises :class:`ModelDiverged` when an output is NaN or infinite."""
    finite = torch.isfinite(logits)
    if not bool(finite.all()):
        bad = int((~finite).any(dim=1).sum())
        raise ModelDiverged(
            f"the model's outputs are NaN or infinite for {bad} of {len(logits)} images: its "
            "training diverged (a smaller learning rate or a robust aggregation rule may help)"
        )
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


def _empty() -> np.ndarray:
    return np.zeros(0)


@dataclass(frozen=True)
class SplitSummary:
    """One site's scores of the global model on one held-out split, as aggregates that
    pool exactly enough (:func:`pooled_scores`); nothing per example. ``gaps`` (single-label)
    and the histograms are empty unless the split was scored fully."""

    n: int  # examples in the split (0: the site holds none)
    loss: float  # mean over the split
    acc: float
    brier: float = math.nan  # single-label tasks, scored fully
    gaps: np.ndarray = field(default_factory=_empty)  # (CALIBRATION_BINS,): calibration_gaps
    positives: np.ndarray = field(default_factory=_empty)  # (C, AUC_BINS): score_histograms
    negatives: np.ndarray = field(default_factory=_empty)  # (C, AUC_BINS)


def score_histograms(
    scores: np.ndarray, targets: np.ndarray, multi_label: bool, bins: int = AUC_BINS
) -> tuple[np.ndarray, np.ndarray]:
    """Per class (label), counts of the class's score ``scores[:, c]`` in ``bins``
    equal-width bins of asinh of its log-odds (clipped to :data:`AUC_LOG_ODDS`), over its
    positives (class c, or label c on) and over its negatives: two ``(C, bins)`` int64
    arrays."""
    low, high = np.arcsinh(AUC_LOG_ODDS)
    with np.errstate(divide="ignore"):  # p = 0 or 1: infinite log-odds, the end bins
        log_odds = np.clip(np.log(scores) - np.log1p(-scores), *AUC_LOG_ODDS)
    where = np.arcsinh(log_odds)
    classes = scores.shape[1]
    positives = np.zeros((classes, bins), dtype=np.int64)
    negatives = np.zeros((classes, bins), dtype=np.int64)
    for c in range(classes):
        positive = targets[:, c] > 0.5 if multi_label else targets == c
        positives[c] = np.histogram(where[positive, c], bins=bins, range=(low, high))[0]
        negatives[c] = np.histogram(where[~positive, c], bins=bins, range=(low, high))[0]
    return positives, negatives


def histogram_auc(positives: np.ndarray, negatives: np.ndarray) -> float:
    """The ROC AUC of scores known only by their bin counts ``(bins,)`` each:
    scikit-learn's ``roc_auc_score`` of the bins, weighted by the counts (a positive and a
    negative in one bin count one half, as tied scores do); NaN without positives or
    negatives."""
    from sklearn.metrics import roc_auc_score

    if not positives.sum() or not negatives.sum():
        return math.nan
    bins = np.arange(len(positives))
    hit_p, hit_n = positives > 0, negatives > 0
    truth = np.r_[np.ones(hit_p.sum()), np.zeros(hit_n.sum())]
    where = np.r_[bins[hit_p], bins[hit_n]]
    counts = np.r_[positives[hit_p], negatives[hit_n]].astype(float)
    return float(roc_auc_score(truth, where, sample_weight=counts))


def _auc_classes(classes: int, multi_label: bool) -> range:
    """The classes whose AUC is averaged: class 1 alone for a binary task (as
    :func:`accuracy_auc`), every class or label otherwise."""
    return range(1, 2) if not multi_label and classes == 2 else range(classes)


def auc_bin_bound(positives: np.ndarray, negatives: np.ndarray, multi_label: bool) -> float:
    """How far the AUC from ``(C, bins)`` histograms can be from the AUC of the scores
    they count: half the share of positive-negative pairs in one bin, the largest over
    the averaged classes (so also a bound for their mean)."""
    bounds = [
        0.5 * float(positives[c] @ negatives[c]) / (positives[c].sum() * negatives[c].sum())
        for c in _auc_classes(positives.shape[0], multi_label)
        if positives[c].sum() and negatives[c].sum()
    ]
    return max(bounds, default=0.0)


def summarise(
    logits: Tensor, targets: Tensor, *, multi_label: bool, full: bool = True
) -> tuple[SplitSummary, dict[str, float]]:
    """A split's :class:`SplitSummary` (what a site sends) and its own :func:`scores_of`
    (the site's row); with ``full=False`` loss and ACC only."""
    scores = scores_of(logits, targets, multi_label=multi_label, full=full)
    n = len(targets)
    if not full:
        return SplitSummary(n, scores["loss"], scores["acc"]), scores
    probabilities, labels = probabilities_of(logits, multi_label), targets.cpu().numpy()
    positives, negatives = score_histograms(probabilities, labels, multi_label)
    summary = SplitSummary(
        n, scores["loss"], scores["acc"], brier=scores.get("brier", math.nan),
        gaps=_empty() if multi_label else calibration_gaps(probabilities, labels),
        positives=positives, negatives=negatives,
    )  # fmt: skip
    return summary, scores


def pooled_scores(
    summaries: Sequence[SplitSummary], *, multi_label: bool, full: bool = True
) -> dict[str, float]:
    """The scores of the sites' pooled split, under :func:`scores_of`'s names: loss, ACC
    and Brier weighted by the sites' counts, the ECE from the summed bins, the AUC from the
    summed histograms (:func:`histogram_auc`); NaN when no site holds an example."""
    present = [s for s in summaries if s.n]
    total = sum(s.n for s in present)
    names = ["loss", "acc"]
    if full:
        names += ["auc"] if multi_label else ["auc", "ece", "brier"]
    if not total:
        return dict.fromkeys(names, math.nan)
    weights = np.array([s.n for s in present], dtype=float)

    def mean(name: str) -> float:
        return float(weights @ np.array([getattr(s, name) for s in present]) / total)

    pooled = {"loss": mean("loss"), "acc": mean("acc")}
    if not full:
        return pooled
    positives = np.sum([s.positives for s in present], axis=0)
    negatives = np.sum([s.negatives for s in present], axis=0)
    per_class = [
        histogram_auc(positives[c], negatives[c])
        for c in _auc_classes(positives.shape[0], multi_label)
    ]
    finite = [a for a in per_class if not math.isnan(a)]
    pooled["auc"] = float(np.mean(finite)) if finite else math.nan
    if not multi_label:
        gaps = np.sum([s.gaps for s in present], axis=0)
        pooled |= {"ece": float(np.abs(gaps).sum() / total), "brier": mean("brier")}
    return pooled


def summary_values(summary: SplitSummary) -> dict[str, Any]:
    """A summary as plain numbers and flat lists (what a site's reply record carries)."""
    return {
        "n": summary.n, "loss": summary.loss, "acc": summary.acc, "brier": summary.brier,
        "gaps": [float(g) for g in summary.gaps],
        "positives": [int(c) for c in summary.positives.ravel()],
        "negatives": [int(c) for c in summary.negatives.ravel()],
    }  # fmt: skip


def summary_from(
    values: Mapping[str, Any], *, classes: int, multi_label: bool, full: bool
) -> SplitSummary:
    """A summary as it came from a site (:func:`summary_values`), checked: nothing a site
    says is trusted because it said it. ``ValueError`` in one line when it does not add up
    (a negative count, histograms of another shape, a class whose positives and negatives
    are not the split's ``n``, calibration bins of another number)."""
    n = int(values["n"])
    if n < 0:
        raise ValueError(f"a split of {n} examples")
    loss, acc, brier = (float(values[k]) for k in ("loss", "acc", "brier"))
    if not full or n == 0:
        return SplitSummary(n, loss, acc, brier)
    shape = (classes, AUC_BINS)
    positives = np.asarray(values["positives"], dtype=np.int64)
    negatives = np.asarray(values["negatives"], dtype=np.int64)
    if positives.size != classes * AUC_BINS or negatives.size != positives.size:
        raise ValueError(
            f"AUC histograms of {positives.size} and {negatives.size} counts; "
            f"expected {classes} x {AUC_BINS}"
        )
    positives, negatives = positives.reshape(shape), negatives.reshape(shape)
    counted = (positives + negatives).sum(axis=1)
    if (positives < 0).any() or (negatives < 0).any() or (counted != n).any():
        raise ValueError(f"AUC histograms that do not count the split's {n} examples per class")
    gaps = np.asarray(values["gaps"], dtype=float)
    if gaps.shape != ((0,) if multi_label else (CALIBRATION_BINS,)):
        raise ValueError(f"{gaps.size} calibration bins; expected {CALIBRATION_BINS}")
    return SplitSummary(n, loss, acc, brier, gaps, positives, negatives)
