"""`fedsieve runs` and `fedsieve promote` against a real MLflow store (SQLite in a temporary
directory) holding runs tagged like the pipeline's and really logged, registered torch
models."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mlflow
import mlflow.pytorch
import pytest
import torch
from mlflow import MlflowClient

from fedsieve.cli import main
from fedsieve.ops import final_metric, list_runs, promote_champion
from tasks.tracking import fluent_tracking_at

MODEL = "fedsieve-breastmnist"
T0 = 1_760_000_000_000  # ms

# name, tags, final metrics, registered?, experiment
RUNS: list[tuple[str, dict[str, str], dict[str, float], bool, str]] = [
    ("breastmnist-fedavg", {"seed": "0"}, {"auc": 0.80, "acc": 0.85, "loss": 0.40}, True, "f"),
    (
        "breastmnist-krum",
        {"seed": "1", "filters": "pid_made", "attack": "label_flip"},
        {"auc": 0.90, "acc": 0.82, "loss": 0.45},
        True,
        "f",
    ),
    ("breastmnist-median", {"seed": "2"}, {"auc": 0.85, "acc": 0.88, "loss": 0.35}, True, "f"),
    ("breastmnist-fedavg", {"seed": "3"}, {}, False, "f"),  # killed before evaluation
    ("breastmnist-fedavg", {"seed": "4"}, {"auc": 0.99, "acc": 0.90, "loss": 0.30}, True, "o"),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Five runs in two experiments; four registered versions of fedsieve-breastmnist."""
    root = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiments = {
        "f": client.create_experiment("fedsieve", artifact_location=str(root / "a-fedsieve")),
        "o": client.create_experiment("other", artifact_location=str(root / "a-other")),
    }
    run_ids, versions = [], {}
    with fluent_tracking_at(uri):
        for index, (name, tags, final, registered, experiment) in enumerate(RUNS):
            run = client.create_run(
                experiments[experiment],
                start_time=T0 + index * 60_000,
                run_name=name,
                tags={
                    "dataset": "breastmnist",
                    "aggregator": name.split("-")[1],
                    "filters": "none",
                    **tags,
                },
            )
            run_id = run.info.run_id
            for key, value in final.items():
                client.log_metric(run_id, f"final_test_{key}", value)
            if registered:
                with mlflow.start_run(run_id=run_id):
                    mlflow.pytorch.log_model(
                        torch.nn.Linear(4, 2),
                        name="model",
                        serialization_format="pickle",
                        pip_requirements=["torch"],
                        registered_model_name=MODEL,
                        await_registration_for=0,
                    )
                [version] = client.search_model_versions(f"name='{MODEL}' and run_id='{run_id}'")
                versions[index] = str(version.version)
            client.set_terminated(run_id, status="FINISHED" if final else "KILLED")
            run_ids.append(run_id)
    yield {"uri": uri, "client": client, "run_ids": run_ids, "versions": versions}


@pytest.fixture
def tracking(store, monkeypatch) -> MlflowClient:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store["uri"])
    return store["client"]


def champion(client: MlflowClient) -> str:
    return str(client.get_model_version_by_alias(MODEL, "champion").version)


def test_metric_names_accept_the_short_and_the_final_form():
    assert final_metric("test_auc") == final_metric("final_test_auc") == "final_test_auc"


def test_runs_are_listed_newest_first_by_default(store):
    rows = list_runs(store["client"], "fedsieve", limit=10)
    assert [row.run_id for row in rows] == store["run_ids"][3::-1]


@pytest.mark.parametrize(
    ("metric", "order"),
    [("final_test_auc", [1, 2, 0, 3]), ("final_test_loss", [2, 0, 1, 3])],  # loss: lowest first
)
def test_runs_sort_by_a_metric_best_first_and_runs_without_it_last(store, metric, order):
    rows = list_runs(store["client"], "fedsieve", sort=metric, limit=10)
    assert [row.run_id for row in rows] == [store["run_ids"][i] for i in order]


def test_runs_command_prints_a_table_of_tags_and_final_metrics(tracking, store, capsys):
    assert main(["runs", "--sort", "test_auc", "--limit", "2"]) == 0
    header, first, second, *rest = capsys.readouterr().out.splitlines()
    assert not rest
    assert header.split() == [
        "run_id", "run", "started", "status", "dataset", "aggregator", "filters", "attack",
        "seed", "test_acc", "test_auc", "test_loss",
    ]  # fmt: skip
    assert first.split()[:1] == [store["run_ids"][1][:8]]
    assert {"breastmnist-krum", "krum", "pid_made", "label_flip", "0.9000"} <= set(first.split())
    assert "breastmnist-median" in second and "0.8500" in second


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["runs", "--experiment", "nope"], 2, "no MLflow experiment named 'nope'"),
        (["runs", "--sort", "test auc"], 2, "metric 'test auc'"),
        (["promote", "--metric", "test_auc", "--model", "nope"], 2, "no such registered model"),
        (["promote", "--metric", "test_f1"], 2, "has a run with metric 'final_test_f1'"),
    ],
)
def test_bad_input_ends_with_one_line_and_exit_code_2(tracking, capsys, argv, code, message):
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_a_missing_store_is_refused_not_created(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{missing}")
    assert main(["runs"]) == 1
    assert "no MLflow store at" in capsys.readouterr().err and not missing.exists()


def test_promote_aliases_the_best_version_by_the_run_metric(tracking, store, capsys):
    versions = store["versions"]

    assert main(["promote", "--metric", "test_auc", "--experiment", "fedsieve"]) == 0
    out = capsys.readouterr().out
    assert champion(tracking) == versions[1]
    assert f"{MODEL} version {versions[1]} is now @champion" in out
    assert store["run_ids"][1] in out and "final_test_auc = 0.9000" in out

    assert main(["promote", "--metric", "final_test_auc"]) == 0  # all experiments
    assert champion(tracking) == versions[4]
    assert f"(was version {versions[1]})" in capsys.readouterr().out

    chosen = promote_champion(tracking, "test_loss", experiment="fedsieve")  # lowest loss
    assert (chosen.version, chosen.run_id) == (versions[2], store["run_ids"][2])
    assert champion(tracking) == versions[2]


def test_promote_asks_which_model_when_several_are_registered(tracking, capsys):
    tracking.create_registered_model("fedsieve-retinamnist")
    try:
        assert main(["promote", "--metric", "test_auc"]) == 2
        assert "choose one with --model" in capsys.readouterr().err
        assert main(["promote", "--metric", "test_auc", "--model", MODEL]) == 0
    finally:
        tracking.delete_registered_model("fedsieve-retinamnist")
