"""The tracker works through its own process: calls keep their order, reading run_id or
failed waits for them, and a tracking process that dies or cannot be sent a model is a
stated tracking failure, never a hang or a stopped run."""

import subprocess
import sys
import textwrap
import time

import pytest

# How the tracking process starts: spawned (any caller), or forked from the `fedsieve`
# command at its start (the command imports torch first; the child keeps it)
START = {
    "spawned": "",
    "forked": "from fedsieve.tracking import warm_up; warm_up(model=False, fork=True)",
}


@pytest.mark.parametrize("start", START)
def test_calls_made_while_mlflow_is_still_loading_all_land_in_order(tmp_path, start):
    # A fresh interpreter: MLflow is imported by the tracker's thread while this thread
    # goes on logging (importing it on both threads at once used to fail).
    script = textwrap.dedent(
        f"""
        {START[start]}
        from fedsieve.tracking import Tracker, _TrackingProcess

        assert _TrackingProcess.shared().forked == {start == "forked"}
        uri = "sqlite:///{tmp_path / "mlflow.db"}"
        tracker = Tracker("background", uri)
        tracker.start(run_id=None, run_name="r", tags={{"k": "v"}})
        tracker.log_params({{"train.lr": 0.1}})
        for step in range(1, 6):
            tracker.log_metrics({{"test_acc": step / 10}}, step=step)
        run_id = tracker.run_id
        assert tracker.failed is None
        tracker.end()

        from mlflow import MlflowClient

        client = MlflowClient(uri)
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        assert run.data.params == {{"train.lr": "0.1"}}
        assert run.data.tags["k"] == "v"
        history = client.get_metric_history(run_id, "test_acc")
        assert [(m.step, m.value) for m in history] == [(s, s / 10) for s in range(1, 6)]
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize(
    ("raised", "status"),
    [
        (RuntimeError("disk full"), "FAILED"),
        (SystemExit(143), "KILLED"),
        (KeyboardInterrupt(), "KILLED"),
    ],
)
def test_a_run_that_dies_is_closed_as_failed_or_killed_not_left_running(tmp_path, raised, status):
    from mlflow import MlflowClient

    from fedsieve.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker("dies", uri)
    tracker.start(run_id=None, run_name="r", tags={})
    with pytest.raises(type(raised)), tracker.ended_on_failure():
        tracker.log_metrics({"test_acc": 0.5}, step=1)
        raise raised
    tracker.end()  # a second close changes nothing

    client = MlflowClient(uri)
    run = client.get_run(tracker.run_id)
    assert run.info.status == status
    assert run.data.metrics == {"test_acc": 0.5}  # what was asked before the failure landed


def test_a_tracking_process_that_dies_is_stated_once_and_logging_goes_quiet(tmp_path, caplog):
    from fedsieve.tracking import Tracker, _TrackingProcess

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker("dies", uri)
    tracker.start(run_id=None, run_name="r", tags={})
    assert tracker.run_id is not None and tracker.failed is None
    _TrackingProcess.shared()._process.kill()  # e.g. the OOM killer

    with caplog.at_level("WARNING", logger="fedsieve.tracking"):
        for step in range(1, 4):
            tracker.log_metrics({"test_acc": 0.5}, step=step)
        tracker.end()  # returns: nothing waits on a dead process
    assert tracker.failed is not None and "tracking process" in tracker.failed
    stated = [r for r in caplog.records if r.name == "fedsieve.tracking"]
    assert len(stated) == 1 and "training goes on" in stated[0].getMessage()

    fresh = Tracker("after", uri)  # a later run gets a new process
    fresh.start(run_id=None, run_name="r2", tags={})
    fresh.log_metrics({"test_acc": 0.7}, step=1)
    fresh.end()
    assert fresh.failed is None and fresh.run_id != tracker.run_id


def test_a_model_that_cannot_be_sent_is_stated_as_a_failed_model_log(tmp_path, caplog):
    import torch

    from fedsieve.tracking import Tracker

    class Unpicklable(torch.nn.Linear):
        def __init__(self) -> None:
            super().__init__(2, 2)
            self.hook = lambda x: x  # lambdas do not pickle

    tracker = Tracker("unpicklable", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker.start(run_id=None, run_name="r", tags={})
    with caplog.at_level("WARNING", logger="fedsieve.tracking"):
        tracker.log_model(Unpicklable(), input_example=None, registered_name=None)
        tracker.end()
    assert tracker.failed is not None
    [stated] = [r for r in caplog.records if r.name == "fedsieve.tracking"]
    assert "logging the model" in stated.getMessage()


@pytest.mark.parametrize("start", START)
def test_the_tracking_process_ends_when_its_parent_is_killed(tmp_path, start):
    script = textwrap.dedent(
        f"""
        import os, signal
        {START[start]}
        from fedsieve.tracking import Tracker, _TrackingProcess

        tracker = Tracker("orphan", "sqlite:///{tmp_path / "mlflow.db"}")
        tracker.start(run_id=None, run_name="r", tags={{}})
        assert tracker.run_id is not None
        print(_TrackingProcess.shared()._process.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # no exit hook runs
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == -9, done.stderr[-3000:]
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), "the tracking process outlived its parent"


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that is not there counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_forked_tracking_process_holds_nothing_of_its_parent_but_its_pipes(tmp_path):
    # A socket the command had open when it forked is closed in the child: once the
    # parent closes it, nobody listens there (a copy would keep the port taken and accept
    # connections nobody serves).
    script = textwrap.dedent(
        """
        import socket
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        from fedsieve.tracking import Tracker, _TrackingProcess, warm_up

        warm_up(model=False, fork=True)
        assert _TrackingProcess.shared().forked
        listener.close()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            print("still listening")
        except ConnectionRefusedError:
            print("closed")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "closed"


def test_a_process_running_other_threads_spawns_its_tracking_process_instead_of_forking():
    # a fork copies only the calling thread; a lock another thread held would stay held
    import threading

    from fedsieve.tracking import _TrackingProcess

    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        tracking_process = _TrackingProcess(fork=True)
    finally:
        release.set()
        other.join()
    assert not tracking_process.forked
    tracking_process._process.stdin.close()  # its end
    assert tracking_process._process.wait() == 0
