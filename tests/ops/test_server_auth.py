"""The hub's Prefect and MLflow servers behind authentication, as the compose stack serves
them (Prefect's server auth string; MLflow's basic-auth app with scripts/mlflow-auth.ini):
a client without the credentials is refused, the health probes stay open, and a client
given them (as the compose file gives the worker) works and records no secret."""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.limits import limit
from tests.prefect_homes import made_home

REPO = Path(__file__).resolve().parents[2]


def basic(credentials: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()}


@pytest.mark.e2e
def test_prefect_refuses_a_client_without_the_auth_string(ops, processes, tmp_path: Path) -> None:
    auth = f"fedsieve:{secrets.token_urlsafe(16)}"
    port = ops.free_port()
    server = processes.start(
        [str(ops.bin / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port),
         "--no-ui"],
        name="prefect-auth", cwd=tmp_path,
        env=ops.base_env(
            PREFECT_HOME=str(made_home(tmp_path / "server")), PREFECT_SERVER_API_AUTH_STRING=auth
        ),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/api"
    ops.wait_http(f"{url}/health", timeout=limit(600), process=server)  # the probe needs no login

    assert httpx.post(f"{url}/flow_runs/filter", json={}, timeout=limit(30)).status_code == 401
    wrong = basic("fedsieve:not-the-password")
    assert (
        httpx.post(f"{url}/flow_runs/filter", json={}, headers=wrong, timeout=limit(30)).status_code
        == 401
    )

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    with (
        temporary_settings(updates={PREFECT_API_URL: url, PREFECT_API_AUTH_STRING: auth}),
        get_client(sync_client=True) as client,
    ):
        assert client.read_flow_runs() == []  # what the worker and the CLI do with it
        # a grid dispatched to workers checks its deployment with the same credentials
        from fedsieve.ops import ServiceError, require_deployment

        with pytest.raises(ServiceError, match="is not on the Prefect server"):
            require_deployment("pipeline-from-file/nowhere")
    assert auth.split(":")[1] not in processes.log("prefect-auth")


@pytest.mark.e2e
def test_mlflow_refuses_a_client_without_credentials_and_records_no_secret(
    ops, processes, tmp_path: Path
) -> None:
    password = secrets.token_urlsafe(16)
    config = tmp_path / "auth.ini"  # the shipped config, its user store in this test's folder
    config.write_text(
        (REPO / "scripts" / "mlflow-auth.ini")
        .read_text()
        .replace("sqlite:////srv/mlflow/basic_auth.db", f"sqlite:///{tmp_path / 'users.db'}")
    )
    port = ops.free_port()
    server = processes.start(
        ops.mlflow_server(port, tmp_path, "--app-name", "basic-auth"),
        name="mlflow-auth", cwd=tmp_path,
        env=ops.base_env(
            MLFLOW_AUTH_CONFIG_PATH=str(config), MLFLOW_AUTH_ADMIN_USERNAME="fedsieve",
            MLFLOW_AUTH_ADMIN_PASSWORD=password,
            MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_urlsafe(16),
        ),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    ops.wait_http(f"{url}/health", timeout=limit(600), process=server)

    search = f"{url}/api/2.0/mlflow/experiments/search"
    assert httpx.post(search, json={"max_results": 1}, timeout=limit(30)).status_code == 401
    wrong = basic("fedsieve:not-the-password")
    assert (
        httpx.post(search, json={"max_results": 1}, headers=wrong, timeout=limit(30)).status_code
        == 401
    )

    from mlflow import MlflowClient

    with pytest.MonkeyPatch.context() as env:  # as the compose file gives the worker
        env.setenv("MLFLOW_TRACKING_USERNAME", "fedsieve")
        env.setenv("MLFLOW_TRACKING_PASSWORD", password)
        client = MlflowClient(url)
        run = client.create_run(client.create_experiment("audited"))
        client.log_param(run.info.run_id, "train.rounds", "3")
        client.set_terminated(run.info.run_id)
        logged = client.get_run(run.info.run_id)
    assert logged.info.status == "FINISHED"
    assert password not in yaml.safe_dump(logged.data.to_dictionary())
    assert password not in processes.log("mlflow-auth")

    # the compose stack's health probe reads the store, as the admin its container names
    probe = [sys.executable, str(REPO / "scripts" / "mlflow_health.py"), url]
    # what it answers, not how fast: a busy 2-core machine took over the probe's 5 s once
    admin = {"MLFLOW_AUTH_ADMIN_USERNAME": "fedsieve", "MLFLOW_AUTH_ADMIN_PASSWORD": password,
             "FEDSIEVE_HEALTH_TIMEOUT": "60"}  # fmt: skip
    assert subprocess.run(probe, env=os.environ | admin, timeout=limit(120)).returncode == 0
    wrong_admin = admin | {"MLFLOW_AUTH_ADMIN_PASSWORD": "not-the-password"}
    assert subprocess.run(probe, env=os.environ | wrong_admin, timeout=limit(120)).returncode == 1
    processes.stop(server)
    away = subprocess.run(
        probe, env=os.environ | admin, capture_output=True, text=True, timeout=limit(120)
    )
    assert away.returncode == 1 and away.stderr.startswith("mlflow unhealthy:")
