"""AdrenalMNIST3D-64 (issue 80): the 3-D models' accuracy record
(``python -m benchmarks.papers.adrenal3d``) beside MedMNIST v2's published 3-D baselines,
and the robustness row (``python -m benchmarks.robustness.matrix --dataset adrenalmnist3d
--regime cnn3d``)."""

from __future__ import annotations

from benchmarks.evidence.tables.cells import shown_share, table
from benchmarks.evidence.tables.records import HEADLINE, distinct, load, results_json, with_halts
from benchmarks.evidence.tables.robustness_matrix import stopped_count, worst_cell
from benchmarks.evidence.tables.robustness_regimes import at_majority

ACCURACY_RECORD = "adrenalmnist3d-cpu"
ROBUSTNESS_RECORD = "adrenalmnist3d-cnn3d"
# Cited, not measured here: Yang et al. 2023, "MedMNIST v2 - A large-scale lightweight
# benchmark for 2D and 3D biomedical image classification", Scientific Data 10:41
# (https://doi.org/10.1038/s41597-022-01721-8), Table 4 (MedMNIST3D), the AdrenalMNIST3D
# columns: centralised training on the 28³ volumes; (method, AUC, ACC) as printed there.
# Transcribed without a copy of the paper at hand: check against its Table 4 when one is.
MEDMNIST_V2_TABLE4 = (
    ("ResNet-18 + 2.5D", 0.718, 0.772),
    ("ResNet-18 + 3D", 0.827, 0.721),
    ("ResNet-18 + ACS", 0.839, 0.754),
    ("ResNet-50 + 2.5D", 0.732, 0.763),
    ("ResNet-50 + 3D", 0.828, 0.745),
    ("ResNet-50 + ACS", 0.828, 0.758),
    ("auto-sklearn", 0.828, 0.802),
    ("AutoKeras", 0.804, 0.705),
)


def accuracy_block() -> str:
    """Ours (the small 3-D CNN per setup; ResNet-18 3D timed, not trained) above the
    paper's rows, each row naming where its numbers come from."""
    record = results_json(ACCURACY_RECORD)
    rows = []
    for run in record["runs"]:
        seconds = run["round_seconds"]
        rows.append((
            f"small_cnn3d, {run['setup']}", run["clients"], f"64³, {run['rounds']}",
            f"{run['test_auc']:.3f}", f"{run['test_acc']:.3f}",
            f"{sum(seconds) / len(seconds):.0f} s", f"ours, seed {run['seed']}",
        ))  # fmt: skip
    for cost in record["timing"]:
        if cost["model"] == "small_cnn3d":
            continue
        hours = cost["round_seconds_estimate"] / 3600
        rows.append((
            f"{cost['model']}", "–", "64³, none run", "–", "–",
            f"≈ {hours:.1f} h (estimated from one timed step)", "ours, not trained",
        ))  # fmt: skip
    rows += [
        (method, 1, "28³, to convergence", f"{auc:.3f}", f"{acc:.3f}", "–", "cited: Table 4")
        for method, auc, acc in MEDMNIST_V2_TABLE4
    ]
    header = ("model", "clients", "volumes, rounds", "test AUC", "test ACC",
              "time a round", "source")  # fmt: skip
    return table(header, rows)


def timing_block() -> str:
    """Each 3-D model's measured seconds per volume (one thread) and the round they imply."""
    record = results_json(ACCURACY_RECORD)
    rows = [
        (
            cost["model"], f"{cost['parameters'] / 1e6:.2f}M", cost["batch"],
            f"{cost['train_seconds_per_volume']:.2f} s", f"{cost['score_seconds_per_volume']:.2f} s",
            f"{cost['round_seconds_estimate'] / 60:.0f} min",
        )
        for cost in record["timing"]
    ]  # fmt: skip
    header = ("model", "parameters", "volumes timed", "train step a volume",
              "scoring a volume", "a round at those rates")  # fmt: skip
    return table(header, rows)


def robustness_block() -> str:
    """Per method: test AUC under each attack and the worst case per seed (mean [95 %
    logit-scale interval] [seeds]), and the runs that ended predicting the majority class."""
    rows = with_halts(load(ROBUSTNESS_RECORD))
    metric = HEADLINE["adrenalmnist3d"]
    attacks = distinct(rows, "attack")
    fraction = rows[0]["fraction"]
    out = []
    for method in distinct(rows):
        mine = [r for r in rows if r["method"] == method]
        cells = [
            shown_share(r[metric] for r in mine if r["attack"] == attack)
            + stopped_count(r for r in mine if r["attack"] == attack)
            for attack in attacks
        ]
        stuck = sum(at_majority(r) for r in mine if not r.get("halted"))
        out.append((
            method, *cells, worst_cell(rows, method, fraction, metric), f"{stuck} of {len(mine)}",
        ))  # fmt: skip
    header = ("method", *(f"{a} at {fraction:g}" for a in attacks),
              "worst case per seed", "runs at the majority class")  # fmt: skip
    return table(header, out)
