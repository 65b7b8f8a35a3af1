import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from federated.data import load_digits, load_medmnist, to_tensors
from federated.metrics import (
    AUC_BINS,
    CALIBRATION_BINS,
    ModelDiverged,
    SplitSummary,
    accuracy_auc,
    auc_bin_bound,
    binary_auc,
    calibration,
    evaluate,
    histogram_auc,
    pooled_scores,
    score_histograms,
    scores_of,
    summarise,
    summary_from,
    summary_values,
)


def test_binary_auc_extremes_and_a_single_class():
    assert binary_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert binary_auc(np.array([0, 0, 1, 1]), np.array([0.9, 0.8, 0.2, 0.1])) == 0.0
    assert binary_auc(np.array([0, 1]), np.array([0.5, 0.5])) == 0.5
    assert math.isnan(binary_auc(np.array([1, 1, 1]), np.array([0.1, 0.2, 0.3])))


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("multi_label", [False, True])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_outputs_that_are_not_finite_are_named_as_divergence(bad, multi_label, full):
    logits = torch.zeros(6, 3)
    logits[[1, 4], 2] = bad
    targets = torch.zeros(6, 3) if multi_label else torch.zeros(6, dtype=torch.long)

    with pytest.raises(
        ModelDiverged, match=r"^the model's outputs are NaN or infinite for 2 of 6 "
    ):
        scores_of(logits, targets, multi_label=multi_label, full=full)


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


# Federated evaluation: sites' aggregates pooled at the hub (eval.where: sites)


def test_score_histograms_pool_into_the_auc_of_the_pooled_scores_by_hand():
    # two sites of a binary task, p(class 1) in 4 bins of asinh(log-odds) over
    # [asinh(-105), asinh(20)] = [-5.347, 3.690] (edges -3.088, -0.829, 1.430):
    # p 1e-20 (log-odds -46.05, asinh -4.52) in bin 0, 1e-3 (-6.91, -2.63) in bin 1,
    # 0.3 (-0.85, -0.77) in bin 2, 0.9 and 0.95 (2.20 and 2.94: 1.53 and 1.80) in bin 3
    # site A: 1e-20 (y 0), 1e-3 (y 1), 0.3 (y 0), 0.9 (y 1); site B: 1e-20 (y 0), 0.95 (y 1)
    # class 1 pooled: positives [0, 1, 0, 2], negatives [2, 0, 1, 0]; of the 9 pairs the
    # positive ranks higher in 8 (1e-3 is below 0.3), as in the pooled scores: AUC 8/9
    a = np.array([[1, 1e-20], [0.999, 1e-3], [0.7, 0.3], [0.1, 0.9]]), np.array([0, 1, 0, 1])
    b = np.array([[1, 1e-20], [0.05, 0.95]]), np.array([0, 1])

    (pos_a, neg_a), (pos_b, neg_b) = (score_histograms(*site, False, bins=4) for site in (a, b))
    positives, negatives = pos_a + pos_b, neg_a + neg_b

    assert positives[1].tolist() == [0, 1, 0, 2] and negatives[1].tolist() == [2, 0, 1, 0]
    assert positives[0].sum() == 3  # class 0's positives: the three y = 0
    assert histogram_auc(positives[1], negatives[1]) == pytest.approx(8 / 9)
    assert binary_auc(np.r_[a[1], b[1]], np.r_[a[0][:, 1], b[0][:, 1]]) == pytest.approx(8 / 9)


def test_a_positive_and_a_negative_in_one_bin_count_one_half():
    # positives in bins 1 and 2, negatives in bins 0 and 1: of 4 pairs, 3 won and 1 tied
    assert histogram_auc(np.array([0, 1, 1]), np.array([1, 1, 0])) == pytest.approx(3.5 / 4)
    assert auc_bin_bound(np.array([[0, 1, 1]]), np.array([[1, 1, 0]]), True) == 0.5 * 1 / 4
    assert math.isnan(histogram_auc(np.array([0, 0, 0]), np.array([1, 1, 0])))


def test_loss_acc_brier_are_weighted_by_the_sites_counts_and_ece_bins_are_summed():
    def histograms(bin_of_positive: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        positives, negatives = np.zeros((2, AUC_BINS), int), np.zeros((2, AUC_BINS), int)
        positives[1, bin_of_positive] = negatives[0, 0] = count
        return positives, negatives

    gaps_a, gaps_b = np.zeros(CALIBRATION_BINS), np.zeros(CALIBRATION_BINS)
    gaps_a[:2], gaps_b[:2] = [0.1, -0.3], [-0.2, 0.1]
    a = SplitSummary(2, 1.0, 0.5, 0.2, gaps_a, *histograms(900, 2))
    b = SplitSummary(6, 0.5, 1.0, 0.1, gaps_b, *histograms(100, 6))
    empty = SplitSummary(0, math.nan, math.nan)  # a site without the split is left out

    pooled = pooled_scores([a, empty, b], multi_label=False)

    assert list(pooled) == ["loss", "acc", "auc", "ece", "brier"]  # scores_of's names
    assert pooled["loss"] == pytest.approx((2 * 1.0 + 6 * 0.5) / 8)
    assert pooled["acc"] == pytest.approx((2 * 0.5 + 6 * 1.0) / 8)
    assert pooled["brier"] == pytest.approx((2 * 0.2 + 6 * 0.1) / 8)
    assert pooled["ece"] == pytest.approx((0.1 + 0.2) / 8)  # |0.1 - 0.2| + |-0.3 + 0.1|
    # class 1's 8 scores (all positives) and class 0's (all negatives): no AUC, as for
    # a pooled split holding one class
    assert math.isnan(pooled["auc"])
    assert pooled_scores([a, b], multi_label=False, full=False) == {
        "loss": pooled["loss"],
        "acc": pooled["acc"],
    }
    assert all(math.isnan(v) for v in pooled_scores([empty], multi_label=False).values())


def _trained_logits(data, epochs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logistic regression trained full-batch on ``data``'s training split; its test logits."""
    images, targets = to_tensors(data.train, data.info)
    test_images, test_targets = to_tensors(data.test, data.info)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(images[0].numel(), 2 if data.info.n_classes == 2 else data.info.n_classes),
    )
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(epochs):
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(model(images), targets).backward()
        optimiser.step()
    with torch.no_grad():
        return model(test_images), test_targets


@pytest.mark.parametrize("dataset", ["digits", "breastmnist", "retinamnist"])
@pytest.mark.parametrize("epochs", [1, 30])
def test_pooled_site_scores_equal_the_scores_of_the_pooled_predictions(
    medmnist_root, dataset, epochs
):
    """Four sites of uneven size share a real test split; what the hub pools from their
    aggregates is the scores of all their predictions together (AUC within 1e-3)."""
    data = load_digits() if dataset == "digits" else load_medmnist(dataset, medmnist_root)
    logits, targets = _trained_logits(data, epochs)
    n = len(targets)
    order = np.random.default_rng(0).permutation(n)
    sites = np.split(order, [n // 10, n // 3, 2 * n // 3])

    summaries = [summarise(logits[s], targets[s], multi_label=False)[0] for s in sites]
    pooled = pooled_scores(summaries, multi_label=False)
    together = scores_of(logits, targets, multi_label=False)

    assert pooled["auc"] == pytest.approx(together["auc"], abs=1e-3)
    for name in ("loss", "acc", "ece", "brier"):
        # float32 means per site, then weighted: equal to float32 rounding
        assert pooled[name] == pytest.approx(together[name], rel=1e-6, abs=1e-6), name


def test_a_site_summary_holds_no_per_example_value():
    logits = torch.randn(50, 3, generator=torch.Generator().manual_seed(0))
    targets = torch.arange(50) % 3

    summary, own = summarise(logits, targets, multi_label=False)

    assert own == scores_of(logits, targets, multi_label=False)  # the site's row
    assert summary.positives.shape == summary.negatives.shape == (3, AUC_BINS)
    assert (summary.positives + summary.negatives).sum(axis=1).tolist() == [50, 50, 50]
    assert summary.gaps.shape == (CALIBRATION_BINS,)


def test_a_summary_that_does_not_add_up_is_refused_in_one_line():
    logits = torch.randn(40, 3, generator=torch.Generator().manual_seed(1))
    summary, _ = summarise(logits, torch.arange(40) % 3, multi_label=False)
    values = summary_values(summary)

    back = summary_from(values, classes=3, multi_label=False, full=True)

    assert (back.positives == summary.positives).all() and back.n == 40
    assert (back.gaps == summary.gaps).all() and back.brier == summary.brier
    inflated = values | {"n": 400}  # a site claiming ten times its split
    with pytest.raises(ValueError, match="do not count the split's 400 examples"):
        summary_from(inflated, classes=3, multi_label=False, full=True)
    with pytest.raises(ValueError, match="expected 2 x"):
        summary_from(values, classes=2, multi_label=False, full=True)
    with pytest.raises(ValueError, match="calibration bins"):
        summary_from(values | {"gaps": [0.0]}, classes=3, multi_label=False, full=True)
