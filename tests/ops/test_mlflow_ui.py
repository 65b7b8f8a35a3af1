"""The MLflow UI, rendered in headless Chromium by scripts/check_mlflow_ui.py, lists the
project's experiment and its runs (what `mlflow server` serves from the project's store)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from mlflow import MlflowClient

from tasks.tracking import flatten_params


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
        timeout=400,
        env=ops.base_env(),
    )

    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.count("ok  ") == 2 + len(RUN_NAMES), done.stdout
    assert "run count (3 matching) shown" in done.stdout
    screenshot = (out / "mlflow-ui.png").read_bytes()
    assert screenshot.startswith(b"\x89PNG") and len(screenshot) > 20_000
