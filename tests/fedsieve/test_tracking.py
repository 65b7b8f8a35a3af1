"""The tracker works on its own thread: calls keep their order, and reading run_id or
failed waits for them."""

import subprocess
import sys
import textwrap

import pytest


def test_calls_made_while_mlflow_is_still_loading_all_land_in_order(tmp_path):
    # A fresh interpreter: MLflow is imported by the tracker's thread while this thread
    # goes on logging (importing it on both threads at once used to fail).
    script = textwrap.dedent(
        f"""
        from fedsieve.tracking import Tracker

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
