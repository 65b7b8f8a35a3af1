"""The MLflow UI, rendered in headless Chromium by scripts/check_mlflow_ui.py, lists the
project's experiment and its runs, and shows a training run's dataset inputs and per-site
table as fedsieve logs them (what `mlflow server` serves from the project's store)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from mlflow import MlflowClient

from tasks.tracking import Tracker, flatten_params
from tests.limits import limit


def _chromium() -> str | None:
    return next(
        (p for n in ("chromium", "chromium-browser", "google-chrome") if (p := shutil.which(n))),
        None,
    )


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        _chromium() is None, reason="no chromium binary installed (apt-get install -y chromium)"
    ),
]

RUN_NAMES = ["breastmnist-fedavg", "breastmnist-krum", "retinamnist-median"]


def test_the_ui_lists_the_experiment_and_its_runs(tmp_path, ops):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(store)
    experiment = client.create_experiment("fedsieve", artifact_location=str(tmp_path / "art"))
    for seed, name in enumerate(RUN_NAMES):
        dataset, aggregator = name.split("-")
        run = client.create_run(
            experiment, run_name=name, tags={"dataset": dataset, "aggregator": aggregator}
        )
        for key, value in flatten_params({"seed": seed, "train": {"rounds": 2}}).items():
            client.log_param(run.info.run_id, key, value)
        client.log_metric(run.info.run_id, "final_test_auc", 0.8 + seed / 100)
        client.set_terminated(run.info.run_id)
    trained = Tracker("fedsieve", store)  # the newest run, logged as a training run logs
    trained.start(run_id=None, run_name="breastmnist-trimmed_mean", tags={})
    trained.log_dataset("breastmnist", "750601b1f35ba3300ea97c75c52ff8f6", "file.npz", "train")
    trained.log_dataset("partition", "0123456789abcdef", "clients.npz", "partition")
    sites = [
        {
            "site": i,
            "n": 10 + i,
            "loss": 0.5,
            "acc": 0.7 + i / 100,
            "auc": 0.8,
            "ece": 0.1,
            "brier": 0.2,
        }
        for i in range(4)
    ]
    trained.log_table(sites, "sites.json")
    trained.end("FINISHED")
    out = tmp_path / "ui"

    done = subprocess.run(
        [
            sys.executable,
            str(ops.repo / "scripts" / "check_mlflow_ui.py"),
            "--backend-store-uri",
            store,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=limit(400),
        env=ops.base_env(),
    )

    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "MISS" not in done.stdout, done.stdout
    assert done.stdout.count("ok  ") == 2 + len(RUN_NAMES) + 1 + 3, done.stdout
    assert "run count (4 matching) shown" in done.stdout
    assert "its 2 dataset inputs shown" in done.stdout  # "breastmnist (750601b1) train +1"
    assert "per-site table header (site n loss acc auc ece brier) shown" in done.stdout
    assert "all 4 sites in the table" in done.stdout
    screenshot = (out / "mlflow-ui.png").read_bytes()
    assert screenshot.startswith(b"\x89PNG") and len(screenshot) > 20_000
