"""What the container scripts share (scripts/federation_smoke.py,
scripts/container_faults.py): a step's command run to its end, waiting for a condition,
Compose found and pointed at the host's network where the engine has no bridge, and the
stack's credentials; the one-line error a step that did not do what it should ends with."""

from __future__ import annotations

import contextlib
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "MLFLOW_URI", "PREFECT_API", "StepError", "client_credentials", "compose_command",
    "host_network", "on_host_network", "run", "stack_credentials", "wait_for",
]  # fmt: skip

PREFECT_API, MLFLOW_URI = "http://127.0.0.1:4200/api", "http://127.0.0.1:5000"
HOST_NETWORK = Path(__file__).resolve().parent / "compose_host_network.py"


class StepError(RuntimeError):
    """A step that did not do what it should: one line saying which and why."""


def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``command`` to its end; :class:`StepError` with its output's tail if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        tail = (done.stdout[-2000:] + done.stderr[-3000:]).strip()
        raise StepError(f"{shlex.join(command[:6])} ... exited {done.returncode}:\n{tail}")
    return done


def wait_for(
    what: str, check: Callable[[], Any], timeout: float, interval: float = 1.0,
    tolerate: tuple[type[Exception], ...] = (),
) -> Any:  # fmt: skip
    """``check()``'s first truthy answer (``tolerate``: errors that mean "not yet")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(*tolerate):
            found = check()
            if found:
                return found
        time.sleep(interval)
    raise StepError(f"{what}: not within {timeout:.0f} s")


def compose_command() -> list[str]:
    """Compose v2 (``docker compose``) or v1 (``docker-compose``)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise StepError("neither 'docker compose' nor 'docker-compose' is installed")


def host_network() -> bool:
    """An engine without a bridge network (these machines) puts every service on the host's."""
    bridge = subprocess.run(["docker", "network", "inspect", "bridge"], capture_output=True)
    return bridge.returncode != 0


def on_host_network(compose_file: Path, out: Path) -> Path:
    """``compose_file`` as it runs here: unchanged, or, where :func:`host_network`, every
    service on the host's network (written to ``out`` by scripts/compose_host_network.py)."""
    if not host_network():
        return compose_file
    run([sys.executable, str(HOST_NETWORK), str(out), str(compose_file)])
    return out


def stack_credentials() -> dict[str, str]:
    """Random secrets for the servers (what docker-compose.yml reads from .env)."""
    return {
        "FEDSIEVE_PREFECT_AUTH": f"fedsieve:{secrets.token_urlsafe(24)}",
        "FEDSIEVE_MLFLOW_PASSWORD": secrets.token_urlsafe(24),
        "FEDSIEVE_MLFLOW_SECRET_KEY": secrets.token_urlsafe(32),
    }


def client_credentials(credentials: dict[str, str]) -> dict[str, str]:
    """What a client of the stack's servers needs, from this host (the worker's own)."""
    return {
        "PREFECT_API_URL": PREFECT_API, "PREFECT_API_AUTH_STRING": credentials["FEDSIEVE_PREFECT_AUTH"],
        "MLFLOW_TRACKING_URI": MLFLOW_URI, "MLFLOW_TRACKING_USERNAME": "fedsieve",
        "MLFLOW_TRACKING_PASSWORD": credentials["FEDSIEVE_MLFLOW_PASSWORD"],
    }  # fmt: skip
