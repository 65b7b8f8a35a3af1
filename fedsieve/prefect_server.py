"""Prefect's temporary local server, started at the first instant and shared by children.

With no ``PREFECT_API_URL``, Prefect starts a temporary server (a uvicorn subprocess on the
SQLite database under PREFECT_HOME) at a process's first API call: about 4 s of its own
imports on a 2-core machine, paid after torch, the data and the flows have loaded, plus
2 s for importing the server module into the calling process. Here the same server (the
same uvicorn command and environment as Prefect's ``SubprocessASGIServer``, less a flag
that only asks for a full collection; its app built by :func:`server_app`, with the
garbage collector paused, and answering a write refused by a locked SQLite only once
retrying it has failed: :class:`BusyRetried`) is launched by :class:`TemporaryServer`
without importing the server module:

- :func:`start_early` launches it at the top of a flow command, before the parameters are
  even read, so its start-up overlaps everything the command does before its flow runs;
  :func:`bind` waits for it to answer and runs the flow with ``PREFECT_API_URL`` pointing
  at it. It stops in an exit hook, after Prefect's own (its log and event workers drain
  first), and silently, so a usage error still shows the user one line.
- :func:`shared` runs one server for a block and hands its URL to child processes through
  ``PREFECT_API_URL`` (``fedsieve dvc repro``: one server for every stage).

Both do nothing when ``PREFECT_API_URL`` is set: a real server is already there.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import importlib.util
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fedsieve.die_with_parent import guarded_command
from fedsieve.startup import collector_paused

if TYPE_CHECKING:  # starlette comes with Prefect's server; the command needs only the names
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "BusyRetried", "TemporaryServer", "bind", "discard", "server_app", "server_environment",
    "shared", "start_early", "stop", "uses_temporary_server",
]  # fmt: skip

log = logging.getLogger("prefect")  # Prefect's console logging shows it, like its own line
F = TypeVar("F", bound=Callable[..., Any])
# uvicorn's exit code when start-up failed: the port was taken meanwhile (worth another
# port), or the app itself could not start (no use trying again and again)
_STARTUP_FAILED = 3
# Set for child processes of a temporary server (``fedsieve dvc repro``'s stages).
TEMPORARY_MARK = "FEDSIEVE_PREFECT_SERVER_IS_TEMPORARY"
_early: TemporaryServer | None = None


def uses_temporary_server() -> bool:
    """True when a flow run here would start Prefect's temporary server."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    return not PREFECT_API_URL.value() and bool(PREFECT_SERVER_EPHEMERAL_ENABLED.value())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class TemporaryServer:
    """Prefect's temporary server as a subprocess we own: :meth:`launch` returns at once,
    :meth:`wait_ready` blocks until ``/api/health`` answers, :meth:`stop` ends it."""

    def __init__(self) -> None:
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.new_database: Path | None = None  # the SQLite file this server creates
        # registered before Prefect's own exit hooks (its workers start with the first
        # flow), so it runs after them: their logs and events reach the server first
        atexit.register(self.stop)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def launch(self) -> None:
        """Start the server process and return at once. Prefect need not be imported yet:
        the process reads the same environment and profile as this one; settings changed
        in this process (``temporary_settings``) are passed on when Prefect is loaded."""
        if importlib.util.find_spec("prefect") is None:
            raise RuntimeError("prefect is not installed; run `make setup`")
        self.port = _free_port()
        if not os.environ.get("PREFECT_API_DATABASE_CONNECTION_URL"):  # the default store
            home = Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()
            if not (home / "prefect.db").exists():
                self.new_database = home / "prefect.db"
        server = [
            sys.executable, "-m", "uvicorn", "--app-dir",
            str(Path(__file__).resolve().parents[1]),  # the folder holding `fedsieve`
            "--factory", "fedsieve.prefect_server:server_app", "--host", "127.0.0.1",
            "--port", str(self.port), "--log-level", "error", "--lifespan", "on",
        ]  # fmt: skip
        if threading.current_thread() is threading.main_thread():
            # the server ends with this process even when it is SIGKILLed (Linux: the
            # kernel's signal follows the starting thread, so only the main thread's)
            server = guarded_command(server)
        self.process = subprocess.Popen(server, env=server_environment())

    def wait_ready(self) -> str:
        """Block until the server answers; its API URL. A server that exits or does not
        answer in time (its own log is on stderr) is a ServiceError: one line, exit 1."""
        from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

        from fedsieve.ops import ServiceError

        if self.process is None:
            self.launch()
        timeout = PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
        deadline = time.monotonic() + timeout
        problem = f"did not answer within {timeout} s"
        relaunches = 0
        while time.monotonic() < deadline:
            assert self.process is not None
            code = self.process.poll()
            if code == _STARTUP_FAILED and relaunches < 2:  # the port may have been taken
                relaunches += 1
                self.launch()
            elif code is not None:
                problem = f"exited with code {code}"
                break
            if self._answers():
                log.info("Starting temporary server on http://127.0.0.1:%d", self.port)
                return self.api_url
            time.sleep(0.05)
        self.stop()
        raise ServiceError(
            f"Prefect's temporary server {problem} (its log is above); check that "
            f"PREFECT_HOME ({os.environ.get('PREFECT_HOME', '~/.prefect')}) is a writable "
            "folder, or set PREFECT_API_URL to a running Prefect server"
        )

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


def server_environment() -> dict[str, str]:
    """The temporary server's environment: this process's, with the settings changed in
    it (``temporary_settings``) once Prefect is loaded, in Prefect's ephemeral mode."""
    in_process: dict[str, str] = {}
    if "prefect.settings" in sys.modules:
        from prefect.settings import get_current_settings

        in_process = get_current_settings().to_environment_variables(exclude_unset=True)
    return {
        **os.environ,
        # what Prefect's SubprocessASGIServer sets (no UI, ephemeral mode) but its
        # PREFECT__SERVER_FINAL=1: with FastAPI >= 0.137 (pyproject: >= 0.139) all that
        # flag still does is a full gc.collect() in create_app, 0.2 s of the server's
        # start-up on 2 cores, with nothing to reclaim
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        **in_process,
    }


def server_app() -> Any:
    """The temporary server's ASGI app (uvicorn's factory): Prefect's own ``create_app``,
    called with the garbage collector paused while the server's modules load (about 1 s
    less CPU of a 5 s start-up on 2 cores) and what they made frozen after it
    (:mod:`fedsieve.startup`), behind :class:`BusyRetried`."""
    with collector_paused(freeze=True):  # the server's own process
        from prefect.server.api.server import create_app

        return BusyRetried(create_app())


UNAVAILABLE = 503


class BusyRetried:
    """ASGI middleware: a request the app answers with 503 is tried again in the server
    after a short pause, before the client sees that answer.

    Prefect's server answers 503 when SQLite refuses a write with "database is locked"
    (its transactions read before they write, so a write committed in between by one of
    its own background services fails at once, whatever the busy timeout), expecting the
    client to try again (PrefectHQ/prefect#13773). The client waits about 2 s before its
    first retry: a ``fedsieve run`` on the temporary server stalled 2 s that way in about
    one run in two, almost always on a task run's creation. The failed attempt's
    transaction was rolled back, so trying it again here is what the client would do,
    only after ``pauses`` (0.88 s in all by default) instead of 2 s; a request still
    refused after the last pause gets its 503, and the client's own retries go on from
    there."""

    def __init__(
        self, app: ASGIApp, pauses: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
    ) -> None:
        self.app = app
        self.pauses = pauses

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan, websockets: as they are
            await self.app(scope, receive, send)
            return
        request: list[Message] = []  # the body, read once, replayed to each attempt
        while not request or request[-1].get("more_body", False):
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return
            request.append(message)
        for pause in self.pauses:
            if not await self._attempt(scope, request, receive, send, last=False):
                return
            await asyncio.sleep(pause)
        await self._attempt(scope, request, receive, send, last=True)

    async def _attempt(
        self, scope: Scope, request: list[Message], receive: Receive, send: Send, *, last: bool
    ) -> bool:
        """Run the request once; True when it was answered 503 and that answer was held
        back (not ``last``), so that it is tried again."""
        replay = iter(request)
        status = 0

        async def replayed() -> Message:
            return next(replay, None) or await receive()

        async def answer(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            if status != UNAVAILABLE or last:
                await send(message)

        try:  # on a copy: routing writes into the scope (a mount's root path, the route)
            await self.app(dict(scope), replayed, answer)
        except Exception:
            # Starlette's error middleware raises the error again after its handler's
            # answer was sent: a held-back 503's error is dropped with it
            if status != UNAVAILABLE or last:
                raise
        return status == UNAVAILABLE and not last


def discard() -> None:
    """Stop the early-started server of a command that stopped on bad input, and remove the
    database it created: a command that never ran leaves nothing behind."""
    server = _early
    stop()
    if server is not None and server.new_database is not None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{server.new_database}{suffix}").unlink(missing_ok=True)


def start_early() -> None:
    """Launch the temporary server (once per process) if a flow here will need one.

    Called before Prefect is imported (1 s), the check is only that ``PREFECT_API_URL``
    is not in the environment; :func:`bind` stops the server again should Prefect's
    profile name a real one."""
    global _early
    if _early is not None:
        return
    needed = (
        uses_temporary_server()
        if "prefect.settings" in sys.modules
        else not os.environ.get("PREFECT_API_URL")
    )
    if needed:
        _early = TemporaryServer()
        _early.launch()


def stop() -> None:
    """Stop the early-started server now (a real server turned out to be configured)."""
    global _early
    if _early is not None:
        _early.stop()
        _early = None


class _NoDeadLinks(logging.Filter):
    """Drops Prefect's "View at <UI URL>" lines: a temporary server serves no UI."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("View at ")


_NO_DEAD_LINKS = _NoDeadLinks()  # one instance: adding it again is a no-op


def bind(flow: F) -> F:
    """``flow`` run against this command's temporary server, once it answers (unchanged
    when a real server is configured). Child processes inherit the server through
    ``PREFECT_API_URL``.

    On a temporary server, flow-run heartbeats are off: they exist so a server can mark
    crashed runs, a temporary server dies with its run, and Prefect 3.8 joins the heartbeat
    thread, which sleeps in 1 s steps, at the end of every flow and subflow (0.5-1 s each).
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    if _early is not None and not uses_temporary_server():  # the profile names a server
        stop()
    updates: dict[Any, Any] = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    if _early is not None:
        updates[PREFECT_API_URL] = os.environ["PREFECT_API_URL"] = _early.wait_ready()
        os.environ[TEMPORARY_MARK] = "1"
    elif os.environ.get(TEMPORARY_MARK) != "1":
        return flow
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logging.getLogger(name).addFilter(_NO_DEAD_LINKS)

    @functools.wraps(flow)
    def run(*args: Any, **kwargs: Any) -> Any:
        from prefect.settings import temporary_settings

        if _early is not None:
            _early.new_database = None  # it holds this run from now on: never discarded
        with temporary_settings(updates):
            return flow(*args, **kwargs)

    return run  # type: ignore[return-value]


@contextlib.contextmanager
def shared() -> Iterator[dict[str, str]]:
    """One temporary server for the block; yields the environment for child processes."""
    if not uses_temporary_server():
        from prefect.settings import PREFECT_API_URL

        yield {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
        return
    server = TemporaryServer()
    try:
        yield {**os.environ, "PREFECT_API_URL": server.wait_ready(), TEMPORARY_MARK: "1"}
    finally:
        server.stop()
