"""Evaluation tasks: the final model's scores on the test and validation splits, the
run's summary numbers (rounds to target, detections), and logging them with the model."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from federated.attacks import Backdoor
from federated.backdoor_eval import attack_success_rate, triggered_test_set
from federated.data import MedMNISTData, to_tensors
from federated.layout import use_fast_layout_
from federated.metrics import (
    CALIBRATION_BINS,
    logits_of,
    probabilities_of,
    scores_of,
    site_scores,
    site_summary,
    top_label,
)
from fedsieve.config import Params, eval_batch_size
from tasks.plots import plot_reliability
from tasks.reports import ProjectPaths, read_local_tests, write_json
from tasks.tracking import Tracker
from tasks.training import build_global_model, resolve_device, run_attack

__all__ = [
    "detection_totals",
    "log_final_results",
    "reopen_training_run",
    "rounds_to_target",
    "score_final_model",
]


def rounds_to_target(
    rounds: Sequence[Mapping[str, Any]], target_acc: float, target_loss: float | None = None
) -> int:
    """First round whose test accuracy reaches ``target_acc`` (and, when given, whose test
    loss is at most ``target_loss``); -1 if none did (the PID-MADE paper's Figure 2)."""
    for row in rounds:
        loss_ok = target_loss is None or float(row["test_loss"]) <= target_loss
        if float(row["test_acc"]) >= target_acc and loss_ok:
            return int(float(row["round"]))
    return -1


def detection_totals(rounds: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
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


@task(name="reopen-training-run", cache_policy=NO_CACHE)
def reopen_training_run(params: Params, paths: ProjectPaths) -> tuple[Tracker, dict[str, Any]]:
    """The train stage's MLflow run (from ``artifacts/model/run.json``), reopened. Tracking
    that failed during training was stated then: it is not tried (and warned about) again."""
    run_info = json.loads(paths.run_info.read_text())
    tracker = Tracker(params.tracking.experiment, known_failure=run_info.get("tracking_failed"))
    tracker.start(run_id=run_info["run_id"], run_name="", tags=run_info["tags"])
    return tracker, run_info


@task(name="score-final-model", cache_policy=NO_CACHE)
def score_final_model(
    params: Params, data: MedMNISTData, paths: ProjectPaths, run_info: dict[str, Any]
) -> tuple[dict[str, Any], torch.nn.Module]:
    """The saved model's test and validation scores with the run's summary numbers, in
    ``reports/metrics.json``; also the model (on the CPU, for logging)."""
    device = resolve_device(params.train.device)
    model = build_global_model(params, data.info)
    model.load_state_dict(torch.load(paths.model, map_location="cpu", weights_only=True))
    use_fast_layout_(model.to(device), device)  # as the train stage evaluated it
    results: dict[str, Any] = {}
    for split in ("test", "val"):
        images, targets = to_tensors(getattr(data, split), data.info, device=device)
        logits = logits_of(model, images, eval_batch_size(params))  # one pass: scores and plot
        scores = scores_of(logits, targets, multi_label=data.info.multi_label)
        results |= {f"{split}_{k}": v for k, v in scores.items()}
        if split == "test" and not data.info.multi_label:
            plot_reliability(
                *top_label(probabilities_of(logits, False), targets.cpu().numpy()),
                CALIBRATION_BINS, paths.calibration,
            )  # fmt: skip
        if split == "test" and isinstance(attack := run_attack(params), Backdoor):
            triggered = triggered_test_set(images, targets, attack)
            results["backdoor_asr"] = attack_success_rate(model, triggered, attack.target_label)
    results |= score_sites(model, params, data, paths, run_info)
    with paths.rounds.open() as handle:
        rounds = list(csv.DictReader(handle))
    results |= {
        "rounds": run_info["rounds"],
        "selected_round": run_info.get("selected_round", run_info["rounds"]),
        "rounds_to_target": rounds_to_target(
            rounds, params.eval.target_acc, params.eval.target_loss
        ),
        **detection_totals(rounds),
        **privacy_spent(params, rounds),
    }
    write_json(paths.metrics, results)
    get_run_logger().info(
        "final model: test acc %.4f auc %.4f loss %.4f (val acc %.4f auc %.4f)",
        *(results[k] for k in ("test_acc", "test_auc", "test_loss", "val_acc", "val_auc")),
    )
    return results, model.cpu().to(memory_format=torch.contiguous_format).eval()


def privacy_spent(params: Params, rounds: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Under DP: the ε every released round spent together, at ``privacy.delta``."""
    if params.privacy.mode == "off":
        return {}
    epsilon = float(rounds[-1]["privacy_epsilon"]) if rounds else 0.0
    return {"privacy_epsilon": epsilon, "privacy_delta": params.privacy.delta}


def score_sites(
    model: torch.nn.Module,
    params: Params,
    data: MedMNISTData,
    paths: ProjectPaths,
    run_info: dict[str, Any],
) -> dict[str, float]:
    """The final model on every site's local test split (with calibration), written to
    ``reports/sites.json``; the spread over sites (worst site, ...) for the metrics. Empty
    without local test splits (``partition.local_test = 0``)."""
    local_tests = read_local_tests(paths.partition)
    if local_tests is None:
        write_json(paths.sites_final, {"sites": [], "note": "partition.local_test = 0"})
        return {}
    device = next(model.parameters()).device
    images, targets = to_tensors(data.train, data.info, device=device)
    splits = {
        site: (images[index], targets[index])
        for site, held in enumerate(local_tests)
        if len(index := torch.as_tensor(held, device=device, dtype=torch.long))
    }
    rows = site_scores(
        model, splits, multi_label=data.info.multi_label, batch_size=eval_batch_size(params)
    )
    summary = site_summary(rows, params.eval.target_acc)
    selected = run_info.get("selected_round", run_info["rounds"])
    write_json(
        paths.sites_final,
        {"round": selected, "target_acc": params.eval.target_acc, **summary, "sites": rows},
    )
    return summary


@task(name="log-final-results", cache_policy=NO_CACHE)
def log_final_results(
    tracker: Tracker,
    params: Params,
    paths: ProjectPaths,
    results: dict[str, Any],
    model: torch.nn.Module,
    data: MedMNISTData,
) -> None:
    """Final metrics (``final_*``), the pre-test rates and reports, and the model, logged
    and registered as ``fedsieve-<dataset>`` (comparison cells skip the model)."""
    tracker.log_metrics({f"final_{k}": v for k, v in results.items() if v is not None})
    tracker.log_artifact(paths.metrics, "reports")
    if paths.calibration.exists():
        tracker.log_artifact(paths.calibration, "reports")
    sites = json.loads(paths.sites_final.read_text())["sites"]
    if sites:  # the final model per site: a table the MLflow UI shows, and the file
        tracker.log_table(sites, "sites.json")
        tracker.log_artifact(paths.sites_final, "reports")
    if paths.pretest.exists():
        pretest = json.loads(paths.pretest.read_text())
        keys = ("shapiro_rate", "anderson_rate", "n_tests")
        tracker.log_metrics(
            {f"pretest_{k}": pretest[k] for k in keys if pretest.get(k) is not None}
        )
        for path in (paths.pretest, paths.pretest_plot):
            tracker.log_artifact(path, "pretest")
    if params.tracking.register_model:
        # two images: torch.export fixes a batch dimension of size 1, and the registered
        # model would then take one image at a time
        example = to_tensors(data.test, data.info)[0][:2].numpy()
        registered = f"fedsieve-{params.data.dataset}"
        tracker.log_model(model, input_example=example, registered_name=registered)
