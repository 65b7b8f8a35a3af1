"""A Prefect server for one ``fedsieve`` command: ``prefect server start`` on a free
loopback port, as Prefect documents it, stopped when the command ends.

Used by every flow command when ``PREFECT_API_URL`` is unset, and by ``fedsieve dvc``
(one server for every stage it runs). Prefect's own temporary server (what a flow called
from Python starts) is not used by the command: it is stopped by an exit hook only, so a
command killed outright (SIGKILL, the OOM killer) would leave it running. This server is
started under ``setpriv --pdeathsig TERM`` (util-linux) where that exists, so the kernel
stops it when the command dies by any means; a normal end, an error, SIGTERM and Ctrl-C
stop it through :func:`prefect_server`'s exit. It runs in a session of its own: a
terminal's Ctrl-C (or ``kill -- -PGID``) signals the command's whole process group, and
a server in that group stopped at once, before the command had reported its flow run's
end, left the run Running and held the command for minutes retrying a server that was
gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from config.errors import ServiceError

__all__ = ["configured_api_url", "prefect_server"]

STARTUP_SECONDS = 120  # a cold start creates the database: slow on a busy 2-core machine
STOP_SECONDS = 10
DELIVERY_SECONDS = 120  # the most a command waits at its end for its logs to reach its server


def configured_api_url() -> str | None:
    """The Prefect API the user configured (``PREFECT_API_URL`` or a profile), if any."""
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server_command(port: int) -> list[str]:
    prefect = Path(sys.executable).with_name("prefect")
    command = [str(prefect) if prefect.exists() else "prefect", "server", "start"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    command += ["--no-ui", "--no-scheduler", "--no-late-runs", "--analytics-off"]
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", *command] if setpriv else command


def _wait_until_healthy(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServiceError(
                f"the Prefect server for this command exited with code {process.returncode} "
                f"(its log: {log}); check PREFECT_HOME={os.environ.get('PREFECT_HOME')} or "
                "set PREFECT_API_URL to a running server"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        time.sleep(0.25)
    raise ServiceError(f"the Prefect server for this command was not ready in time (log: {log})")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Deliver the log lines and events still queued for the server, then stop it.

    Delivered first, while the server answers: Prefect's workers send what is left in
    their queues when the process exits, and a send to a server that is gone is retried
    with a doubling back-off (about a minute per batch of log lines), which held a
    stopped command past its exit for minutes when its queue outran the server (a busy
    machine, a cancelled comparison's tracebacks). ``APILogHandler.flush`` waits 5 s."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=DELIVERY_SECONDS)
    process.terminate()
    try:
        process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def prefect_server() -> Iterator[str]:
    """The configured Prefect API URL, or one of a server started for the block (and
    stopped when it ends), made this process's ``PREFECT_API_URL`` meanwhile."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    configured = configured_api_url()
    if configured:
        yield configured
        return
    home = Path(get_current_settings().home)
    log = home / "server.log"
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    try:
        home.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as output:
            process = subprocess.Popen(
                _server_command(port),
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # not stopped by a signal to the command's group
            )
    except OSError as error:
        raise ServiceError(
            f"cannot start a Prefect server in PREFECT_HOME={home} ({error.strerror or error}); "
            "set PREFECT_HOME to a writable folder or PREFECT_API_URL to a running server"
        ) from None
    try:
        _wait_until_healthy(process, url, log)
        with temporary_settings({PREFECT_API_URL: url}):
            yield url
    finally:
        _stop(process)
