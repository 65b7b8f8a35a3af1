"""Prefect's temporary server: launched at a flow command's start, stopped on a usage
error, left alone when a real server is configured."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from fedsieve import prefect_server


def test_a_configured_server_is_used_and_nothing_is_started():
    url = "http://127.0.0.1:4200/api"
    with temporary_settings({PREFECT_API_URL: url}):
        assert not prefect_server.uses_temporary_server()
        prefect_server.start_early()
        assert prefect_server._early is None

        def flow():
            return 1

        assert prefect_server.bind(flow) is flow  # runs against the configured server
        with prefect_server.shared() as env:
            assert env["PREFECT_API_URL"] == url


def test_without_a_server_url_a_temporary_server_is_needed():
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert prefect_server.uses_temporary_server()


def project_environment(project: Path, medmnist_root: Path, prefect_home: Path) -> dict[str, str]:
    """A project holding the repository's params.yaml, with no PREFECT_API_URL (so the
    command needs a temporary server) and its own MLflow store."""
    repo = Path(__file__).resolve().parents[2]
    shutil.copy(repo / "params.yaml", project / "params.yaml")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return env | {
        "MEDMNIST_ROOT": str(medmnist_root),
        "PREFECT_HOME": str(prefect_home),
        "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
    }


FEDSIEVE = str(Path(sys.executable).parent / "fedsieve")
PREFECT = str(Path(sys.executable).parent / "prefect")


@pytest.fixture(scope="module")
def migrated_prefect_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty Prefect database with every migration applied, made once. A temporary
    server on a fresh PREFECT_HOME first creates its tables (~6 s on a 2-core machine);
    the termination tests, which are about stopping that server, start theirs on a copy
    (:func:`prefect_home`). The tests above keep a fresh PREFECT_HOME."""
    home = tmp_path_factory.mktemp("migrated-prefect-home")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    upgrade = subprocess.run(
        [PREFECT, "server", "database", "upgrade", "-y"],
        env=env | {"PREFECT_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert upgrade.returncode == 0, upgrade.stdout[-3000:] + upgrade.stderr[-3000:]
    return home / "prefect.db"


def prefect_home(project: Path, migrated_db: Path) -> Path:
    """``project/.prefect`` holding a copy of the migrated database: a PREFECT_HOME of
    this test's own (its servers are told apart by it) whose server answers sooner."""
    home = project / ".prefect"
    home.mkdir()
    shutil.copy(migrated_db, home / "prefect.db")
    return home


def fedsieve_in_project(
    project: Path, medmnist_root: Path, prefect_home: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """The ``fedsieve`` command run to its end in such a project."""
    return subprocess.run(
        [FEDSIEVE, *args],
        cwd=project,
        env=project_environment(project, medmnist_root, prefect_home),
        capture_output=True,
        text=True,
        timeout=300,
    )


def servers_for(prefect_home: Path) -> list[int]:
    """Pids of Prefect server processes running on ``prefect_home``'s database."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes()
            environment = (proc / "environ").read_bytes()
        except OSError:
            continue
        if (
            b"fedsieve.prefect_server:server_app" in command
            and f"PREFECT_HOME={prefect_home}".encode() in environment
        ):
            pids.append(int(proc.name))
    return pids


def test_a_stage_starts_its_temporary_server_early_and_only_once(tmp_path, medmnist_root):
    result = fedsieve_in_project(tmp_path, medmnist_root, tmp_path / ".prefect", "partition")

    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert output.count("Starting temporary server") == 1, output[-3000:]
    assert "View at" not in output  # no links to a UI the temporary server does not serve
    assert (tmp_path / "reports" / "partition.json").exists()
    assert not servers_for(tmp_path / ".prefect")  # stopped when the command ended


def test_a_usage_error_stops_the_early_server_and_says_one_line(tmp_path, medmnist_root):
    home = tmp_path / ".prefect"
    result = fedsieve_in_project(tmp_path, medmnist_root, home, "run", "--set", "train.rounds=0")

    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr  # one line
    assert "train.rounds" in result.stderr
    assert "Starting temporary server" not in result.stdout + result.stderr
    assert not servers_for(home)


def test_a_server_that_cannot_start_ends_the_command_with_one_clear_line(tmp_path, medmnist_root):
    not_a_folder = tmp_path / "prefect-home"
    not_a_folder.write_text("")  # the server cannot create its database under a file

    result = fedsieve_in_project(tmp_path, medmnist_root, not_a_folder, "partition")

    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("fedsieve: error: Prefect's temporary server exited"), last
    assert str(not_a_folder) in last and "PREFECT_API_URL" in last
    assert not (tmp_path / "reports" / "partition.json").exists()  # nothing half-ran
    assert not servers_for(not_a_folder)


def started_command(
    project: Path,
    medmnist_root: Path,
    home: Path,
    *args: str,
    trainings: int = 1,
    within: float = 120,
    stderr: int = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """``fedsieve ARGS`` started in ``project`` and returned once ``trainings`` train
    flows are running (each has written its first checkpoint; killed if not ``within``
    seconds), with its temporary server up."""
    command = subprocess.Popen(
        [FEDSIEVE, *args],
        cwd=project,
        env=project_environment(project, medmnist_root, home),
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )
    deadline = time.monotonic() + within
    while len(list(project.glob("**/artifacts/checkpoints"))) < trainings:
        if time.monotonic() > deadline or command.poll() is not None:
            command.kill()
            raise AssertionError(f"the training never reached its first round ({command.poll()})")
        time.sleep(0.2)
    assert servers_for(home), "the command never started its server"
    return command


def training_command(
    project: Path, medmnist_root: Path, home: Path, stderr: int = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    """``fedsieve run`` (200 rounds) in its first rounds."""
    return started_command(
        project, medmnist_root, home, "run", "--set", "train.rounds=200", stderr=stderr
    )


def terminate_and_check_the_server_stops(command: subprocess.Popen[bytes], home: Path) -> None:
    """SIGTERM ``command``: it must exit with 143 within a minute, its server gone."""
    try:
        command.terminate()
        assert command.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        command.kill()
    assert not servers_for(home)


def mlflow_run_statuses(project: Path) -> dict[str, str]:
    """Every run in the project's MLflow store: name -> status."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    return {run.info.run_name: run.info.status for run in client.search_runs(experiments)}


def test_a_terminated_command_stops_its_server_and_closes_its_mlflow_run(
    tmp_path, medmnist_root, migrated_prefect_db
):
    # SIGTERM is how Prefect workers, schedulers and `kill` cancel a run; by default it
    # skips Python's exit hooks, which left the server running with no one to stop it,
    # and the MLflow run showing RUNNING forever.
    home = prefect_home(tmp_path, migrated_prefect_db)
    command = training_command(tmp_path, medmnist_root, home)
    terminate_and_check_the_server_stops(command, home)
    assert list(mlflow_run_statuses(tmp_path).values()) == ["KILLED"]


def test_an_interrupted_command_says_one_line_and_closes_its_run(
    tmp_path, medmnist_root, migrated_prefect_db
):
    home = prefect_home(tmp_path, migrated_prefect_db)
    command = training_command(tmp_path, medmnist_root, home, stderr=subprocess.PIPE)
    try:
        command.send_signal(signal.SIGINT)  # Ctrl-C
        _, stderr = command.communicate(timeout=60)
    finally:
        command.kill()
    assert command.returncode == 130
    assert stderr.decode().strip().splitlines()[-1] == "fedsieve: interrupted"
    assert "Traceback" not in stderr.decode()
    assert not servers_for(home)
    assert list(mlflow_run_statuses(tmp_path).values()) == ["KILLED"]


def test_a_killed_command_takes_its_server_with_it(tmp_path, medmnist_root, migrated_prefect_db):
    # SIGKILL (the OOM killer, `kill -9`, a container's timeout) runs no exit hook at all:
    # the server ends by the kernel's parent-death signal instead.
    home = prefect_home(tmp_path, migrated_prefect_db)
    command = training_command(tmp_path, medmnist_root, home)
    command.kill()
    command.wait(timeout=60)
    deadline = time.monotonic() + 30
    while servers_for(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not servers_for(home)


def test_a_terminated_comparison_stops_its_running_cells_and_closes_every_run(
    tmp_path, medmnist_root, migrated_prefect_db
):
    # A grid's cells train on the task runner's threads, which the runner waits for when
    # the grid is cancelled: each cell trained to its end (here 500 rounds) before exit.
    home = prefect_home(tmp_path, migrated_prefect_db)
    grid = (
        "compare={methods: {fedavg: {}, median: {aggregate: {name: median}}}, "
        "attacks: [{name: none}], fractions: [0.0], seeds: [0], max_parallel: 2}"
    )
    command = started_command(
        tmp_path, medmnist_root, home, "compare", "--set", "train.rounds=500", "--set", grid,
        trainings=2, within=180,  # both cells training
    )  # fmt: skip
    terminate_and_check_the_server_stops(command, home)
    assert mlflow_run_statuses(tmp_path) == {
        "compare-breastmnist": "KILLED",
        "fedavg-none-f0-s0": "KILLED",
        "median-none-f0-s0": "KILLED",
    }


def _sometimes_locked_api(locked_answers: int) -> tuple[Any, list[bytes]]:
    """A FastAPI app with Prefect's own error handler whose POST /api/task_runs/ fails with
    SQLite's "database is locked" the first ``locked_answers`` times, as Prefect's server
    does when a background service wrote in the middle of its transaction; the bodies it
    was given, one per attempt."""
    import sqlite3

    import sqlalchemy.exc
    from fastapi import FastAPI, Request
    from prefect.server.api.server import custom_internal_exception_handler

    bodies: list[bytes] = []
    api = FastAPI(exception_handlers={Exception: custom_internal_exception_handler})
    app = FastAPI()
    app.mount("/api", api)  # as Prefect's API is mounted in its server's app

    @api.post("/task_runs/")
    async def create_task_run(request: Request) -> dict[str, str]:
        bodies.append(await request.body())
        if len(bodies) <= locked_answers:
            raise sqlalchemy.exc.OperationalError(
                "INSERT INTO task_run ...", {}, sqlite3.OperationalError("database is locked")
            )
        return {"created": (await request.json())["name"]}

    return app, bodies


def _post(app: Any, body: bytes) -> Any:
    import asyncio

    import httpx

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            return await client.post("/api/task_runs/", content=body)

    return asyncio.run(post())


def test_a_write_refused_by_a_locked_database_is_tried_again_in_the_server_at_once():
    app, bodies = _sometimes_locked_api(locked_answers=2)
    body = b'{"name": "train-round-3"}'

    started = time.monotonic()
    response = _post(prefect_server.BusyRetried(app), body)

    assert response.status_code == 200
    assert response.json() == {"created": "train-round-3"}
    assert bodies == [body] * 3  # the same request, read once, replayed to each attempt
    assert time.monotonic() - started < 1.5  # not the client's own 2 s back-off


def test_a_write_still_refused_after_the_last_pause_is_answered_503_for_the_client():
    app, bodies = _sometimes_locked_api(locked_answers=100)

    response = _post(prefect_server.BusyRetried(app, pauses=(0.0, 0.01)), b'{"name": "x"}')

    assert response.status_code == 503  # the client's own retries take over from here
    assert len(bodies) == 3


def test_answers_other_than_503_pass_through_untouched():
    app, bodies = _sometimes_locked_api(locked_answers=0)
    response = _post(prefect_server.BusyRetried(app), b"not json")

    assert response.status_code == 500  # a real error is not tried again
    assert len(bodies) == 1


def test_the_server_app_is_built_without_a_full_collection_and_its_imports_frozen(tmp_path):
    # The temporary server's start-up is on the critical path of every flow command: its
    # imports are made with the collector paused, then frozen, and Prefect's full
    # collection for PREFECT__SERVER_FINAL (nothing to reclaim with FastAPI >= 0.137) is
    # not asked for.
    script = (
        "import gc, json\n"
        "from fedsieve.prefect_server import server_app\n"
        "generations = []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start' and "
        "generations.append(info['generation']))\n"
        "server_app()\n"
        "print(json.dumps({'full': generations.count(2), 'frozen': gc.get_freeze_count(), "
        "'collecting': gc.isenabled()}))\n"
    )
    env = prefect_server.server_environment() | {"PREFECT_HOME": str(tmp_path)}

    built = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )

    assert built.returncode == 0, built.stderr[-3000:]
    report = json.loads(built.stdout.strip().splitlines()[-1])
    assert report["full"] == 0
    assert report["frozen"] > 100_000  # Prefect's server modules
    assert report["collecting"]
