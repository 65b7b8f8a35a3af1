"""Prefect's temporary local server: started early, or shared by several processes.

With no ``PREFECT_API_URL``, Prefect starts a temporary server (a uvicorn subprocess on the
SQLite database under PREFECT_HOME) at a process's first API call: 6-10 s on a 2-core
machine, paid after torch, MLflow and the data have loaded, and paid again by every DVC
stage. Two ways to pay less, both running Prefect's own server class:

- :func:`start_early` starts that server in a background thread at the top of the CLI, so
  its start-up overlaps the imports and the data loading; :func:`wait_until_ready` joins it
  before the first flow runs.
- :func:`shared` runs one server for a block and hands its URL to child processes through
  ``PREFECT_API_URL`` (``fedsieve dvc repro``: one server for every stage).

Both do nothing when ``PREFECT_API_URL`` is set: a real server is already there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator

__all__ = ["shared", "start_early", "uses_temporary_server", "wait_until_ready"]

log = logging.getLogger(__name__)
_early: threading.Thread | None = None


def uses_temporary_server() -> bool:
    """True when a flow run here would start Prefect's temporary server."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    return not PREFECT_API_URL.value() and bool(PREFECT_SERVER_EPHEMERAL_ENABLED.value())


def _start_temporary_server() -> None:
    from prefect.server.api.server import SubprocessASGIServer

    try:
        SubprocessASGIServer().start()
    except Exception as error:  # Prefect tries again itself at the first API call
        log.debug("early start of Prefect's temporary server failed: %s", error)


def start_early() -> None:
    """Start the temporary server in the background (once per process) if one is needed."""
    global _early
    if _early is None and uses_temporary_server():
        _early = threading.Thread(
            target=_start_temporary_server, name="prefect-temporary-server", daemon=True
        )
        _early.start()


def wait_until_ready() -> None:
    """Block until an early start has finished: Prefect treats a server that is still
    starting as running, so no flow may begin before this returns."""
    if _early is not None:
        _early.join()


@contextlib.contextmanager
def shared() -> Iterator[dict[str, str]]:
    """One temporary server for the block; yields the environment for child processes."""
    if not uses_temporary_server():
        from prefect.settings import PREFECT_API_URL

        yield {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start()
    try:
        yield {**os.environ, "PREFECT_API_URL": server.api_url}
    finally:
        server.stop()
