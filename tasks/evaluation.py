"""Evaluation tasks: the final model's scores on the test and validation splits, the
run's summary numbers (rounds to target, detections), and logging them with the model.

Under ``eval.where: sites`` the hub holds no images: the final model's test and
validation scores are the sites' pooled scores of the selected round (the per-round
table's ``test_*``/``val_*`` row; the last round, and every round under ``select:
best_val``, is scored fully), its per-site table what the sites reported, and no
reliability diagram is drawn (it needs per-example confidences)."""

from __future__ import annotations

import csv
import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from config.assembly import build_global_model, dataset_info_of, resolve_device
from config.errors import ServiceError
from config.params import Params, eval_batch_size
from federated.attacks import Backdoor
from federated.backdoor_eval import attack_success_rate, triggered_test_set
from federated.data import MedMNISTData, to_tensors
from federated.gate import GateDecision
from federated.inference import save_classifier
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
from federated.server import Federation, ServerState
from tasks.plots import plot_reliability
from tasks.registration import record_decision
from tasks.reports import ProjectPaths, read_local_tests, write_json
from tasks.tracking import Tracker
from tasks.training import run_attack

__all__ = [
    "detection_totals",
    "final_results",
    "final_scores",
    "log_final_results",
    "reopen_training_run",
    "rounds_to_target",
    "score_final_model",
    "trained_results",
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
    """The train stage's MLflow run (from ``artifacts/model/tracking.json``), reopened, and
    what the stage wrote of the run (``run.json``). Tracking that failed during training
    was stated then: it is not tried (and warned about) again."""
    run_info = json.loads(paths.run_info.read_text()) | json.loads(paths.tracking_info.read_text())
    tracker = Tracker(params.tracking.experiment, known_failure=run_info.get("tracking_failed"))
    tracker.start(run_id=run_info["run_id"], run_name="", tags=run_info["tags"])
    return tracker, run_info


@task(name="score-final-model", cache_policy=NO_CACHE)
def score_final_model(
    params: Params, data: MedMNISTData | None, paths: ProjectPaths, run_info: dict[str, Any]
) -> tuple[dict[str, Any], torch.nn.Module]:
    """The saved model's :func:`final_results`, in ``reports/metrics.json``; also the
    model (on the CPU, for logging). ``data``: None under ``eval.where: sites``."""
    device = resolve_device(params.train.device)
    model = build_global_model(params, dataset_info_of(params.data))
    model.load_state_dict(torch.load(paths.model, map_location="cpu", weights_only=True))
    use_fast_layout_(model.to(device), device)  # as the train stage evaluated it
    with paths.rounds.open() as handle:
        rounds = list(csv.DictReader(handle))
    # the sites scored it on their own splits
    if params.federation.runtime == "flower" or params.eval.where == "sites":
        selected = run_info.get("selected_round", run_info["rounds"])
        results = final_results(
            model, params, data, paths, ReportedSites(sites_scored_at(paths.sites, selected)),
            rounds, run_info,
        )  # fmt: skip
    else:
        results = final_results(
            model, params, data, paths, read_local_tests(paths.partition), rounds, run_info
        )
    line = "final model: test acc {:.4f} auc {:.4f} loss {:.4f}".format(
        *(results.get(k, math.nan) for k in ("test_acc", "test_auc", "test_loss"))
    )
    if not math.isnan(results.get("val_acc", math.nan)):  # a validation split was scored
        line += f" (val acc {results['val_acc']:.4f} auc {results.get('val_auc', math.nan):.4f})"
    get_run_logger().info(line)
    return results, model.cpu().to(memory_format=torch.contiguous_format).eval()


def final_results(
    model: torch.nn.Module,
    params: Params,
    data: MedMNISTData | None,
    paths: ProjectPaths,
    local_tests: list[np.ndarray] | ReportedSites | None,
    rounds: Sequence[Mapping[str, Any]],
    run_info: dict[str, Any],
    *,
    figures: bool = True,
) -> dict[str, Any]:
    """:func:`final_scores`, written to ``reports/metrics.json`` and the final per-site
    table to ``reports/sites.json``; the calibration figure when ``figures``. The
    pipeline's evaluate stage and a comparison cell score their final models here alike.
    ``local_tests``: each site's split to score here, or the scores real sites reported
    (:class:`ReportedSites`)."""
    calibration = paths.calibration if figures else None
    if calibration is not None:  # an earlier run's diagram is never logged as this run's
        calibration.unlink(missing_ok=True)  # (none is drawn from the sites' aggregates)
    results, sites = final_scores(
        model, params, data, local_tests, rounds, run_info, calibration=calibration
    )
    selected = run_info.get("selected_round", run_info["rounds"])
    summary = site_summary(sites, params.eval.target_acc) if sites else {}
    write_json(
        paths.sites_final,
        {"round": selected, "target_acc": params.eval.target_acc, **summary, "sites": sites}
        if local_tests is not None and (not isinstance(local_tests, ReportedSites) or sites)
        else {"sites": [], "note": _no_sites_note(params)},
    )
    write_json(paths.metrics, results)
    return results


@dataclass(frozen=True)
class ReportedSites:
    """Per-site scores the sites computed on their own splits (a federation of real
    sites): taken as they are, nothing is scored here."""

    rows: list[dict[str, float]]


def sites_scored_at(path: Path, round_number: int) -> list[dict[str, float]]:
    """The per-site rows of ``reports/sites.csv`` for one round (the sites' own scores of
    that round's model, in a federation of real sites)."""
    if not path.exists():
        return []
    with path.open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("round") == str(round_number)]
    return [
        {key: _cell(key, value) for key, value in row.items() if key != "round"} for row in rows
    ]


def _cell(key: str, value: str | None) -> float:
    if key in ("site", "n"):
        return int(float(value or 0))
    return float(value) if value not in ("", None) else math.nan


def _no_sites_note(params: Params) -> str:
    if params.federation.runtime == "flower" or params.eval.where == "sites":
        return "no site scored the selected round's model (eval.every; select best_val)"
    return "partition.local_test = 0"


def final_scores(
    model: torch.nn.Module,
    params: Params,
    data: MedMNISTData | None,
    local_tests: list[np.ndarray] | ReportedSites | None,
    rounds: Sequence[Mapping[str, Any]],
    run_info: dict[str, Any],
    *,
    calibration: Path | None = None,
) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """The final model's test and validation scores, backdoor success and spread over
    sites, with the run's summary numbers (``rounds``: the per-round table); and the
    per-site rows. Writes nothing but the reliability diagram at ``calibration``."""
    selected = run_info.get("selected_round", run_info["rounds"])
    if params.eval.where == "sites":
        results = pooled_split_scores(rounds, selected)
    else:
        results = split_scores(model, params, data, calibration)
    if isinstance(local_tests, ReportedSites):
        sites = local_tests.rows
    else:
        sites = score_sites(model, params, data, local_tests)
    if sites:
        results |= site_summary(sites, params.eval.target_acc)
    results |= {
        "rounds": run_info["rounds"],
        "selected_round": selected,
        "rounds_to_target": rounds_to_target(
            rounds, params.eval.target_acc, params.eval.target_loss
        ),
        **detection_totals(rounds),
        **privacy_spent(params, rounds),
    }
    return results, sites


def trained_results(
    federation: Federation,
    state: ServerState,
    params: Params,
    data: MedMNISTData,
    local_tests: list[np.ndarray] | None = None,
) -> dict[str, Any]:
    """:func:`final_scores` of a federation's trained model (the state's selected one),
    in this process: what a benchmark's run ends with."""
    run_info = {"rounds": state.round, "selected_round": state.selected_round}
    model = federation.selected_model(state)
    return final_scores(model, params, data, local_tests, state.history, run_info)[0]


def split_scores(
    model: torch.nn.Module, params: Params, data: MedMNISTData, calibration: Path | None
) -> dict[str, Any]:
    """Test and validation scores (one pass each), the backdoor's success rate on the
    triggered test images, and the reliability diagram at ``calibration`` when given."""
    device = next(model.parameters()).device
    results: dict[str, Any] = {}
    for split in ("test", "val"):
        images, targets = to_tensors(getattr(data, split), data.info, device=device)
        logits = logits_of(model, images, eval_batch_size(params))  # one pass: scores and plot
        scores = scores_of(logits, targets, multi_label=data.info.multi_label)
        results |= {f"{split}_{k}": v for k, v in scores.items()}
        if split == "test" and calibration is not None and not data.info.multi_label:
            plot_reliability(
                *top_label(probabilities_of(logits, False), targets.cpu().numpy()),
                CALIBRATION_BINS, calibration,
            )  # fmt: skip
        if split == "test" and isinstance(attack := run_attack(params), Backdoor):
            triggered = triggered_test_set(images, targets, attack)
            results["backdoor_asr"] = attack_success_rate(model, triggered, attack.target_label)
    return results


def pooled_split_scores(rounds: Sequence[Mapping[str, Any]], selected: int) -> dict[str, float]:
    """The sites' pooled test and validation scores of round ``selected`` (its row of the
    per-round table, as written or read back from ``reports/rounds.csv``)."""
    row = next((r for r in rounds if int(float(r["round"])) == selected), None)
    if row is None:
        raise ValueError(f"the per-round table has no round {selected} (the selected round)")
    return {
        key: float(value)
        for key, value in row.items()
        if key.startswith(("test_", "val_")) and value not in ("", None)
    }


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
    local_tests: list[np.ndarray] | None,
) -> list[dict[str, float]]:
    """The final model on every site's local test split (with calibration), one row per
    site; none without local test splits (``partition.local_test = 0``)."""
    if local_tests is None:
        return []
    device = next(model.parameters()).device
    images, targets = to_tensors(data.train, data.info, device=device)
    splits = {
        site: (images[index], targets[index])
        for site, held in enumerate(local_tests)
        if len(index := torch.as_tensor(held, device=device, dtype=torch.long))
    }
    return site_scores(
        model, splits, multi_label=data.info.multi_label, batch_size=eval_batch_size(params)
    )


@task(name="log-final-results", cache_policy=NO_CACHE)
def log_final_results(
    tracker: Tracker,
    params: Params,
    paths: ProjectPaths,
    results: dict[str, Any],
    model: torch.nn.Module,
    gate: GateDecision,
) -> str | None:
    """Final metrics (``final_*``), the pre-test rates and reports, the registration
    gate's decision, and the model (image files in, probabilities out), logged, and
    registered as ``fedsieve-<dataset>`` when the gate passed it (comparison cells skip
    the model): the registered version, or None. A run is green only with all of it:
    should tracking fail here (the store away while the model is logged), the whole
    record is tried once more, and if the store still does not answer the stage fails in
    one line saying what to run (its outputs are kept)."""
    version: list[str | None] = [None]

    def record() -> None:
        _log_final_reports(tracker, paths, results)
        version[0] = _log_model(tracker, params, model, gate)

    record()
    if not tracker.retried("the final results and the model", record):
        raise ServiceError(
            f"MLflow tracking failed while logging the final results and the model "
            f"({tracker.failed}); reports/ and artifacts/model are kept: run `fedsieve "
            "evaluate` (or `fedsieve run --resume`) once the tracking server answers, and "
            "they are logged, and the model registered, in the same MLflow run"
        )
    return version[0]


def _log_final_reports(tracker: Tracker, paths: ProjectPaths, results: dict[str, Any]) -> None:
    """The final metrics, the metric, calibration and per-site reports, and the pre-test's
    rates and reports where it ran."""
    tracker.log_metrics({f"final_{k}": v for k, v in results.items() if v is not None})
    tracker.log_artifact(paths.metrics, "reports")
    if paths.calibration.exists():
        tracker.log_artifact(paths.calibration, "reports")
    sites = json.loads(paths.sites_final.read_text())["sites"]
    if sites:  # the final model per site: a table the MLflow UI shows, and the file
        tracker.log_table(sites, "sites.json")
        tracker.log_artifact(paths.sites_final, "reports")
    pretest = json.loads(paths.pretest.read_text()) if paths.pretest.exists() else {}
    if pretest and pretest.get("ran", True):  # a stage at sites that could not run: no rates
        keys = ("shapiro_rate", "anderson_rate", "n_tests")
        tracker.log_metrics(
            {f"pretest_{k}": pretest[k] for k in keys if pretest.get(k) is not None}
        )
        for path in (paths.pretest, paths.pretest_plot):
            tracker.log_artifact(path, "pretest")


def _log_model(
    tracker: Tracker, params: Params, model: torch.nn.Module, gate: GateDecision
) -> str | None:
    """The gate's decision and the model, registered when the gate passed it: the
    registered version, or None (comparison cells log no model)."""
    if not params.tracking.register_model:
        return None
    record_decision(tracker, "registration", gate)
    info = dataset_info_of(params.data)
    registered = f"fedsieve-{params.data.dataset}" if gate.passed else None
    with tempfile.TemporaryDirectory(prefix="fedsieve-classifier-") as folder:
        classifier = save_classifier(Path(folder), model.cpu(), params.model.name, info)
        return tracker.log_model(classifier, info, registered_name=registered)
