"""Prefect's temporary server is left alone when a real one is configured."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from prefect.settings import PREFECT_API_URL, temporary_settings

from fedsieve import prefect_server


def test_a_configured_server_is_used_and_nothing_is_started():
    url = "http://127.0.0.1:4200/api"
    with temporary_settings({PREFECT_API_URL: url}):
        assert not prefect_server.uses_temporary_server()
        prefect_server.start_early()
        assert prefect_server._early is None
        prefect_server.wait_until_ready()  # nothing to wait for
        with prefect_server.shared() as env:
            assert env["PREFECT_API_URL"] == url


def test_without_a_server_url_a_temporary_server_is_needed():
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert prefect_server.uses_temporary_server()


def test_a_stage_starts_its_temporary_server_early_and_only_once(tmp_path, medmnist_root):
    repo = Path(__file__).resolve().parents[2]
    shutil.copy(repo / "params.yaml", tmp_path / "params.yaml")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {"MEDMNIST_ROOT": str(medmnist_root), "PREFECT_HOME": str(tmp_path / ".prefect")}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"

    result = subprocess.run(
        [str(Path(sys.executable).parent / "fedsieve"), "partition"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert output.count("Starting temporary server") == 1, output[-3000:]
    assert (tmp_path / "reports" / "partition.json").exists()
