"""Fixtures for the ops tests: real servers and workers as subprocesses on loopback, each
stopped by PID (its process tree) when the test or module ends."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import psutil
import pytest

from config.environment import MLFLOW_SERVER_NO_JOBS, TELEMETRY_OFF
from tests.limits import limit

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, *, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``url`` until it answers 200; fail early if ``process`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=limit(5)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout:.0f} s")


class Processes:
    """Subprocesses started by a test, each in its own session, stopped with their whole
    process tree (Prefect starts flow-run processes in sessions of their own)."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        command: Sequence[str],
        *,
        name: str,
        env: Mapping[str, str],
        cwd: Path,
    ) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        process = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.started.append(process)
        return process

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @staticmethod
    def stop(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
        if process.poll() is not None:
            return
        try:
            tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(True)]
        except psutil.NoSuchProcess:
            tree = []
        for member in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(tree, timeout=grace)
        for member in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        psutil.wait_procs(alive, timeout=limit(5))
        try:
            process.wait(timeout=limit(5))
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()

    def stop_all(self) -> None:
        for process in reversed(self.started):
            self.stop(process)


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    started = Processes(tmp_path_factory.mktemp("ops-logs"))
    try:
        yield started
    finally:
        started.stop_all()


def _base_env(**extra: str) -> dict[str, str]:
    """The test process's environment with telemetry off and no MLflow job runner, minus
    anything pointing at the session's Prefect harness or tracking store."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "FEDSIEVE_HOME")
    }
    env.update(TELEMETRY_OFF | MLFLOW_SERVER_NO_JOBS)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def _mlflow_server(port: int | str, folder: Path, *options: str) -> list[str]:
    """``mlflow server`` on 127.0.0.1:``port`` with its store and artifacts in ``folder``;
    one worker: each of MLflow's default four imports MLflow before the server answers
    (19 s to /health here, 9 s with one)."""
    return [
        str(BIN / "mlflow"), "server", *options, "--host", "127.0.0.1", "--port", str(port),
        "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
        "--artifacts-destination", str(folder / "artifacts"), "--workers", "1",
    ]  # fmt: skip


class Helpers:
    """What the ops tests share (conftest modules are not importable under
    ``--import-mode=importlib``, so they come as a fixture)."""

    repo = REPO
    bin = BIN
    free_port = staticmethod(free_port)
    wait_http = staticmethod(wait_http)
    base_env = staticmethod(_base_env)
    mlflow_server = staticmethod(_mlflow_server)


@pytest.fixture(scope="session")
def ops() -> type[Helpers]:
    return Helpers
