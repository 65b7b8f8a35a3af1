"""The champion: the registered version hospitals load (``@champion``), looked up for
the gate, and scored at the sites beside a run's model when the sites hold the held-out
images (``eval.where: sites``): the train stage hands its weights to the sites' last
evaluation, and the gate reads both scores (:mod:`tasks.registration`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from config.dataset import dataset_info_of
from config.params import Params
from federated.data import DatasetInfo
from federated.server import Federation, ServerState
from federated.vectors import model_to_vector
from tasks.reports import ProjectPaths, write_json
from tasks.tracking import Tracker, fluent_tracking_at

__all__ = [
    "CHAMPION",
    "champion_to_score",
    "champion_version",
    "score_champion_at_sites",
    "scored_at_sites",
    "write_champion_scores",
]

CHAMPION = "champion"  # the registered model's alias hospitals load


def champion_to_score(tracker: Tracker, params: Params) -> dict[str, Any] | None:
    """The champion's ``version`` and weights (``vector``), for the sites to score beside
    this run's model (``eval.where: sites``: the hub holds no image to score it on); None
    when there is none, or when it reads or builds images unlike this run (said)."""
    import mlflow.pyfunc
    from mlflow import MlflowClient

    name = f"fedsieve-{params.data.dataset}"
    logger = get_run_logger()
    try:
        version = champion_version(MlflowClient(tracker.uri), name)
        if version is None:
            return None
        with fluent_tracking_at(tracker.uri):
            loaded = mlflow.pyfunc.load_model(f"models:/{name}@{CHAMPION}")
        classifier = loaded.unwrap_python_model().classifier
    except Exception as error:  # no registry reachable, or a champion of an older kind
        logger.warning(
            "the champion is not scored at the sites: %s: %s", type(error).__name__, error
        )
        return None
    if _reading(classifier.info) != _reading(dataset_info_of(params.data)) or (
        classifier.model_name != params.model.name
    ):
        logger.warning(
            "the champion (version %s, %s) is not scored at the sites: its model or the way "
            "it reads images differs from this run's", version, classifier.model_name,
        )  # fmt: skip
        return None
    return {"version": version, "vector": model_to_vector(classifier.model).cpu()}


@task(name="score-champion-at-sites", cache_policy=NO_CACHE)
def score_champion_at_sites(
    tracker: Tracker, params: Params, paths: ProjectPaths, federation: Federation,
    state: ServerState,
) -> None:  # fmt: skip
    """A simulated run scored at its sites (``eval.where: sites``): the run's model and
    the champion in the same evaluation of the sites' held-out splits, for the gate (the
    ServerApp does the same at real sites)."""
    paths.champion_at_sites.unlink(missing_ok=True)
    champion = champion_to_score(tracker, params) if params.tracking.register_model else None
    if champion is None:
        return
    scores = federation.scored_beside(state, champion["vector"])
    write_champion_scores(paths, tracker, {"version": champion["version"], **scores})


def write_champion_scores(paths: ProjectPaths, tracker: Tracker, scores: dict[str, Any]) -> None:
    """The run's model's and the champion's scores at the sites, for this run's gate."""
    write_json(paths.champion_at_sites, {"run_id": tracker.run_id, **scores})


def _reading(info: DatasetInfo) -> tuple[Any, ...]:
    """What decides the model's input and output: classes, schema, normalisation."""
    schema = info.volume_schema() if info.is_volume else info.image_schema()
    return (info.labels, info.n_channels, schema, info.mean, info.std)


def champion_version(client: Any, name: str) -> str | None:
    try:
        return str(client.get_model_version_by_alias(name, CHAMPION).version)
    except Exception:  # no such alias (or model) yet
        return None


def _auc(scores: dict) -> float:
    """A scored AUC, NaN where none was recorded (an AUC of 0 is a score, not a gap)."""
    auc = scores.get("auc")
    return np.nan if auc is None else float(auc)


def scored_at_sites(
    paths: ProjectPaths, champion: str | None, run_id: str | None
) -> tuple[float, float | None, str]:
    """This run's model's and the champion's test AUC as the sites scored both in the
    run's last federated evaluation, and why the champion has none (empty: no champion)."""
    scored = {}
    if paths.champion_at_sites.exists():
        scored = json.loads(paths.champion_at_sites.read_text())
    if (
        scored.get("run_id") != run_id and paths.metrics.exists()
    ):  # no champion was scored: the run's own pooled AUC
        scored = {"candidate": {"auc": json.loads(paths.metrics.read_text()).get("test_auc")}}
    candidate = _auc(scored.get("candidate", {}))
    if champion is None:
        return candidate, None, ""
    if "champion" not in scored:
        return candidate, None, "it was not scored at the sites (the run's log says why)"
    if str(scored["version"]) != champion:
        return candidate, None, f"the sites scored version {scored['version']}, not {champion}"
    auc = _auc(scored["champion"])
    if not np.isfinite(auc):
        return candidate, None, "no site scored it at the run's end"
    return candidate, auc, ""
