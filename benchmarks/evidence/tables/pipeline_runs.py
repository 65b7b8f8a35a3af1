"""The pipeline's own runs: the committed DVC baseline (``make run``), central DP-FedAvg at
several noise multipliers (benchmarks/robustness/privacy.py) and the ResNet-18 federation."""

from __future__ import annotations

import csv
import json

from benchmarks.evidence.tables.cells import shown, shown_share, table
from benchmarks.evidence.tables.records import REPO, RESULTS, distinct, results_json


def default_pipeline_block() -> str:
    """The committed DVC baseline (``make run``: reports/metrics.json), as a table."""
    metrics = json.loads((REPO / "reports" / "metrics.json").read_text())
    lines = ["| split | AUC | ACC | ECE (15 bins) | Brier |", "|---|---|---|---|---|"]
    for split in ("test", "val"):
        values = " | ".join(
            f"{metrics[f'{split}_{k}']:.3f}" for k in ("auc", "acc", "ece", "brier")
        )
        lines.append(f"| {'validation' if split == 'val' else split} | {values} |")
    lines += [
        "",
        "| per site (its own held-out split) | figure |",
        "|---|---|",
        f"| worst ACC | {metrics['site_acc_worst']:.3f} (site {metrics['site_worst']}) |",
        f"| best ACC | {metrics['site_acc_best']:.3f} (site {metrics['site_best']}) |",
        f"| ACC std over sites | {metrics['site_acc_std']:.3f} |",
        f"| sites at the 0.8 target | {metrics['sites_at_target']:.0%} |",
        f"| rounds to the target (pooled test ACC) | {metrics['rounds_to_target']} |",
    ]
    return "\n".join(lines) + "\n"


def privacy_block() -> str:
    """Central DP-FedAvg at several noise multipliers, per model (benchmarks/robustness/privacy.py):
    ε, test scores and the worst site's, mean [95 % logit-scale t-interval]
    [seeds], and the sites' spread, mean ± t-interval [seeds]."""
    cells = results_json("privacy-breastmnist")["cells"]
    lines = [
        "| model | noise multiplier | ε after 20 rounds | test ACC | test AUC "
        "| worst-site ACC | site ACC std |",
        "|---|---|---|---|---|---|---|",
    ]
    models = {"small_cnn": "small CNN", "logreg": "logistic"}
    settings = distinct(({"key": (c["model"], c["noise_multiplier"])} for c in cells), "key")
    for model, noise in settings:
        runs = [
            c["metrics"] for c in cells if (c["model"], c["noise_multiplier"]) == (model, noise)
        ]
        epsilon = runs[0]["privacy_epsilon"]
        scores = [
            shown_share((r[k] for r in runs), 3) for k in ("test_acc", "test_auc", "site_acc_worst")
        ] + [shown((r["site_acc_std"] for r in runs), 3)]
        lines.append(
            f"| {models.get(model, model)} | {'off' if noise is None else f'{noise:g}'} "
            f"| {'–' if epsilon is None else f'{epsilon:.4g}'} | {' | '.join(scores)} |"
        )
    return "\n".join(lines) + "\n"


def resnet18_block() -> str:
    """The ResNet-18 federation (``make bench-resnet18``): the selected round, the last
    round and the swing of test accuracy, from its JSON and per-round CSV."""
    r = results_json("resnet18-breastmnist-cpu")
    m = r["metrics"]
    with (RESULTS / "resnet18-breastmnist-rounds.csv").open() as handle:
        rounds = [{k: float(v) for k, v in row.items() if v} for row in csv.DictReader(handle)]
    last, late = rounds[-1], [row["test_acc"] for row in rounds if row["round"] >= 10]
    return table(("measure", "figure"), [
        (f"selected round (best validation AUC of {int(m['rounds'])})", f"**{int(m['selected_round'])}**"),
        ("its test ACC / AUC", f"**{m['test_acc']:.3f} / {m['test_auc']:.3f}**"),
        ("its validation ACC / AUC", f"{m['val_acc']:.3f} / {m['val_auc']:.3f}"),
        (f"the last round's test ACC / AUC (round {int(last['round'])})", f"{last['test_acc']:.3f} / {last['test_auc']:.3f}"),
        ("test ACC from round 10 on, lowest – highest", f"{min(late):.3f} – {max(late):.3f}"),
        ("wall time, 2-core CPU", f"{r['wall_s'] / 60:.0f} min ({r['note']})"),
    ])  # fmt: skip
