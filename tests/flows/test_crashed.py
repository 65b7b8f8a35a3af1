"""A run whose process died (SIGKILL: a worker's container killed, its machine lost) is
closed on the record: the server's automations mark it Crashed once its heartbeats stop
and run ``close-crashed-run``, which marks its subflow runs Crashed and closes its MLflow
runs KILLED. Against a real Prefect server; the automations' firing end to end is in
``make container-faults`` (docs/operations.md)."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from flows.automations import CLOSE_DEPLOYMENT, PIPELINE_FLOWS, ZOMBIE_MESSAGE, install
from tests.limits import limit

pytestmark = pytest.mark.e2e  # real processes and servers

REPO = Path(__file__).resolve().parents[2]


def test_the_automations_are_prefects_zombie_trigger_and_the_closing_run(prefect_server):
    from prefect.automations import Automation
    from prefect.client.orchestration import get_client
    from prefect.events.schemas.automations import Posture

    with get_client(sync_client=True) as client:
        flow_name, deployment_name = CLOSE_DEPLOYMENT.split("/")
        flow_id = client.create_flow_from_name(flow_name)
        deployment_id = client.create_deployment(
            flow_id=flow_id, name=deployment_name, entrypoint="flows/crashed.py:close_crashed_run"
        )
    install(heartbeat_s=30)
    zombie, close = install(heartbeat_s=30)  # installed again: replaced, not doubled

    assert zombie.trigger.posture == Posture.Proactive
    assert zombie.trigger.after == {"prefect.flow-run.heartbeat"}
    assert zombie.trigger.expect == {"prefect.flow-run.*"}
    assert zombie.trigger.within.total_seconds() == 180  # six missed heartbeats
    # the pipeline's runs only: a subflow is closed with its parent, not on its own
    assert zombie.trigger.match_related["prefect.resource.name"] == PIPELINE_FLOWS
    crash, closing = zombie.actions  # the zombie's run is closed without its Crashed event
    assert crash.type == "change-flow-run-state" and crash.state.value == "CRASHED"
    assert closing.type == "run-deployment" and closing.deployment_id == deployment_id
    assert closing.parameters == {"flow_run": "{{ event.resource.id }}"}
    assert close.trigger.expect == {"prefect.flow-run.Crashed"}
    assert close.trigger.match_related["prefect.resource.name"] == PIPELINE_FLOWS
    [run] = close.actions
    assert run.type == "run-deployment" and run.deployment_id == deployment_id
    assert run.parameters == {"flow_run": "{{ event.resource.id }}"}
    with get_client(sync_client=True) as client:
        on_server = [a.name for a in client.read_automations()]
    assert [on_server.count(a.name) for a in (zombie, close)] == [1, 1]
    assert Automation.read(id=close.id).actions[0].deployment_id == deployment_id


def test_each_crash_gets_one_closing_run_whichever_automation_saw_it(prefect_server):
    """A run the zombie automation crashed (its state's message) and closes itself starts no
    second closing run with its Crashed event; a crash a worker reported starts one."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.states import Crashed, Running

    @flow(name=PIPELINE_FLOWS[-1])
    def pipeline() -> None:
        """Stands in for the pipeline: only its name is read."""

    with get_client(sync_client=True) as client:
        flow_name, deployment_name = CLOSE_DEPLOYMENT.split("/")
        deployment_id = client.create_deployment(
            flow_id=client.create_flow_from_name(flow_name), name=deployment_name,
            entrypoint="flows/crashed.py:close_crashed_run",
        )  # fmt: skip
    install(heartbeat_s=30)
    crashed_by = {
        "zombie": ZOMBIE_MESSAGE,
        "worker": "Flow run infrastructure exited with non-zero status code -9.",
    }
    with get_client(sync_client=True) as client:
        runs = {}
        for who, message in crashed_by.items():  # the zombie's crash first
            run = client.create_flow_run(flow=pipeline, name=f"crashed-by-{who}")
            client.set_flow_run_state(run.id, Running(), force=True)
            client.set_flow_run_state(run.id, Crashed(message=message), force=True)
            runs[f"prefect.flow-run.{run.id}"] = who

        def closed() -> list[str]:
            closing = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
            )
            return sorted(
                runs[r.parameters["flow_run"]] for r in closing if r.parameters["flow_run"] in runs
            )

        deadline = time.monotonic() + limit(90)
        while "worker" not in closed():
            assert time.monotonic() < deadline, "no closing run for the worker's crash"
            time.sleep(1)
        time.sleep(5)  # the zombie's Crashed event came first: its closing run would be in
        assert closed() == ["worker"]


def test_a_killed_runs_subflows_and_mlflow_run_are_closed(
    prefect_server, medmnist_root, tmp_path, monkeypatch
):
    """``fedsieve run`` SIGKILLed mid-training, marked Crashed as the zombie automation
    marks it; ``close-crashed-run`` with the automation's parameter (the event's resource
    id) closes the rest, and a ``--resume`` would continue from the checkpoint."""
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    from flows.crashed import close_crashed_run

    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = os.environ | {
        "PREFECT_API_URL": prefect_server, "MEDMNIST_ROOT": str(medmnist_root),
        "MLFLOW_TRACKING_URI": tracking,
    }  # fmt: skip
    command = [sys.executable, "-m", "fedsieve.cli", "run", "--set", "train.rounds=500"]
    checkpoint = tmp_path / "artifacts" / "checkpoints" / "train.pt"
    with (tmp_path / "train.log").open("wb") as log:
        train = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + limit(300)
        while not checkpoint.exists():
            assert train.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint after 300 s"
            time.sleep(0.5)
    finally:
        os.killpg(train.pid, signal.SIGKILL)  # no exit hook runs
        train.wait()

    with closing(sqlite3.connect(tmp_path / "mlflow.db")) as db:
        [(run_id, root, status)] = db.execute(
            "select r.run_uuid, t.value, r.status from runs r join tags t on t.run_uuid = r.run_uuid"
            " where t.key = 'prefect_flow_run_id'"
        ).fetchall()
    assert status == "RUNNING"  # what a dead process leaves
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(root, Crashed(message="missing heartbeats"), force=True)

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)  # as on the worker that runs it
    closed = close_crashed_run(f"prefect.flow-run.{root}")

    assert closed["mlflow_runs"] == [run_id]
    assert MlflowClient(tracking).get_run(run_id).info.status == "KILLED"
    assert closed["subflow_runs"], "the train stage's subflow died with its parent"
    with get_client(sync_client=True) as client:
        states = [
            client.read_flow_run(flow_run).state_type.value for flow_run in closed["subflow_runs"]
        ]
    assert set(states) == {"CRASHED"}
    assert close_crashed_run(root) == {"flow_run": root, "subflow_runs": [], "mlflow_runs": []}
    assert checkpoint.exists()  # what --resume continues from


def test_a_crash_is_closed_once_when_a_second_closing_run_comes_for_it(
    prefect_server, tmp_path, monkeypatch
):
    """A crash with two closing runs (the automation's and one started by hand): the first
    closes it, the second finds the first and closes nothing; a closing run for another
    crash is not deferred, nor is one whose earlier run failed."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow
    from prefect.states import Crashed, Failed

    from flows.crashed import DEFERRED, close_crashed_run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    with get_client(sync_client=True) as client:
        closing_deployment = client.create_deployment(
            flow_id=client.create_flow_from_name("close-crashed-run"),
            name="closed-once",
            entrypoint="flows/crashed.py:close_crashed_run",
        )
        crashes = []
        for _ in range(2):  # two runs that died (any flow's run will do: nothing of it is read)
            dead = client.create_flow_run(flow=close_crashed_run, name="a-dead-pipeline-run")
            client.set_flow_run_state(dead.id, Crashed(message="missing heartbeats"), force=True)
            crashes.append(str(dead.id))

        def closing(crash: str):
            return client.create_flow_run_from_deployment(
                closing_deployment, parameters={"flow_run": f"prefect.flow-run.{crash}"}
            )

        first, second, other = closing(crashes[0]), closing(crashes[0]), closing(crashes[1])

    def run(closing_run):
        return run_flow(close_crashed_run, flow_run=closing_run, parameters=closing_run.parameters)

    assert run(second) == {"flow_run": crashes[0], "closed_by": str(first.id)}
    with get_client(sync_client=True) as client:
        assert DEFERRED in client.read_flow_run(second.id).tags  # it closed nothing
    assert run(first) == {"flow_run": crashes[0], "subflow_runs": [], "mlflow_runs": []}
    assert run(other) == {"flow_run": crashes[1], "subflow_runs": [], "mlflow_runs": []}
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(first.id, Failed(message="its store was away"), force=True)
        again = client.create_flow_run_from_deployment(
            closing_deployment, parameters={"flow_run": crashes[0]}
        )
    assert run(again) == {"flow_run": crashes[0], "subflow_runs": [], "mlflow_runs": []}
