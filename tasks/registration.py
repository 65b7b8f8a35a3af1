"""The gate between a trained model and the hospitals that use it (:mod:`federated.gate`):
a model is registered only when its held-out scores pass, and becomes ``@champion`` only
when it is no worse than the champion scored on the same held-out images. Every decision
and the scores it read are recorded on the run (tags ``gate.registration`` and
``gate.champion`` with their reasons, metrics ``gate_*``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from config.params import Params
from federated.data import DatasetInfo, MedMNISTData
from federated.gate import GateDecision, champion_decision, majority_share, registration_decision
from federated.inference import ImageClassifier
from federated.metrics import accuracy_auc
from flowerapp.hub import site_task
from flowerapp.plan import plan_digest
from tasks.champion import CHAMPION, champion_version, scored_at_sites
from tasks.model_card import build_card, card_markdown
from tasks.reports import ProjectPaths
from tasks.tracking import Tracker, fluent_tracking_at

__all__ = ["crown_champion", "publish_card", "record_decision", "registration_gate"]

OLDER_KIND = "it does not take image files (registered by an older fedsieve)"


def registration_gate(
    results: dict[str, Any], data: MedMNISTData | None, paths: ProjectPaths
) -> GateDecision:
    """May the final model (its ``results``) be registered? It must beat the majority class
    of the held-out split: the hub's (``data``), or at real sites the sites' pooled split,
    whose counts per class each site reported with its data's lineage."""
    if data is not None:
        return registration_decision(results, majority_share(data.test.targets))
    majority = None
    if paths.site_data.exists():
        majority = json.loads(paths.site_data.read_text()).get("test_majority_share")
    return registration_decision(results, majority)


def record_decision(tracker: Tracker, stage: str, decision: GateDecision) -> None:
    """The decision on the run: a tag (passed or refused, and why) and the scores read."""
    tracker.set_tags(
        {f"gate.{stage}": "passed" if decision.passed else "refused",
         f"gate.{stage}.reason": decision.reason}
    )  # fmt: skip
    finite = {f"gate_{k}": v for k, v in decision.scores.items() if np.isfinite(v)}
    tracker.log_metrics(finite)


@task(name="crown-champion", cache_policy=NO_CACHE)
def crown_champion(
    tracker: Tracker,
    params: Params,
    version: str,
    model: torch.nn.Module,
    data: MedMNISTData | None,
    info: DatasetInfo,
    paths: ProjectPaths,
) -> GateDecision:
    """Make registered ``version`` the champion when it is no worse than the current one
    on the same held-out images: the hub's (both scored now, the same way), or at real
    sites (``data`` None) the sites' own, where both were scored in the same federated
    evaluation at the run's end (:func:`champion_to_score`). Keep the champion otherwise,
    and say why."""
    import mlflow.pyfunc
    from mlflow import MlflowClient

    name = f"fedsieve-{params.data.dataset}"
    client = MlflowClient(tracker.uri)
    champion = champion_version(client, name)
    if data is None:
        decision = champion_decision(*scored_at_sites(paths, champion, tracker.run_id))
    else:
        candidate = ImageClassifier(model.cpu(), params.model.name, info)
        candidate_auc = _test_auc(candidate, data)
        champion_auc, note = None, ""
        if champion is not None:
            with fluent_tracking_at(tracker.uri):
                loaded = mlflow.pyfunc.load_model(f"models:/{name}@{CHAMPION}")
            champion_auc, note = _champion_auc(loaded, data, info)
        decision = champion_decision(candidate_auc, champion_auc, note)
        if note == OLDER_KIND:  # of no use to a hospital now: this model takes its place
            decision = GateDecision(True, f"the champion is replaced: {note}", decision.scores)
    if decision.passed:
        client.set_registered_model_alias(name, CHAMPION, version)
    record_decision(tracker, "champion", decision)
    get_run_logger().info(
        "%s version %s %s @%s: %s", name, version,
        "is now" if decision.passed else "is not", CHAMPION, decision.reason,
    )  # fmt: skip
    return decision


def _champion_auc(loaded: Any, data: MedMNISTData, info: DatasetInfo) -> tuple[float | None, str]:
    """The champion's test AUC on ``data``, or None and why it cannot be scored here."""
    try:
        classifier = loaded.unwrap_python_model().classifier
    except Exception:  # a model registered before models took image files
        return None, OLDER_KIND
    theirs = (classifier.info.labels, classifier.info.n_channels, classifier.info.size)
    if theirs != (info.labels, info.n_channels, info.size):
        return None, "its schema (classes, channels, size) differs from this model's"
    return _test_auc(classifier, data), ""


def _test_auc(classifier: ImageClassifier, data: MedMNISTData) -> float:
    prediction = classifier.predict_images(data.test.images)
    _, auc = accuracy_auc(prediction.probabilities, data.test.targets, data.info.multi_label)
    return float(auc)


@task(name="publish-model-card", cache_policy=NO_CACHE)
def publish_card(
    tracker: Tracker,
    params: Params,
    paths: ProjectPaths,
    results: dict[str, Any],
    run_info: dict[str, Any],
    version: str,
    gates: dict[str, GateDecision],
    info: DatasetInfo,
) -> dict[str, Any]:
    """The registered version's card (:mod:`tasks.model_card`): ``model_card/card.json``
    and ``card.md`` on the run, and the markdown as the version's description."""
    from mlflow import MlflowClient

    name = f"fedsieve-{params.data.dataset}"
    run = {
        "name": name, "version": version, "run_id": tracker.run_id, "tags": run_info["tags"],
        "plan_sha256": plan_digest(site_task(params, info)),
        "gate": {stage: f"{'passed' if d.passed else 'refused'}: {d.reason}"
                 for stage, d in gates.items()},
    }  # fmt: skip
    card = build_card(params, paths, results, run, info)
    markdown = card_markdown(card)
    with tempfile.TemporaryDirectory(prefix="fedsieve-card-") as folder:
        (Path(folder) / "card.json").write_text(json.dumps(card, indent=2) + "\n")
        (Path(folder) / "card.md").write_text(markdown)
        for file in ("card.json", "card.md"):
            tracker.log_artifact(Path(folder) / file, "model_card")
    MlflowClient(tracker.uri).update_model_version(name, version, description=markdown)
    return card
