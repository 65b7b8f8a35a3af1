"""FedStNN's tables (benchmarks/papers/fedstnn.py): the function-fitting experiments and the
letters image, per trainer."""

from __future__ import annotations

import csv

from benchmarks.evidence.tables.cells import plain, plain_share
from benchmarks.evidence.tables.records import RESULTS, Row, distinct

FEDSTNN_CURVES = {
    "1d_iid": "1-D IID", "1d_noniid_110": "1-D non-IID, 110 points",
    "1d_noniid_60": "1-D non-IID, 60 points", "2d": "2-D piecewise",
}  # fmt: skip


def fedstnn_runs(name: str) -> dict[str, list[Row]]:
    """Per trainer, the finished runs of a FedStNN experiment's per-seed records."""
    with (RESULTS / f"fedstnn-{name}-seeds.csv").open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if not r["error"]]
    return {t: [r for r in rows if r["trainer"] == t] for t in distinct(rows, "trainer")}


def fedstnn_block() -> str:
    """The function-fitting experiments: fit, predicted noise, coverage, per trainer."""
    lines = [
        "| experiment | trainer | seeds | MSE / σ² | predicted σ̂ | σ̂ error | 2σ coverage "
        "| local model MSE / σ² |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, label in FEDSTNN_CURVES.items():
        for trainer, runs in sorted(fedstnn_runs(name).items()):
            values = {key: [r[key] for r in runs] for key in runs[0]}
            lines.append(
                f"| {label} | {trainer} | {len(runs)} | {plain(values['mse_over_sigma2'])} "
                f"| {plain(values['sigma_pred'])} (true {float(runs[0]['sigma_true']):g}) "
                f"| {plain(values['sigma_rel_error'], 1, 100)} % "
                f"| {plain_share(values['coverage_2sigma'])} | {plain(values['local_mse_over_sigma2'])} |"
            )
    return "\n".join(lines) + "\n"


def fedstnn_image_block() -> str:
    """The letters image: IoU of the global model and of each group's model alone."""
    lines = [
        "| trainer | seeds | global model | local models alone (F / S / U) | global − best local |",
        "|---|---|---|---|---|",
    ]
    for trainer, runs in sorted(fedstnn_runs("image").items()):
        local = " / ".join(
            plain_share(r[f"group_{i}_{letter}_iou"] for r in runs)
            for i, letter in enumerate("FSU")
        )
        lines.append(
            f"| {trainer} | {len(runs)} | {plain_share(r['global_iou'] for r in runs)} | {local} "
            f"| {plain(r['iou_margin_over_best_local'] for r in runs)} |"
        )
    return "\n".join(lines) + "\n"


def fedstnn_jumps_block() -> str:
    """The 2-D experiment's fit near the jumps (within 0.1 of an axis) and away from them,
    MSE/σ², for the global model and a client's model trained alone, per trainer."""
    lines = [
        "| trainer | seeds | global: near the jumps | global: away from them "
        "| alone: near the jumps | alone: away from them |",
        "|---|---|---|---|---|---|",
    ]
    for trainer, runs in sorted(fedstnn_runs("2d").items()):
        cells = [
            plain(r[f"{who}mse_over_sigma2_{where}"] for r in runs)
            for who in ("", "local_")
            for where in ("near_jumps", "away_from_jumps")
        ]
        lines.append(f"| {trainer} | {len(runs)} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"
