"""The command's own Prefect server: stopped only once everything the command's flows
logged has reached it, so that nothing is left to send to a server that is gone (Prefect
retries such a send with a doubling back-off when the process exits: minutes of a
stopped command that does not end)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from tests.limits import limit
from tests.prefect_homes import made_home

REPO = Path(__file__).resolve().parents[2]
LINES = 12_000  # more than a 5-second flush delivers on a 2-core machine

FLOW = f"""
from prefect import flow, get_run_logger
from fedsieve.local_server import prefect_server

@flow
def noisy():
    log = get_run_logger()
    for i in range({LINES}):
        log.info("line %d %s", i, "x" * 200)

with prefect_server():
    noisy()
"""


def test_every_line_a_flow_logged_reaches_the_server_before_it_stops(tmp_path):
    home = made_home(tmp_path / "prefect-home")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {"PREFECT_HOME": str(home)}

    done = subprocess.run(
        [sys.executable, "-c", FLOW], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=limit(600),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-3000:]
    assert "Error logging to API" not in done.stderr
    with closing(sqlite3.connect(f"file:{home / 'prefect.db'}?mode=ro", uri=True)) as db:
        [(delivered,)] = db.execute("SELECT count(*) FROM log WHERE message LIKE 'line %'")
    assert delivered == LINES
