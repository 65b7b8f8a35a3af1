"""The gate, end to end on BreastMNIST: a run made to diverge is logged but not
registered and says why in one line; a worse model is registered but the better champion
is kept, both scored on the same held-out images (the hub's, or the sites' in one
evaluation); each registered version has its card."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow.artifacts
import pytest
from mlflow import MlflowClient

from config.params import load_params
from flows.pipeline import pipeline_flow
from tasks.tracking import fluent_tracking_at
from tests.limits import limit

pytestmark = pytest.mark.e2e

NAME = "fedsieve-breastmnist"
SMALL = ["partition.num_clients=3", "train.local_epochs=1"]
# central DP with far too much noise: finite weights, a test loss of about 1e13, AUC 0.5
DIVERGED = [*SMALL, "train.rounds=2", "privacy.mode=central", "privacy.noise_multiplier=50",
            "privacy.clip=10"]  # fmt: skip


def runs_by_name(client: MlflowClient) -> dict[str, object]:
    experiment = client.get_experiment_by_name("fedsieve").experiment_id
    return {r.info.run_id: r for r in client.search_runs([experiment])}


def register_an_older_kind_of_champion(client: MlflowClient) -> str:
    """A champion as an older fedsieve registered it: raw torch weights taking a tensor."""
    import mlflow.pytorch
    import numpy as np
    import torch

    with fluent_tracking_at(client.tracking_uri), mlflow.start_run(run_name="older"):
        info = mlflow.pytorch.log_model(
            torch.nn.Linear(4, 2), name="model", input_example=np.zeros((2, 4), np.float32),
            registered_model_name=NAME, pip_requirements=["torch"], await_registration_for=0,
        )  # fmt: skip
    client.set_registered_model_alias(NAME, "champion", info.registered_model_version)
    return str(info.registered_model_version)


# what a 3-site run of params.yaml's small CNN under FedAvg, nobody excluded, says of its
# defence: its model's record (benchmarks/results/small-consortium-cnn-cpu.json) measured
# filters in front of the median, not FedAvg
NOT_MEASURED = ("not measured in front of fedavg (benchmarks/results/small-consortium-cnn-cpu"
                ".json measures filters directly in front of median with small_cnn)")  # fmt: skip
MEASURED = f"no site excluded; this defence was {NOT_MEASURED}"


def fedsieve_run(project: Path, prefect_server: str, overrides: list[str]):
    """``fedsieve run --set ...`` in ``project`` (its tracking store, the session's Prefect
    server): its exit code and output."""
    sets = [arg for override in overrides for arg in ("--set", override)]
    return subprocess.run(
        [str(Path(sys.executable).parent / "fedsieve"), "run", *sets], cwd=project,
        env={**os.environ, "PREFECT_API_URL": prefect_server}, capture_output=True, text=True,
        timeout=limit(900),
    )  # fmt: skip


def test_the_gate_refuses_a_diverged_model_and_keeps_a_better_champion(
    project, prefect_server, caplog
):
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    older = register_an_older_kind_of_champion(client)
    good = pipeline_flow(load_params(project / "params.yaml", [*SMALL, "train.rounds=3"]), project)
    log = caplog.text  # the run's log: what its defence caught, at the start
    assert (
        f"defence as measured: this run's defence was {NOT_MEASURED}; what it catches at 3 "
        "sites is unknown" in log
    )
    assert MEASURED in log  # and at the end, nobody excluded
    [first] = [v for v in client.search_model_versions(f"name='{NAME}'") if str(v.version) != older]
    assert client.get_model_version_by_alias(NAME, "champion").version == first.version
    assert client.get_run(first.run_id).data.tags["gate.champion.reason"] == (
        "the champion is replaced: it does not take image files (registered by an older fedsieve)"
    )

    refused = fedsieve_run(project, prefect_server, DIVERGED)  # as a user meets the refusal
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr and "| ERROR" not in refused.stderr, refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "fedsieve: error: the model is not registered: test AUC 0.500 is no better than a "
        "constant predictor's 0.5"
    )
    older_run = client.get_model_version(NAME, older).run_id
    [diverged] = [
        r for r in runs_by_name(client).values() if r.info.run_id not in (first.run_id, older_run)
    ]
    assert diverged.info.status == "FAILED"
    assert diverged.data.tags["gate.registration"] == "refused"
    assert diverged.data.metrics["gate_test_auc"] == 0.5
    [logged] = client.search_logged_models(
        [diverged.info.experiment_id], filter_string=f"source_run_id = '{diverged.info.run_id}'"
    )
    assert logged.name == "model"  # logged on its run, for a look
    assert len(client.search_model_versions(f"name='{NAME}'")) == 2  # not registered

    worse = pipeline_flow(load_params(project / "params.yaml", [*SMALL, "train.rounds=2"]), project)
    versions = client.search_model_versions(f"name='{NAME}'")
    [second] = [v for v in versions if str(v.version) not in (str(first.version), older)]
    assert client.get_model_version_by_alias(NAME, "champion").version == first.version
    tags = client.get_run(second.run_id).data.tags
    assert (tags["gate.registration"], tags["gate.champion"]) == ("passed", "refused")
    metrics = client.get_run(second.run_id).data.metrics
    assert metrics["gate_candidate_test_auc"] == pytest.approx(worse["test_auc"])
    assert metrics["gate_champion_test_auc"] == pytest.approx(good["test_auc"])
    assert worse["test_auc"] < good["test_auc"]
    assert tags["gate.champion.reason"].startswith("the champion is kept: its test AUC")

    # scored at the sites (the hub scores nothing): the champion is scored beside the run's
    # model in the same evaluation of the sites' held-out splits
    at_sites = [*SMALL, "train.rounds=2", "eval.where=sites", "partition.local_test=0.3"]
    scored = pipeline_flow(load_params(project / "params.yaml", at_sites), project)
    together = json.loads((project / "reports" / "champion_at_sites.json").read_text())
    assert together["version"] == str(first.version) and together["sites"] == [0, 1, 2]
    assert together["candidate"]["auc"] == pytest.approx(scored["test_auc"])  # the same model
    [third] = [
        v for v in client.search_model_versions(f"name='{NAME}'")
        if str(v.version) not in (str(first.version), str(second.version), older)
    ]  # fmt: skip
    metrics = client.get_run(third.run_id).data.metrics
    assert metrics["gate_candidate_test_auc"] == pytest.approx(together["candidate"]["auc"])
    assert metrics["gate_champion_test_auc"] == pytest.approx(together["champion"]["auc"])
    champion_wins = together["champion"]["auc"] > together["candidate"]["auc"]
    crowned = client.get_model_version_by_alias(NAME, "champion").version
    assert crowned == (first.version if champion_wins else third.version)

    card_of(client, first, good)


def card_of(client: MlflowClient, version, results: dict) -> None:
    """The first version's card: on its run, and as the version's description."""
    with fluent_tracking_at(client.tracking_uri):
        folder = mlflow.artifacts.download_artifacts(
            run_id=version.run_id, artifact_path="model_card"
        )
    card = json.loads((Path(folder) / "card.json").read_text())
    assert (Path(folder) / "card.md").read_text() == client.get_model_version(
        NAME, version.version
    ).description
    assert card["model"] == {
        "name": NAME, "version": str(version.version), "run_id": version.run_id,
        "architecture": "small_cnn", "task": "binary-class",
        "classes": ["malignant", "normal, benign"],
        "input": "PNG, JPEG, BMP, TIFF or DICOM files, read as grey at 28x28 px (intensity "
                 "auto, resample bilinear)",
    }  # fmt: skip
    sites = card["data"]["sites"]
    assert [s["site"] for s in sites] == ["client 0", "client 1", "client 2"]
    assert all(sum(s["classes"].values()) == s["samples"] for s in sites)
    assert card["training"]["rule"] == "fedavg" and card["training"]["filters"] == ["none"]
    assert card["training"]["exclusions"]["client_rounds"] == 9
    assert card["training"]["exclusions"]["measured"] == MEASURED
    assert client.get_run(version.run_id).data.tags["exclusions"] == MEASURED  # the trail's run
    assert card["performance"]["test"]["auc"] == pytest.approx(results["test_auc"])
    assert {"ece", "brier"} <= set(card["performance"]["test"])
    per_site = card["performance"]["per_site"]  # each site's held-out split, by name
    assert [s["site"] for s in per_site] == ["client 0", "client 1", "client 2"]
    assert all(s["held_out"] > 0 for s in per_site)
    spread = card["performance"]["sites"]
    assert {spread["site_worst"], spread["site_best"]} <= {s["site"] for s in per_site}
    assert card["privacy"] == {"mode": "off", "epsilon": None, "delta": None}
    assert len(card["provenance"]["plan_sha256"]) == 64
    assert card["intended_use"].startswith("Research: comparing robust federated learning")
    described = client.get_model_version(NAME, version.version).description
    assert described.startswith(f"# {NAME} version {version.version}")
    assert "| client 0 |" in described
    assert f"| client 0 | {per_site[0]['held_out']} | " in described
    assert f"{MEASURED[0].upper()}{MEASURED[1:]}." in described
