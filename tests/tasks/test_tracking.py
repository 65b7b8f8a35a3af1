"""The Tracker: MLflow through its public client, guarded so tracking never stops a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
from mlflow import MlflowClient

from config.errors import ServiceError
from federated.data import dataset_info
from tasks.tracking import Tracker, flatten_params, unsignalled
from tasks.training import halt_if_tracking_lost
from tests.limits import limit

REPO = Path(__file__).resolve().parents[2]


def signalled_then_failed() -> Exception:
    """An error raised while a SIGTERM was being handled (Prefect reporting the crash to
    a server that does not answer): the run was still stopped, not failed."""
    try:
        try:
            raise SystemExit(143)
        except SystemExit:
            raise ConnectionError("server gone") from None
    except ConnectionError as error:
        return error


@pytest.mark.parametrize(
    ("raised", "status"),
    [
        (RuntimeError("disk full"), "FAILED"),
        (SystemExit(143), "KILLED"),
        (KeyboardInterrupt(), "KILLED"),
        (signalled_then_failed(), "KILLED"),
    ],
)
def test_a_run_that_dies_is_closed_as_failed_or_killed_not_left_running(tmp_path, raised, status):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker("dies", uri)
    tracker.start(run_id=None, run_name="r", tags={})

    with pytest.raises(type(raised)), tracker.ended_on_failure():
        tracker.log_metrics({"test_acc": 0.5}, step=1)
        raise raised
    tracker.end()  # a second close changes nothing

    run = MlflowClient(uri).get_run(tracker.run_id)
    assert run.info.status == status
    assert run.data.metrics == {"test_acc": 0.5}


def test_a_stop_during_a_store_call_reaches_the_caller_and_the_call_still_ends():
    """Python runs signal handlers on the main thread only: the store call runs on a thread
    of its own, so Ctrl-C interrupts the wait for it, not SQLAlchemy's code (which, cut
    short, left a cursor holding SQLite's lock), and the next call (the close) follows
    the interrupted one."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    stopped, done = threading.Event(), []

    def write() -> None:
        # Ctrl-C halfway through the write, to the main thread as a terminal's reaches it
        # (raise_signal here would go to this thread and leave the main thread's wait alone)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        assert stopped.wait(60), "the stop did not interrupt the wait for the write"
        done.append("write")

    try:
        with pytest.raises(KeyboardInterrupt):
            unsignalled(write, one_at_a_time := threading.Lock())
        stopped.set()
        done.append(unsignalled(lambda: "close", one_at_a_time))
    finally:
        signal.signal(signal.SIGINT, previous)

    assert done == ["write", "close"]


# Run in a process of its own: an exception raised by a signal handler can land anywhere,
# also between a lock's acquire and its release (logging's module lock), and would leave
# the test runner's process wedged for the tests after it. benchmarks/sites/signal_in_write.py
# runs this loop 1,000 times.
INTERRUPTED_WRITES = """
import itertools, json, random, signal, sys, time
from mlflow import MlflowClient
from tasks.tracking import Tracker

STOPS = (KeyboardInterrupt, lambda: SystemExit(143))  # Ctrl-C; the fedsieve SIGTERM handler

def interrupt(signum, frame):
    raise STOPS[trial % 2]()

uri = sys.argv[1]
delays = random.Random(0)
signal.signal(signal.SIGALRM, interrupt)
statuses = []
for trial in range(20):
    tracker = Tracker("interrupted", uri)
    tracker.start(run_id=None, run_name="r", tags={})
    delay = delays.uniform(0.02, 0.3)
    signal.setitimer(signal.ITIMER_REAL, delay)
    give_up = time.monotonic() + delay + 5
    try:
        with tracker.ended_on_failure():
            for step in itertools.count():
                tracker.log_metrics({"test_acc": 0.5, "test_auc": 0.5}, step=step)
                if time.monotonic() > give_up:  # the signal landed in a finalizer,
                    raise KeyboardInterrupt  # which swallows what it raises
    except (KeyboardInterrupt, SystemExit):
        pass
    statuses.append(MlflowClient(uri).get_run(tracker.run_id).info.status)
print(json.dumps(statuses))
"""


def test_a_run_stopped_halfway_through_a_write_to_sqlite_is_still_closed_killed(tmp_path):
    """Ctrl-C or a worker's SIGTERM lands at any moment, also inside a metric's write; the
    run must still end KILLED, not stay RUNNING behind the lock of a read the stop cut
    short (its close failed with "database is locked" now and then)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    result = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_WRITES, uri],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=limit(600),
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == ["KILLED"] * 20


def test_a_run_is_resumed_by_its_id_and_reopened(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = Tracker("resume", uri)
    first.start(run_id=None, run_name="r", tags={"seed": "0"})
    first.log_metrics({"test_acc": 0.5}, step=1)
    first.end("KILLED")

    again = Tracker("resume", uri)
    again.start(run_id=first.run_id, run_name="ignored", tags={})
    again.log_metrics({"test_acc": 0.6}, step=2)
    again.end()

    client = MlflowClient(uri)
    assert again.run_id == first.run_id
    assert client.get_run(first.run_id).info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(first.run_id, "test_acc")] == [0.5, 0.6]


def test_a_resumed_run_is_given_the_rounds_its_tracking_lost(tmp_path):
    # rounds 3 and 4 trained and checkpointed while the store was away: the resume logs
    # them from the checkpoint's history, and nothing twice
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    history = [
        {"round": r, "clients_sampled": 10.0, "test_acc": 0.5 + r / 100} for r in (1, 2, 3, 4)
    ]
    first = Tracker("lost", uri)
    first.start(run_id=None, run_name="r", tags={})
    for row in history[:2]:
        first.log_metrics({k: v for k, v in row.items() if k != "round"}, step=row["round"])
    first.end("KILLED")

    again = Tracker("lost", uri)
    again.start(run_id=first.run_id, run_name="r", tags={})
    backfilled = again.log_missing_rounds(history)

    client = MlflowClient(uri)
    assert backfilled == [3, 4]
    assert [m.step for m in client.get_metric_history(first.run_id, "test_acc")] == [1, 2, 3, 4]
    assert again.log_missing_rounds(history) == []  # all there now


def test_tracking_lost_midway_recovers_its_rounds_when_the_store_answers_again(tmp_path):
    # the store goes away after round 1 (the tracker fails and goes quiet), rounds 2-3 train
    # on; at the end the store is back: the lost rounds are logged from the history
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    history = [{"round": r, "clients_sampled": 10.0, "test_acc": r / 10} for r in (1, 2, 3)]
    tracker = Tracker("outage", uri)
    tracker.start(run_id=None, run_name="r", tags={})
    tracker.log_metrics({"clients_sampled": 10.0, "test_acc": 0.1}, step=1)
    away = db.rename(tmp_path / "away.db")
    db.mkdir()  # what answers at the store's path now cannot be opened
    tracker.log_metrics({"clients_sampled": 10.0, "test_acc": 0.2}, step=2)
    assert tracker.failed is not None

    assert not tracker.recovered(history)  # still away: the run must not end as if tracked
    state = SimpleNamespace(history=history)
    with pytest.raises(ServiceError, match="run again with --resume once the tracking server"):
        halt_if_tracking_lost(tracker, state)
    db.rmdir()
    away.rename(db)
    assert tracker.recovered(history) and tracker.failed is None
    halt_if_tracking_lost(tracker, state)  # tracked in full: the run may end

    steps = [m.step for m in MlflowClient(uri).get_metric_history(tracker.run_id, "test_acc")]
    assert steps == [1, 2, 3]


def test_params_metrics_tables_and_nan_are_logged_as_mlflow_shows_them(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker("logs", uri)
    tracker.start(run_id=None, run_name="r", tags={"dataset": "breastmnist"})
    params = {f"p{i}": i for i in range(150)}  # more than one MLflow batch
    tracker.log_params(params)
    tracker.log_metrics({"test_auc": float("nan"), "test_acc": 0.75}, step=3)
    tracker.log_table([{"client": 0, "excluded": False}], "exclusions.json")
    tracker.end()

    run = MlflowClient(uri).get_run(tracker.run_id)
    assert run.data.params == {k: str(v) for k, v in params.items()}
    assert run.data.metrics == {"test_acc": 0.75}  # NaN is not logged
    assert run.data.tags["dataset"] == "breastmnist"
    assert "exclusions.json" in [a.path for a in MlflowClient(uri).list_artifacts(tracker.run_id)]


def test_a_model_that_cannot_be_logged_is_stated_once_and_tracking_goes_quiet(tmp_path, caplog):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker("unloggable", uri)
    tracker.start(run_id=None, run_name="r", tags={})
    with caplog.at_level("WARNING", logger="fedsieve.tracking"):
        gone = tmp_path / "classifier-deleted-meanwhile"
        tracker.log_model(gone, dataset_info("breastmnist"), registered_name=None)
        tracker.log_metrics({"after": 1.0})
    tracker.end()

    assert tracker.failed is not None
    [stated] = [r for r in caplog.records if r.name == "fedsieve.tracking"]
    assert "logging the model" in stated.getMessage()
    assert "training goes on" in stated.getMessage()
    assert "after" not in MlflowClient(uri).get_run(tracker.run_id).data.metrics


def classifier_folder(path):
    """A small registered-model folder (logistic regression on BreastMNIST's schema)."""
    from federated.inference import save_classifier
    from models import build_model

    model = build_model("logreg", in_channels=1, num_classes=2, image_size=28)
    return save_classifier(path, model, "logreg", dataset_info("breastmnist"))


def test_logging_a_model_leaves_the_process_environment_as_it_was(tmp_path, monkeypatch):
    """MLflow's fluent API writes MLFLOW_TRACKING_URI into os.environ; a run that logged its
    model must not hand its store to every child process started after it (a later run's
    ``flwr``, a DVC stage), which would then log into the wrong store."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker("environment", uri)
    tracker.start(run_id=None, run_name="r", tags={})
    info = dataset_info("breastmnist")
    tracker.log_model(classifier_folder(tmp_path / "classifier"), info, registered_name="env")
    tracker.end()

    assert tracker.failed is None
    assert "MLFLOW_TRACKING_URI" not in os.environ
    # nor is MLflow's own default left pinned to this run's store: it follows the variable
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'next.db'}")
    assert mlflow.get_tracking_uri() == f"sqlite:///{tmp_path / 'next.db'}"
    assert MlflowClient(uri).get_registered_model("env").latest_versions


def test_a_store_that_failed_is_not_tried_again_by_later_trackers(tmp_path, caplog):
    uri = f"sqlite:///{tmp_path / 'not-a-folder' / 'x' / 'mlflow.db'}"
    (tmp_path / "not-a-folder").write_text("")  # the store cannot be created under a file

    with caplog.at_level("WARNING", logger="fedsieve.tracking"):
        first = Tracker("broken", uri)
        first.start(run_id=None, run_name="r", tags={})
        second = Tracker("broken", uri)
        second.start(run_id=None, run_name="r", tags={})

    assert first.failed is not None and second.failed == first.failed
    assert len([r for r in caplog.records if r.name == "fedsieve.tracking"]) == 1


def test_params_are_flattened_to_dotted_keys():
    tree = {"train": {"lr": 0.1}, "filters": [{"name": "pid_made"}], "empty": [], "seed": 0}

    assert flatten_params(tree) == {
        "train.lr": 0.1,
        "filters.0.name": "pid_made",
        "empty": "[]",
        "seed": 0,
    }


def test_a_sqlite_store_keeps_its_artifacts_beside_the_database(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory's ./mlruns
    store = tmp_path / "volume"
    uri = f"sqlite:///{store / 'mlflow.db'}"
    store.mkdir()
    tracker = Tracker("beside", uri)
    tracker.start(run_id=None, run_name="r", tags={})
    tracker.log_table([{"client": 0}], "exclusions.json")
    tracker.end()

    assert list(store.glob("mlruns/*/artifacts/exclusions.json"))
    assert not (tmp_path / "mlruns").exists()
