"""Prefect homes for the tests whose commands start their own Prefect server.

A server's first start in a new ``PREFECT_HOME`` creates its database: Prefect's
migrations, about 7 CPU-seconds here, which every such test would pay again. Each pytest
worker makes one database, once, with Prefect's own command (``prefect server database
upgrade``), and such a test's home starts from a copy of it, as a user's home does on
every command after the first. The first start in a new home keeps tests of its own:
``make run`` in a fresh clone (tests/flows/test_pipeline.py), the session's Prefect
server (tests/conftest.py), and the commands given bad input, which must leave no
database behind (tests/fedsieve/test_cli.py).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.limits import limit

_folder: list[Path] = []  # where this worker's database is made (tests/conftest.py sets it)


def make_under(folder: Path) -> None:
    """Make this worker's database in ``folder`` when a test first needs it."""
    _folder[:] = [folder]


@functools.cache
def _made_database() -> Path:
    [folder] = _folder
    upgrade = [str(Path(sys.executable).with_name("prefect")), "server", "database", "upgrade"]
    done = subprocess.run(
        [*upgrade, "-y"], env=os.environ | {"PREFECT_HOME": str(folder)},
        capture_output=True, text=True, timeout=limit(600),
    )  # fmt: skip
    assert done.returncode == 0, f"the tests' Prefect database was not made: {done.stderr[-3000:]}"
    return folder / "prefect.db"


def made_home(home: Path) -> Path:
    """``home``, created if missing, with a copy of this worker's made database unless it
    holds a database already (a later command in the same project keeps its flow runs)."""
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "prefect.db").exists():
        shutil.copyfile(_made_database(), home / "prefect.db")
    return home
