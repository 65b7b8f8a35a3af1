"""End to end: attacks, the PID-MADE filter and the exclusion trail in the real flows, and
the comparison grid as MLflow child runs."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from config.params import load_params
from flows.compare import compare_flow
from flows.evaluate import evaluate_flow
from flows.partition import partition_flow
from flows.train import train_flow

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def test_scaled_attackers_are_excluded_on_the_record(project, prefect_server):
    params = load_params(
        project / "params.yaml",
        [
            "partition.num_clients=6",
            "train.rounds=2",
            "train.local_epochs=1",
            "attack={name: scaling, factor: 50, ids: [1, 4]}",
            "filters=[{name: pid_made, threshold: k, k: 1.0, centroid: geometric_median}]",
            "noniid.every=1",
        ],
    )

    partition_flow(params, project)
    train_flow(params, project)
    metrics = evaluate_flow(params, project)

    with (project / "reports" / "exclusions.csv").open() as handle:
        trail = list(csv.DictReader(handle))
    assert len(trail) == 12  # every (round, client)
    for row in trail:
        assert row["malicious"] == str(row["client"] in ("1", "4"))
        if row["malicious"] == "True":
            assert row["excluded"] == "True" and row["reason"] == "pid_made"
            assert float(row["score"]) > float(row["threshold"])
        for column in ("distance", "p_term", "i_term", "d_term", "noniid_loss"):
            assert row[column] != ""
    assert metrics["total_false_negatives"] == 0 and metrics["detection_recall"] == 1.0
    assert (project / "reports" / "exclusions.png").stat().st_size > 0
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run_id = json.loads((project / "artifacts/model/tracking.json").read_text())["run_id"]
    run = client.get_run(run_id)
    assert run.data.tags["attack"] == "scaling"
    assert "exclusions.json" in {a.path for a in client.list_artifacts(run_id)}
    assert [m.value for m in client.get_metric_history(run_id, "false_negatives")] == [0.0, 0.0]


def test_compare_grid_runs_children_under_one_parent(project, prefect_server):
    params = load_params(
        project / "params.yaml",
        [
            "partition.num_clients=4",
            "train.rounds=1",
            "train.local_epochs=1",
            "compare={methods: {fedavg: {}, median: {aggregate: {name: median}}}, "
            "attacks: [{name: sign_flip}], fractions: [0.25], seeds: [0], max_parallel: 2}",
        ],
    )

    rows = compare_flow(params, project)

    assert [(r["method"], r["attack"], r["fraction"]) for r in rows] == [
        ("fedavg", "sign_flip", 0.25),
        ("median", "sign_flip", 0.25),
    ]
    summary = project / "reports" / "compare"
    for name in ("summary.csv", "summary.md", "accuracy.png", "heatmap.png"):
        assert (summary / name).exists(), name
    assert "| median | sign_flip |" in (summary / "summary.md").read_text()
    # experiments/compare/dvc.yaml declares exactly what the flow writes
    stage = yaml.safe_load((REPO / "experiments" / "compare" / "dvc.yaml").read_text())
    declared = [
        next(iter(entry)) for key in ("outs", "plots") for entry in stage["stages"]["compare"][key]
    ]
    assert sorted(declared) == sorted(f"reports/compare/{p.name}" for p in summary.iterdir())
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("fedsieve").experiment_id
    [parent] = client.search_runs([experiment], "tags.kind = 'compare'")
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(c.data.tags["aggregator"] for c in children) == ["fedavg", "median"]
    assert sorted(c.info.run_name for c in children) == [
        "fedavg-sign_flip-f0.25-s0",
        "median-sign_flip-f0.25-s0",
    ]
    assert all(c.data.tags["attack"] == "sign_flip" for c in children)
    assert {"compare/summary.csv", "compare/heatmap.png"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id, "compare")
    }


def test_a_backdoor_run_reports_its_success_rate_every_round_and_at_the_end(
    project, prefect_server
):
    params = load_params(
        project / "params.yaml",
        [
            "partition.num_clients=3",
            "train.rounds=2",
            "train.local_epochs=1",
            "attack={name: backdoor, target_label: 0, poison_fraction: 0.5, ids: [1]}",
        ],
    )

    partition_flow(params, project)
    train_flow(params, project)
    metrics = evaluate_flow(params, project)

    with (project / "reports" / "rounds.csv").open() as handle:
        asr = [float(row["backdoor_asr"]) for row in csv.DictReader(handle)]
    assert len(asr) == 2 and all(0.0 <= a <= 1.0 for a in asr)
    assert 0.0 <= metrics["backdoor_asr"] <= 1.0
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run_id = json.loads((project / "artifacts/model/tracking.json").read_text())["run_id"]
    assert len(client.get_metric_history(run_id, "backdoor_asr")) == 2
    assert client.get_run(run_id).data.metrics["final_backdoor_asr"] == metrics["backdoor_asr"]


def test_a_round_over_the_exclusion_bound_stops_the_run_failed_on_the_record(
    project, prefect_server, capsys, caplog
):
    from fedsieve.cli import main

    code = main(
        ["run", "--set", "partition.num_clients=5", "--set", "train.rounds=3",
         "--set", "train.local_epochs=1", "--set", "aggregate={name: multi_krum, f: 1, m: 3}",
         "--set", "train.max_excluded=1"]
    )  # fmt: skip

    assert code == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("fedsieve: error: round 1: 2 of 5 clients left out, more than")
    assert "Finished in state Failed" in caplog.text  # the runs' log was captured
    assert not [r for r in caplog.records if r.exc_info], "a refusal logs no traceback"
    with (project / "reports" / "exclusions.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == 5  # the round's trail is written
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    [run] = client.search_runs([client.get_experiment_by_name("fedsieve").experiment_id])
    assert run.info.status == "FAILED"


def test_a_run_that_aggregated_no_round_fails_and_registers_no_model(
    project, prefect_server, capsys
):
    """Every round kept fewer clients than ``train.min_clients`` (here the non-IID screen
    leaves out every client above the mean loss, all five are needed; at real sites, every
    site refusing the task): the model is the initial one, so the run fails in one line
    and nothing is registered as trained."""
    from fedsieve.cli import main

    code = main(
        ["run", "--set", "partition.num_clients=5", "--set", "train.rounds=2",
         "--set", "train.local_epochs=1", "--set", "noniid.exclude=true",
         "--set", "noniid.z=0.01", "--set", "train.min_clients=5"]
    )  # fmt: skip

    assert code == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("fedsieve: error: no round was aggregated: each of the 2 rounds"), last
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    [run] = client.search_runs([client.get_experiment_by_name("fedsieve").experiment_id])
    assert run.info.status == "FAILED"
    assert not client.search_model_versions(f"run_id = '{run.info.run_id}'")


def test_preaggregators_and_fltrust_explain_each_client_in_the_trail(project, prefect_server):
    params = load_params(
        project / "params.yaml",
        [
            "partition.num_clients=4",
            "partition.root_size=20",
            "train.rounds=1",
            "train.local_epochs=1",
            "preaggregators=[{name: clip, c: 0.5}]",
            "aggregate={name: fltrust}",
            "attack={name: sign_flip, ids: [2]}",
        ],
    )

    report = partition_flow(params, project)
    train_flow(params, project)

    assert report["root_size"] == 20  # held by no client: the rest trains or tests locally
    assert report["total"] + report["local_test_total"] == 546 - 20
    with (project / "reports" / "exclusions.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 4
    for row in rows:
        assert float(row["clip.clip_factor"]) <= 1.0
        assert float(row["trust_score"]) >= 0.0
        assert float(row["effective_weight"]) >= 0.0
    attacker = next(r for r in rows if r["client"] == "2")
    assert float(attacker["trust_score"]) == 0.0  # its flipped update points away from the root's
