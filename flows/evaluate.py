"""Evaluate stage: the final global model on the test and validation splits; final
metrics to reports/metrics.json and MLflow, and the model logged and registered."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import torch
from prefect import flow, get_run_logger

from federated.data import to_tensors
from federated.layout import use_fast_layout_
from federated.metrics import evaluate
from fedsieve.config import Params
from fedsieve.reports import ProjectPaths, write_json
from fedsieve.tracking import Tracker
from flows.common import stage_main
from tasks.data import load_verified_dataset
from tasks.training import build_global_model, resolve_device

__all__ = ["evaluate_flow", "rounds_to_target"]


def rounds_to_target(
    rounds: list[dict[str, str]], target_acc: float, target_loss: float | None = None
) -> int:
    """First round whose test accuracy reaches ``target_acc`` (and, when given, whose test
    loss is at most ``target_loss``); -1 if none did (the PID-MADE paper's Figure 2)."""
    for row in rounds:
        loss_ok = target_loss is None or float(row["test_loss"]) <= target_loss
        if float(row["test_acc"]) >= target_acc and loss_ok:
            return int(float(row["round"]))
    return -1


def detection_totals(rounds: list[dict[str, str]]) -> dict[str, float]:
    """False positives/negatives summed over rounds, with precision and recall."""
    total = {
        key: sum(float(row.get(key) or 0) for row in rounds)
        for key in ("true_positives", "false_positives", "false_negatives")
    }
    tp, fp, fn = total["true_positives"], total["false_positives"], total["false_negatives"]
    return {
        "total_false_positives": fp,
        "total_false_negatives": fn,
        "detection_precision": tp / (tp + fp) if tp + fp else None,
        "detection_recall": tp / (tp + fn) if tp + fn else None,
    }


@flow(name="evaluate")
def evaluate_flow(params: Params, workdir: Path) -> dict[str, Any]:
    logger = get_run_logger()
    paths = ProjectPaths(workdir)
    run_info = json.loads(paths.run_info.read_text())
    # Tracking that failed during training was stated then; the model and metrics are in
    # artifacts/ and reports/, so this stage does not try (and warn) again.
    tracker = Tracker(params.tracking.experiment, known_failure=run_info.get("tracking_failed"))
    tracker.start(run_id=run_info["run_id"], run_name="", tags=run_info["tags"])
    with tracker.ended_on_failure():
        results = _evaluate_and_log(params, paths, run_info, tracker)
        tracker.end()
    if tracker.failed:  # already stated as a warning when it happened
        logger.info(
            "tracking was off (%s); %s holds the final metrics", tracker.failed, paths.metrics
        )
    return results


def _evaluate_and_log(
    params: Params, paths: ProjectPaths, run_info: dict[str, Any], tracker: Tracker
) -> dict[str, Any]:
    """The final scores to reports/metrics.json and the run; the model logged last (in the
    background: :meth:`Tracker.end` waits for it)."""
    logger = get_run_logger()
    data = load_verified_dataset(params.data, paths.root)
    device = resolve_device(params.train.device)
    model = build_global_model(params, data.info)
    model.load_state_dict(torch.load(paths.model, map_location="cpu", weights_only=True))
    use_fast_layout_(model.to(device), device)  # as the train stage evaluated it
    results: dict[str, Any] = {}
    for split_name in ("test", "val"):
        images, targets = to_tensors(getattr(data, split_name), data.info, device=device)
        scores = evaluate(
            model,
            images,
            targets,
            multi_label=data.info.multi_label,
            batch_size=params.eval.batch_size,
        )
        results.update({f"{split_name}_{k}": v for k, v in scores.items()})
    results["rounds"] = run_info["rounds"]
    results["selected_round"] = run_info.get("selected_round", run_info["rounds"])
    with paths.rounds.open() as handle:
        rounds = list(csv.DictReader(handle))
    results["rounds_to_target"] = rounds_to_target(
        rounds, params.eval.target_acc, params.eval.target_loss
    )
    results.update(detection_totals(rounds))
    write_json(paths.metrics, results)
    logger.info(
        "final model: test acc %.4f auc %.4f loss %.4f (val acc %.4f auc %.4f)",
        results["test_acc"],
        results["test_auc"],
        results["test_loss"],
        results["val_acc"],
        results["val_auc"],
    )

    tracker.log_metrics({f"final_{k}": v for k, v in results.items() if v is not None})
    tracker.log_artifact(paths.metrics, "reports")
    if paths.pretest.exists():
        pretest = json.loads(paths.pretest.read_text())
        tracker.log_metrics(
            {
                f"pretest_{k}": pretest[k]
                for k in ("shapiro_rate", "anderson_rate", "n_tests")
                if pretest.get(k) is not None
            }
        )
        for path in (paths.pretest, paths.pretest_plot):
            tracker.log_artifact(path, "pretest")
    # two images: torch.export fixes a batch dimension of size 1, and the registered model
    # would then take one image at a time
    example = images[:2].cpu().numpy()
    registered = f"fedsieve-{params.data.dataset}" if params.tracking.register_model else None
    if registered is not None:  # (comparison cells skip the model: the parent compares metrics)
        # the default layout: torch.export's archive warns about channels-last weights
        logged = model.cpu().to(memory_format=torch.contiguous_format).eval()
        tracker.log_model(logged, input_example=example, registered_name=registered)
    return results


main = stage_main("evaluate")

if __name__ == "__main__":
    main()
