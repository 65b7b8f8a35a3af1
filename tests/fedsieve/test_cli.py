"""The ``fedsieve`` command as a user runs it: bad input stops it with one line before
anything runs; its Prefect server lives exactly as long as the command, however the
command ends; a stopped run is closed in MLflow."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from fedsieve.local_server import DELIVERY_SECONDS
from tests.limits import limit
from tests.prefect_homes import made_home

pytestmark = pytest.mark.e2e  # real processes and servers: minutes

REPO = Path(__file__).resolve().parents[2]
FEDSIEVE = str(Path(sys.executable).parent / "fedsieve")


def project_environment(project: Path, medmnist_root: Path, home: Path) -> dict[str, str]:
    """A project holding the repository's params.yaml, with no PREFECT_API_URL (the
    command starts its own server) and its own MLflow store and PREFECT_HOME."""
    shutil.copy(REPO / "params.yaml", project / "params.yaml")
    env = {
        k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")
    }
    return env | {
        "MEDMNIST_ROOT": str(medmnist_root),
        "PREFECT_HOME": str(home),
        "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
    }


def fedsieve(project: Path, medmnist_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``fedsieve ARGS`` run to its end in ``project`` (Prefect's home beside it)."""
    return subprocess.run(
        [FEDSIEVE, *args],
        cwd=project,
        env=project_environment(project, medmnist_root, project.parent / "prefect-home"),
        capture_output=True,
        text=True,
        timeout=limit(600),
    )


def servers_for(home: Path) -> list[int]:
    """Pids of Prefect servers running with ``home`` as their PREFECT_HOME."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes()
            environment = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"server\x00start" in command and f"PREFECT_HOME={home}\x00".encode() in environment:
            pids.append(int(proc.name))
    return pids


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "--set", "train.rounds=-1"], "--set: train.rounds = -1"),
        (["run", "--set", "seed=-3"], "seed = -3"),
        (["run", "--set", "partition.num_clients=600"], "fewer clients"),
        (["run", "--set", "aggregate={name: krum, f: 4}"], "params.yaml with --set aggregate: "),
        (["train", "--set", "aggregate={name: bulyan, f: 2}"], "aggregate (bulyan)"),
        (["run", "--set", "train.min_clients=11"], "every round would be skipped"),
        (["partition", "--set", "compare.seeds=[0, -1]"], "compare.seeds.1"),
        (["train", "--params", "nope.yaml"], "nope.yaml: file not found"),
        # through DVC too, before the Prefect server and before DVC deletes any output
        (["dvc", "exp", "run", "-S", "train.rounds=-1"], "-S: train.rounds = -1"),
        (["dvc", "exp", "run", "-S", "params.yaml:aggregate.name=nope"], "unknown aggregator"),
        (["dvc", "repro", "train", "--set-param", "seed=-3"], "seed = -3"),
        (["dvc", "exp", "run", "-n", "try", "-S", "train.lr=0"], "train.lr = 0"),
    ],
)
def test_bad_input_exits_2_with_one_line_before_anything_runs(
    args, expected, medmnist_root, tmp_path, monkeypatch, capsys
):
    from fedsieve.cli import main

    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEDMNIST_ROOT", str(medmnist_root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")

    code = main(args)

    stderr = capsys.readouterr().err
    assert code == 2, stderr
    assert expected in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # no store, no reports


def test_a_bad_params_file_stops_make_run_before_dvc_deletes_a_report(medmnist_root, tmp_path):
    """`make run` (`fedsieve dvc repro`) with a bad value once left DVC to delete the
    partition stage's committed reports before the stage found the value."""
    project = tmp_path / "project"
    project.mkdir()
    environment = project_environment(project, medmnist_root, tmp_path / "prefect-home")
    text = (project / "params.yaml").read_text().replace("num_clients: 10", "num_clients: -3")
    (project / "params.yaml").write_text(text)
    (project / "reports").mkdir()
    (project / "reports" / "partition.json").write_text("{}")

    result = subprocess.run(
        [FEDSIEVE, "dvc", "repro"], cwd=project, env=environment, capture_output=True, text=True
    )

    assert result.returncode == 2
    assert result.stderr.strip().startswith(
        "fedsieve: error: params.yaml: partition.num_clients = -3"
    )
    assert (project / "reports" / "partition.json").read_text() == "{}"
    assert not (tmp_path / "prefect-home" / "prefect.db").exists()  # no server was started


def test_a_command_with_bad_input_starts_no_server_and_writes_nothing(medmnist_root, tmp_path):
    project = tmp_path / "project"
    project.mkdir()

    result = fedsieve(project, medmnist_root, "run", "--set", "train.rounds=-1")

    assert result.returncode == 2
    assert result.stderr.strip() == (
        "fedsieve: error: --set: train.rounds = -1: must be an integer >= 1"
    )
    assert sorted(p.name for p in project.iterdir()) == ["params.yaml"]
    assert not (tmp_path / "prefect-home" / "prefect.db").exists()


def test_a_corrupt_data_file_is_refused_by_its_md5_before_anything_runs(medmnist_root, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    with np.load(medmnist_root / "breastmnist.npz") as archive:
        arrays = dict(archive)
    arrays["train_labels"] = arrays["train_labels"][::-1].copy()  # same shapes, other bytes
    np.savez(data / "breastmnist.npz", **arrays)

    result = fedsieve(project, data, "run")

    assert result.returncode == 2
    assert "md5" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    # the line names the data file at fault, not params.yaml
    assert f"{data / 'breastmnist.npz'} has md5" in result.stderr
    assert "params.yaml" not in result.stderr
    assert sorted(p.name for p in project.iterdir()) == ["params.yaml"]


def run_where_it_cannot_write(folder: Path) -> int:
    """``fedsieve run`` by a user who cannot write ``folder``: as root (who writes anywhere)
    the call runs as nobody, whom the folder's root ownership refuses; otherwise the
    folder is made read-only first."""
    from fedsieve.cli import main

    if os.geteuid() != 0:
        folder.chmod(0o555)
        return main(["run"])
    os.seteuid(65534)
    try:
        return main(["run"])
    finally:
        os.seteuid(0)


def test_a_results_folder_it_cannot_write_is_refused_with_the_fix_before_anything_runs(
    medmnist_root, tmp_path, monkeypatch, capsys
):
    """A host folder mounted for results as another user's (``docker run -v
    ./reports:/app/reports`` makes it root's): one line naming the folder, its owner and
    the fix, before any server starts or anything is written; no PermissionError. The
    command runs as a user the kernel refuses (root writes anywhere: as root, the test
    takes nobody's uid for the call)."""
    import tempfile

    import config.params
    import tasks.preflight  # noqa: F401 (imported before the call: nobody cannot read /root)

    base = Path(tempfile.mkdtemp(prefix="fedsieve-unwritable-"))  # reachable by any user
    base.chmod(0o755)
    project = base / "project"
    project.mkdir()
    (project / "reports").mkdir()
    shutil.copy(REPO / "params.yaml", project / "params.yaml")
    monkeypatch.chdir(project)
    monkeypatch.setenv("MEDMNIST_ROOT", str(medmnist_root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    assert config.params.load_params  # the modules the command needs, loaded as root
    code = run_where_it_cannot_write(project / "reports")

    stderr = capsys.readouterr().err
    assert code == 2, stderr
    [line] = stderr.strip().splitlines()
    assert line.startswith(f"fedsieve: error: reports/ ({project / 'reports'}) cannot be written")
    assert "docker run --user $(id -u):$(id -g)" in line and "Traceback" not in line
    assert sorted(p.name for p in project.iterdir()) == ["params.yaml", "reports"]
    assert not any((project / "reports").iterdir()) and not (tmp_path / "prefect-home").exists()
    shutil.rmtree(base)


def test_a_data_folder_it_cannot_write_is_named_with_its_owner_not_as_a_failed_download(
    tmp_path, monkeypatch, capsys
):
    """A data folder mounted as another user's (``-v ./data:/app/data`` made root's) with the
    dataset not in it yet: one line naming the folder, its owner and the fix, before any
    download is tried or anything runs; not "the download failed"."""
    import tempfile

    import config.params
    import tasks.preflight  # noqa: F401 (imported before the call: nobody cannot read /root)

    base = Path(tempfile.mkdtemp(prefix="fedsieve-unwritable-data-"))  # reachable by any user
    base.chmod(0o777)  # the project is writable: only the data folder is not
    data = base / "data"
    data.mkdir()
    data.chmod(0o755)
    project = base / "project"
    project.mkdir()
    project.chmod(0o777)
    shutil.copy(REPO / "params.yaml", project / "params.yaml")
    (project / "params.yaml").chmod(0o644)
    monkeypatch.chdir(project)
    monkeypatch.setenv("MEDMNIST_ROOT", str(data))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    assert config.params.load_params
    code = run_where_it_cannot_write(data)

    stderr = capsys.readouterr().err
    assert code == 2, stderr
    [line] = stderr.strip().splitlines()
    assert f"the data folder {data} cannot be written by uid" in line, line
    assert f"{data} belongs to uid {data.stat().st_uid}" in line, line
    assert "download failed" not in line and "Traceback" not in line
    assert list(data.iterdir()) == [] and not (tmp_path / "prefect-home").exists()
    shutil.rmtree(base)


def test_list_names_every_registry_and_an_unknown_command_is_refused(medmnist_root, tmp_path):
    listed = fedsieve(tmp_path, medmnist_root, "list")
    unknown = fedsieve(tmp_path, medmnist_root, "no-such-command")

    assert listed.returncode == 0, listed.stderr
    for title in (
        "datasets:",
        "models:",
        "partition schemes:",
        "aggregators:",
        "filters:",
        "server optimizers:",
        "attacks:",
    ):
        assert title in listed.stdout
    assert "fedavg" in listed.stdout
    assert unknown.returncode == 2 and "invalid choice" in unknown.stderr


def test_a_stage_runs_on_its_own_server_which_stops_with_it(medmnist_root, tmp_path):
    project = tmp_path / "project"
    project.mkdir()

    result = fedsieve(project, medmnist_root, "partition")

    assert result.returncode == 0, result.stderr[-3000:]
    assert (project / "reports" / "partition.json").exists()
    assert (
        "Error logging to API" not in result.stdout + result.stderr
    )  # logs sent before it stopped
    assert not servers_for(tmp_path / "prefect-home")


def test_a_server_that_cannot_start_ends_the_command_with_one_clear_line(medmnist_root, tmp_path):
    not_a_folder = tmp_path / "prefect-home"
    not_a_folder.write_text("")  # the server cannot create its database under a file
    env = project_environment(tmp_path, medmnist_root, not_a_folder)

    result = subprocess.run(
        [FEDSIEVE, "partition"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=limit(300),
    )

    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("fedsieve: error:") and str(not_a_folder) in last
    assert "PREFECT_API_URL" in last
    assert not (tmp_path / "reports").exists()


def training(project: Path) -> bool:
    """``fedsieve run`` has written its first checkpoint."""
    return (project / "artifacts" / "checkpoints" / "train.pt").exists()


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


_STARTED: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _stop_started_commands() -> Iterator[None]:
    """A command a failed test left running is killed by its PID (its server with it)."""
    yield
    while _STARTED:
        command = _STARTED.pop()
        if command.poll() is None:
            command.kill()
            command.wait(timeout=limit(60))


def started_command(
    project: Path, medmnist_root: Path, *args: str, ready: Callable[[Path], bool] = training,
    within: float = 300, stderr: int | None = None, own_group: bool = False,
) -> subprocess.Popen[bytes]:  # fmt: skip
    """``fedsieve ARGS`` started in ``project`` and returned once ``ready(project)`` (killed
    if not ``within`` seconds). Its stderr goes to ``project/stderr.log`` unless ``stderr``
    says otherwise; Python's fault handler is on, so a command that does not end can be
    made to show where each of its threads is (:func:`ended_with`). ``own_group`` starts
    it as a shell starts a foreground job: leading a process group of its own, which a
    terminal's Ctrl-C signals as a whole."""
    with (project / "stderr.log").open("wb") as log:  # the command keeps its own copy
        command = subprocess.Popen(
            [FEDSIEVE, *args],
            cwd=project,
            env=project_environment(project, medmnist_root, made_home(project / ".prefect"))
            | {"PYTHONFAULTHANDLER": "1"},
            stdout=subprocess.DEVNULL,
            stderr=stderr if stderr is not None else log,
            # Ctrl-C as at a terminal: a test runner started in the background (`cmd &` in
            # a script) ignores SIGINT, and its children would inherit that
            preexec_fn=_default_sigint,
            start_new_session=own_group,
        )
    _STARTED.append(command)
    deadline = time.monotonic() + within
    while not ready(project):
        if time.monotonic() > deadline or command.poll() is not None:
            command.kill()
            raise AssertionError(f"the training never reached its first round ({command.poll()})")
        time.sleep(0.2)
    assert servers_for(project / ".prefect"), "the command runs without its server"
    return command


# How long a stopped command may take to end: its cells stop at their next round, its runs
# close, and its queued log lines reach its server before the server stops (at most
# DELIVERY_SECONDS on a server that ingests slowly); beyond that it is stuck.
STOPPING_SECONDS = DELIVERY_SECONDS + 120


def ended_with(
    command: subprocess.Popen[bytes], project: Path, within: float = STOPPING_SECONDS
) -> int:
    """The command's exit code once it ends; if it has not ended ``within`` seconds, it is
    aborted (SIGABRT: the fault handler writes every thread's stack to its stderr) and
    the test fails showing them."""
    try:
        return command.wait(timeout=within)
    except subprocess.TimeoutExpired:
        command.send_signal(signal.SIGABRT)
        command.wait(timeout=limit(60))
        stacks = (project / "stderr.log").read_text(errors="replace")[-12000:]
        raise AssertionError(f"the command had not ended after {within} s:\n{stacks}") from None


def mlflow_run_statuses(project: Path) -> dict[str, str]:
    """Every run in the project's MLflow store: name -> status.

    Read through sqlite, read-only: an ``MlflowClient`` opened while the command is still
    creating the store would run MLflow's schema migration beside the command's own.
    """
    store = project / "mlflow.db"
    if not store.exists():
        return {}
    try:
        with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=limit(10))) as db:
            return dict(db.execute("SELECT name, status FROM runs").fetchall())
    except sqlite3.OperationalError:  # the tables are not created yet
        return {}


def wait_for_no_server(home: Path, seconds: float = 30) -> list[int]:
    deadline = time.monotonic() + seconds
    while servers_for(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    return servers_for(home)


def test_a_terminated_command_stops_its_server_and_closes_its_run_killed(medmnist_root, tmp_path):
    # SIGTERM is how Prefect workers, schedulers and `kill` cancel a run
    command = started_command(tmp_path, medmnist_root, "run", "--set", "train.rounds=500")

    command.terminate()

    assert ended_with(command, tmp_path) == 128 + signal.SIGTERM
    assert not wait_for_no_server(tmp_path / ".prefect")
    assert list(mlflow_run_statuses(tmp_path).values()) == ["KILLED"]
    said_terminated(tmp_path)


def said_terminated(project: Path) -> None:
    """The command's last line says it was terminated, and no traceback came before it."""
    stderr = (project / "stderr.log").read_text(errors="replace")
    assert stderr.strip().splitlines()[-1] == "fedsieve: terminated (SIGTERM)", stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]


def test_an_interrupted_command_says_one_line_and_closes_its_run(medmnist_root, tmp_path):
    command = started_command(
        tmp_path, medmnist_root, "run", "--set", "train.rounds=500", stderr=subprocess.PIPE
    )

    command.send_signal(signal.SIGINT)  # Ctrl-C
    _, stderr = command.communicate(timeout=STOPPING_SECONDS)

    assert command.returncode == 130, stderr.decode()[-3000:]
    assert stderr.decode().strip().splitlines()[-1] == "fedsieve: interrupted"
    assert "Traceback" not in stderr.decode()
    assert not wait_for_no_server(tmp_path / ".prefect")
    assert list(mlflow_run_statuses(tmp_path).values()) == ["KILLED"]


def flow_run_states(home: Path) -> dict[str, list[str]]:
    """The states of the flow runs in the Prefect database under ``home`` (read-only):
    ``{"top": [...], "nested": [...]}``."""
    query = "SELECT parent_task_run_id IS NULL, state_type FROM flow_run"
    with closing(sqlite3.connect(f"file:{home / 'prefect.db'}?mode=ro", uri=True)) as db:
        rows = db.execute(query).fetchall()
    return {
        "top": [state for is_top, state in rows if is_top],
        "nested": [state for is_top, state in rows if not is_top],
    }


def test_ctrl_c_at_a_terminal_ends_the_command_its_run_and_its_flow_run_at_once(
    medmnist_root, tmp_path
):
    # a terminal's Ctrl-C reaches the whole foreground process group, as does
    # `kill -- -PGID` or a supervisor stopping a job: the command's server must not be
    # stopped under it before the command has reported its flow run's end
    command = started_command(
        tmp_path, medmnist_root, "run", "--set", "train.rounds=500", own_group=True
    )

    os.killpg(command.pid, signal.SIGINT)

    assert ended_with(command, tmp_path) == 130
    stderr = (tmp_path / "stderr.log").read_text(errors="replace")
    assert stderr.strip().splitlines()[-1] == "fedsieve: interrupted", stderr[-3000:]
    assert "Error logging to API" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert not wait_for_no_server(tmp_path / ".prefect")
    assert list(mlflow_run_statuses(tmp_path).values()) == ["KILLED"]
    states = flow_run_states(tmp_path / ".prefect")
    assert states["top"] == ["CRASHED"] and "RUNNING" not in states["nested"], states


def test_a_killed_command_takes_its_server_with_it(medmnist_root, tmp_path):
    # SIGKILL (the OOM killer, `kill -9`) runs no exit hook: the kernel stops the server
    command = started_command(tmp_path, medmnist_root, "run", "--set", "train.rounds=500")

    command.kill()
    command.wait(timeout=limit(60))

    assert not wait_for_no_server(tmp_path / ".prefect")


def test_a_terminated_comparison_stops_its_running_cells_and_closes_every_run(
    medmnist_root, tmp_path
):
    grid = (
        "compare={methods: {fedavg: {}, median: {aggregate: {name: median}}}, "
        "attacks: [{name: none}], fractions: [0.0], seeds: [0], max_parallel: 2}"
    )

    def both_cells_running(project: Path) -> bool:
        return len(mlflow_run_statuses(project)) == 3

    command = started_command(
        tmp_path, medmnist_root, "compare", "--set", "train.rounds=500", "--set", grid,
        ready=both_cells_running,
    )  # fmt: skip

    command.terminate()

    assert ended_with(command, tmp_path) == 128 + signal.SIGTERM
    assert not wait_for_no_server(tmp_path / ".prefect")
    assert mlflow_run_statuses(tmp_path) == {
        "compare-breastmnist": "KILLED",
        "fedavg-none-f0-s0": "KILLED",
        "median-none-f0-s0": "KILLED",
    }
    said_terminated(tmp_path)


def test_what_cannot_take_volumes_is_refused_in_one_line_before_anything_runs(
    medmnist_root, tmp_path
):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "params.yaml", project / "params.yaml")
    volumes = ["--set", "data.dataset=adrenalmnist3d", "--set", "data.size=64"]
    small_3d = [*volumes, "--set", "model.name=small_cnn3d"]

    flat_model = fedsieve(project, medmnist_root, "run", *volumes)
    volumes_as_png = fedsieve(project, medmnist_root, "sites", *small_3d, "--format", "png")
    images_as_nifti = fedsieve(project, medmnist_root, "sites", "--format", "nifti")

    for result, says in [
        (flat_model, "model.name = small_cnn does not take adrenalmnist3d, a 3-D set of "
         "volumes (C, D, H, W); allowed: resnet18_3d, resnet50_3d, small_cnn3d"),
        (volumes_as_png, "fedsieve sites: --format png does not fit data.dataset adrenalmnist3d, "
         "which holds volumes; allowed: npz, nifti, series, multiframe, volumes"),
        (images_as_nifti, "fedsieve sites: --format nifti does not fit data.dataset breastmnist, "
         "which holds 2-D images; allowed: npz, png, dcm"),
    ]:  # fmt: skip
        assert result.returncode == 2 and says in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in project.iterdir()) == ["params.yaml"]  # nothing ran
