"""Prefect as the distributed engine, for real on loopback: a `prefect server start` of the
test's own, `fedsieve serve --cron` creating scheduled runs, and a process worker pulling
the prefect.yaml deployment and running the pipeline into a throw-away MLflow store."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mlflow import MlflowClient

from config.params import load_params
from fedsieve import ops as fedsieve_ops
from fedsieve.cli import main
from tests.limits import limit, poll
from tests.prefect_homes import made_home

TINY = [  # three rounds: the first model that passes the registration gate (federated/gate.py)
    "partition.num_clients=3",
    "train.rounds=3",
    "train.local_epochs=1",
    "train.device=cpu",
    "eval.target_acc=0.5",
]


@pytest.fixture(scope="module")
def prefect_api(ops, processes, tmp_path_factory) -> Iterator[dict[str, str]]:
    """A `prefect server start` on a free loopback port; yields the clients' environment."""
    server_home = tmp_path_factory.mktemp("prefect-server-home")
    port = ops.free_port()
    server = processes.start(
        [
            str(ops.bin / "prefect"),
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-ui",
        ],
        name="prefect-server",
        env=ops.base_env(PREFECT_HOME=str(made_home(server_home))),
        cwd=server_home,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        ops.wait_http(f"{url}/health", timeout=limit(600), process=server)
    except (RuntimeError, TimeoutError):
        pytest.fail(f"Prefect server did not start:\n{processes.log('prefect-server')[-3000:]}")
    yield ops.base_env(
        PREFECT_API_URL=url, PREFECT_HOME=str(tmp_path_factory.mktemp("prefect-client-home"))
    )
    processes.stop(server)


def api(env: dict[str, str], method: str, path: str, body: Any = None) -> Any:
    response = httpx.request(
        method, f"{env['PREFECT_API_URL']}{path}", json=body, timeout=limit(30)
    )
    response.raise_for_status()
    return response.json()


# -- bad input: one line, exit code 2, nothing served ----------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cron", "nope"], "--cron 'nope': not a cron expression"),
        (["--cron", "61 * * * *"], "not a cron expression"),
        (["--cron", "* * * * *", "--set", "train.rounds=0"], "train.rounds = 0"),
        (["--cron", "* * * * *", "--name", "a/b"], "--name 'a/b'"),
    ],
)
def test_serve_refuses_bad_input_with_one_line(project, capsys, argv, message):
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_serve_needs_a_reachable_prefect_server(ops):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with (
        temporary_settings(restore_defaults={PREFECT_API_URL}),
        pytest.raises(fedsieve_ops.ServiceError, match="needs a running Prefect server"),
    ):
        fedsieve_ops._prefect_api()
    closed = f"http://127.0.0.1:{ops.free_port()}/api"
    with (
        temporary_settings(updates={PREFECT_API_URL: closed}),
        pytest.raises(fedsieve_ops.ServiceError, match="not reachable"),
    ):
        fedsieve_ops._prefect_api()


def test_a_grid_for_workers_needs_its_deployment_on_a_running_server(prefect_api):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with (
        temporary_settings(updates={PREFECT_API_URL: prefect_api["PREFECT_API_URL"]}),
        pytest.raises(fedsieve_ops.ServiceError, match="'pipeline-from-file/nowhere' is not on"),
    ):
        fedsieve_ops.require_deployment("pipeline-from-file/nowhere")
    with (
        temporary_settings(restore_defaults={PREFECT_API_URL}),
        pytest.raises(fedsieve_ops.ServiceError, match=r"compare\.dispatch: deployment needs"),
    ):
        fedsieve_ops.require_deployment("pipeline-from-file/fedsieve")


# -- real server, serve and worker ------------------------------------------------------------


@pytest.mark.e2e
def test_serve_registers_a_cron_deployment_and_the_scheduler_creates_runs(
    project, prefect_api, processes, ops
):
    env = {
        **prefect_api,
        "MEDMNIST_ROOT": os.environ["MEDMNIST_ROOT"],
        "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}",
    }
    overrides = [f"--set={o}" for o in TINY]
    serve = processes.start(
        [
            str(ops.bin / "fedsieve"),
            "serve",
            "--cron",
            "* * * * *",
            "--name",
            "every-minute",
            *overrides,
        ],
        name="serve",
        env=env,
        cwd=project,
    )
    try:

        def deployment() -> dict[str, Any] | None:
            assert serve.poll() is None, processes.log("serve")[-3000:]
            response = httpx.get(
                f"{env['PREFECT_API_URL']}/deployments/name/pipeline/every-minute",
                timeout=limit(30),
            )
            return response.json() if response.status_code == 200 else None

        served = poll("the served deployment", deployment, timeout=limit(120))

        def scheduled() -> list[dict[str, Any]]:
            return api(
                env,
                "POST",
                "/flow_runs/filter",
                {
                    "deployments": {"id": {"any_": [served["id"]]}},
                    "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}},
                    "sort": "EXPECTED_START_TIME_ASC",
                },
            )

        runs = poll("a scheduled flow run", scheduled, timeout=limit(120))
    finally:
        processes.stop(serve)

    [schedule] = served["schedules"]
    assert schedule["schedule"]["cron"] == "* * * * *" and schedule["active"]
    expected = load_params(project / "params.yaml", TINY).model_dump(
        mode="json", exclude_unset=True
    )
    assert served["parameters"] == {"params": expected, "workdir": str(project.resolve())}
    assert all(run["auto_scheduled"] for run in runs)
    starts = [run["expected_start_time"] for run in runs]
    assert all(start.endswith(":00Z") for start in starts), starts  # on the minute


DISPATCHED = ("dispatched_fedavg", "dispatched_median")
CANCELLED = ("cancelled_fedavg", "cancelled_median")


def grid_for_the_worker(ops: Any, prefix: str, experiment: str, *extra: str) -> list[str]:
    """``fedsieve compare`` of FedAvg and median (methods named ``<prefix>_<rule>``), its
    cells dispatched to the deployment and tracked in ``experiment``."""
    rules = ("fedavg", "median")
    methods = ", ".join(f"{prefix}_{rule}: {{aggregate: {{name: {rule}}}}}" for rule in rules)
    grid = [*TINY, *extra, "compare.dispatch=deployment", f"compare.methods={{{methods}}}"]
    grid += ["compare.attacks=[{name: none}]", f"tracking.experiment={experiment}"]
    return [str(ops.bin / "fedsieve"), "compare", *(f"--set={o}" for o in grid)]


def cancel_a_dispatched_grid(
    project: Path, env: dict[str, str], compare_env: dict[str, str], ops: Any
) -> dict[str, str]:
    """A long grid dispatched to the worker, stopped (SIGTERM) once both cells train; the
    final Prefect state of each cell's run (the worker stops the cancelled runs)."""
    grid = grid_for_the_worker(ops, "cancelled", "cancelled-grid", "train.rounds=500")
    with (project / "cancelled-grid.log").open("w") as output:  # the child keeps its copy
        command = subprocess.Popen(
            grid, cwd=project, env=compare_env, stdout=output, stderr=subprocess.STDOUT
        )
    cells = [ops.repo / "artifacts" / "compare" / f"{m}-none-f0-s0" for m in CANCELLED]
    try:
        poll(
            "both cells training on the worker",
            lambda: (
                command.poll() is not None
                or all((cell / "artifacts" / "checkpoints").exists() for cell in cells)
            ),
            timeout=limit(300),
            interval=0.5,
        )
        assert command.poll() is None, (project / "cancelled-grid.log").read_text()[-3000:]
        command.terminate()
        assert command.wait(timeout=limit(60)) == 143  # at once: it does not wait for 500 rounds
    finally:
        command.kill()
    names = [cell.name for cell in cells]

    def final_states() -> dict[str, str] | None:
        runs = api(env, "POST", "/flow_runs/filter", {"flow_runs": {"name": {"any_": names}}})
        states = {run["name"]: run["state_type"] for run in runs}
        still_going = {"RUNNING", "CANCELLING"} & set(states.values())
        return states if len(states) == 2 and not still_going else None

    return poll("the cancelled cells' runs to stop", final_states, timeout=limit(120))


def create_process_work_pool(env: dict[str, str]) -> None:
    """= `prefect work-pool create fedsieve --type process` and the same for the closing
    runs' `fedsieve-ops` (in-process: no CLI start-up)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.workers.process import ProcessWorker

    connected = temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]})
    with connected, get_client(sync_client=True) as client:
        for name in ("fedsieve", "fedsieve-ops"):
            client.create_work_pool(
                WorkPoolCreate(
                    name=name,
                    type="process",
                    base_job_template=ProcessWorker.get_default_base_job_template(),
                ),
                overwrite=True,
            )


@pytest.mark.e2e
def test_a_process_worker_runs_the_deployment_and_a_grid_dispatched_to_it(
    project, prefect_api, processes, ops
):
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    env = dict(prefect_api)
    create_process_work_pool(env)
    tracking = f"sqlite:///{project / 'mlflow.db'}"
    worker = processes.start(  # starts up while the deployment is made
        [str(ops.bin / "prefect"), "worker", "start", "--pool", "fedsieve", "--limit", "2"],
        name="worker",
        env={
            **env,
            "FEDSIEVE_HOME": str(ops.repo),
            "MEDMNIST_ROOT": os.environ["MEDMNIST_ROOT"],
            "MLFLOW_TRACKING_URI": tracking,
            "PREFECT_WORKER_QUERY_SECONDS": "2",
        },
        cwd=project,
    )
    deploy = subprocess.run(
        [str(ops.bin / "prefect"), "--no-prompt", "deploy", "--all"],
        cwd=ops.repo,  # prefect.yaml's directory, as in the README
        env=env,
        capture_output=True,
        text=True,
        timeout=limit(180),
    )
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
    deployment = api(env, "GET", "/deployments/name/pipeline-from-file/fedsieve")
    assert deployment["work_pool_name"] == "fedsieve"
    assert deployment["entrypoint"] == "flows/deployment.py:pipeline_from_file"
    # Resolved on each worker at run time, not baked in at deploy time.
    assert json.dumps(deployment["pull_steps"]).count("{{ $FEDSIEVE_HOME }}") == 1

    try:
        with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
            flow_run = run_deployment(
                "pipeline-from-file/fedsieve",
                parameters={"workdir": str(project), "overrides": TINY},
                timeout=limit(420),
                poll_interval=2,
            )
        assert flow_run.state is not None and flow_run.state.is_completed(), (
            f"{flow_run.state}\n{processes.log('worker')[-4000:]}"
        )
        # compare.dispatch: deployment -- every cell a run of that deployment on the worker
        compare_env = {
            **env,
            "MEDMNIST_ROOT": os.environ["MEDMNIST_ROOT"],
            "MLFLOW_TRACKING_URI": tracking,
        }
        compare = subprocess.run(
            grid_for_the_worker(ops, "dispatched", "grid"),
            cwd=project,
            env=compare_env,
            capture_output=True,
            text=True,
            timeout=limit(600),
        )
        assert compare.returncode == 0, compare.stderr[-3000:] + processes.log("worker")[-4000:]
        cells = ops.repo / "artifacts" / "compare"  # in the worker's checkout
        on_worker = {
            method: json.loads((cells / f"{method}-none-f0-s0/reports/metrics.json").read_text())
            for method in DISPATCHED
        }
        cancelled_runs = cancel_a_dispatched_grid(project, env, compare_env, ops)
    finally:
        processes.stop(worker)
        for method in (*DISPATCHED, *CANCELLED):  # the worker's checkout
            shutil.rmtree(ops.repo / "artifacts" / "compare" / f"{method}-none-f0-s0", True)
    # stopped on the worker (SIGTERM), not trained to the end
    assert cancelled_runs == {f"{m}-none-f0-s0": "CANCELLED" for m in CANCELLED}
    client = MlflowClient(tracking)
    stopped = client.search_runs([client.get_experiment_by_name("cancelled-grid").experiment_id])
    assert {r.info.run_name: r.info.status for r in stopped} == {
        "compare-breastmnist": "KILLED",
        **{f"{m}-none-f0-s0": "KILLED" for m in CANCELLED},
    }, processes.log("worker")[-8000:]

    metrics = json.loads((project / "reports" / "metrics.json").read_text())
    assert metrics["rounds"] == 3
    client = MlflowClient(tracking)
    [run] = client.search_runs([client.get_experiment_by_name("fedsieve").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "breastmnist-fedavg"
    assert run.data.tags["prefect_flow_run_id"] == str(flow_run.id)  # found by its flow run
    assert run.data.params["partition.num_clients"] == "3"
    assert run.data.metrics["final_test_auc"] == pytest.approx(metrics["test_auc"])

    # the grid's summary holds what each worker run tracked as the parent's child
    [parent] = client.search_runs(
        [client.get_experiment_by_name("grid").experiment_id], "tags.kind = 'compare'"
    )
    children = {
        r.info.run_name: r
        for r in client.search_runs(
            [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
        )
    }
    assert set(children) == {"dispatched_fedavg-none-f0-s0", "dispatched_median-none-f0-s0"}
    with (project / "reports" / "compare" / "summary.csv").open() as handle:
        rows = {row["method"]: row for row in csv.DictReader(handle)}
    for method, row in rows.items():
        child = children[f"{method}-none-f0-s0"]
        assert child.data.params["aggregate.name"] == method.removeprefix("dispatched_")
        assert float(row["test_acc"]) == pytest.approx(on_worker[method]["test_acc"])
        assert child.data.metrics["final_test_acc"] == pytest.approx(on_worker[method]["test_acc"])
