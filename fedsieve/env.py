"""Process environment the project sets before Prefect/MLflow/DVC are imported, and the
tracking store it uses.

Telemetry off (each tool otherwise makes a network attempt), MLflow's HTTP client failing
within seconds rather than minutes, and PREFECT_HOME inside the project, unless the user
has set them.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DEFAULT_TRACKING_URI", "configure_environment", "tracking_uri"]

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"

TELEMETRY_OFF = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "true",  # MLflow honours "true", not "1"
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
}

# MLflow's HTTP client retries 7 times with a backoff factor of 2 (minutes before a call to
# an unreachable tracking server gives up). The Tracker goes quiet after the first failure
# and reports/ keep everything, so fail within seconds instead: ~6 s for a closed port.
MLFLOW_HTTP_FAIL_FAST = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}


def configure_environment(project: Path | None = None) -> None:
    for key, value in (TELEMETRY_OFF | MLFLOW_HTTP_FAIL_FAST).items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("PREFECT_HOME", str((project or Path.cwd()) / ".prefect"))
    # A flow's temporary server may take a while on a cold, busy 2-core machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` when set (a team server works unchanged), else the project's
    SQLite file."""
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
