"""The compose stack under the faults an operator meets (``make container-faults``).

Each fault is injected by this script into a 12-round deployment run on the stack's
worker (docker-compose.yml: PostgreSQL, MLflow and Prefect behind authentication, the
deployments and the automations, a worker), once the run's MLflow run holds its third
round, and must end as docs/operations.md says:

1. ``docker stop`` of the worker (what ``compose down`` and ``restart`` do), started again
   at once: Prefect's process worker stops without waiting for its runs, each in a
   session of its own, so the run dies without its exit hooks; the server's zombie
   automation marks it Crashed once its heartbeats stop (180 s) and the closing
   automation's run on the worker closes its subflow runs and its MLflow run KILLED; the
   deployment run with ``resume`` continues from the checkpoint into the same MLflow run,
   which ends FINISHED with all 12 rounds.
2. ``docker kill`` of the worker, started again at once: the same.
3. ``docker kill`` of PostgreSQL (kill -9), started again 10 s later: the run goes on and
   ends FINISHED with all 12 rounds.
4. PostgreSQL stopped for 50 s: both servers' health probes fail while it is away; the
   run's calls wait (retried for about two minutes) and it ends FINISHED with all rounds.
5. The whole stack stopped and started (``compose stop``, ``compose start``): the run is
   Crashed and closed as in 1, and resumes to FINISHED with all rounds.
6. PostgreSQL stopped for longer than a worker's calls are retried (240 s): the run ends
   (never Running for good) and its MLflow run is closed, not RUNNING; resumed once the
   database is back, it continues into the same MLflow run, which is given the rounds
   its tracking lost (from the checkpoint) and ends FINISHED with all 12.

Needs a Docker engine with Compose, ``make setup`` (the host's ``.venv`` is the client)
and the stack's image (built here). Prints each fault's timings; ``--results`` writes
them as JSON. ``DOCKER_BUILD_ARGS`` and ``MEDMNIST_ROOT`` as for the container smoke.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from scripts.stack_steps import (
    StepError,
    client_credentials,
    compose_command,
    on_host_network,
    run,
    stack_credentials,
    wait_for,
)

REPO = Path(__file__).resolve().parents[1]
PROJECT = "fedsieve-faults"
DEPLOYMENT = "pipeline-from-file/fedsieve"
ROUNDS = 12
INJECT_AT = 3  # rounds the MLflow run holds when the fault is injected
OVERRIDES = [f"train.rounds={ROUNDS}", "train.local_epochs=4", "eval.every=1"]
ROUND_METRIC = "test_acc"  # logged once per round
RECORD: dict[str, Any] = {}


class Stack:
    """The compose stack (host networking where the engine has no bridge), its secrets, and
    clients of its servers in this process."""

    def __init__(self, work: Path, medmnist_root: Path | None) -> None:
        self.compose_file = on_host_network(REPO / "docker-compose.yml", work / "host-compose.yml")
        files = ["-f", str(self.compose_file)]
        if medmnist_root is not None:
            data = work / "data.yml"
            data.write_text(yaml.safe_dump({"services": {"worker": {
                "environment": {"MEDMNIST_ROOT": "/medmnist"},
                "volumes": [f"{medmnist_root}:/medmnist:ro"],
            }}}))  # fmt: skip
            files += ["-f", str(data)]
        self.compose = [*compose_command(), "-p", PROJECT, "--project-directory", str(REPO), *files]
        self.env = os.environ | stack_credentials()
        os.environ.update(client_credentials(self.env))  # this process is the stack's client

    def __call__(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run([*self.compose, *args], env=self.env, timeout=timeout)

    def docker(self, action: str, service: str) -> None:
        """``docker stop|kill|start`` of the service's container."""
        container = self("ps", "-aq", service).stdout.strip()
        run(["docker", action, container], timeout=120)

    def down(self, logs_file: Path) -> None:
        """The stack's logs into ``logs_file`` (kept: they are how a fault is read after
        the run), then the stack and its volumes removed."""
        logs = subprocess.run([*self.compose, "logs", "--no-color", "--timestamps"],
                              env=self.env, capture_output=True, text=True)  # fmt: skip
        logs_file.write_text(logs.stdout + logs.stderr)
        print(f"container-faults: the stack's logs are in {logs_file}")
        subprocess.run([*self.compose, "down", "--volumes", "--remove-orphans"], env=self.env,
                       capture_output=True)  # fmt: skip


def start_run(resume: bool = False) -> str:
    from prefect.deployments import run_deployment

    parameters = {"overrides": OVERRIDES, "resume": resume}
    return str(run_deployment(DEPLOYMENT, parameters=parameters, timeout=0).id)


def flow_run_state(flow_run_id: str, *, final: bool = False) -> str:
    """The flow run's state type ("" while the server cannot say: its database away; and,
    with ``final``, while the run has not ended)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError

    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run_id).state
    except PrefectHTTPStatusError:
        return ""
    if state is None or (final and not state.is_final()):
        return ""
    return str(state.type.value)


def mlflow_run(flow_run_id: str) -> Any:
    """The MLflow run the flow run opened (its tag), or None yet."""
    from mlflow import MlflowClient

    client = MlflowClient()
    experiment = client.get_experiment_by_name("fedsieve")
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id], f"tags.prefect_flow_run_id = '{flow_run_id}'"
    )
    return runs[0] if runs else None


def rounds_logged(run_id: str) -> int:
    from mlflow import MlflowClient

    return len(MlflowClient().get_metric_history(run_id, ROUND_METRIC))


def at_round(flow_run_id: str, rounds: int = INJECT_AT) -> str:
    """Wait until the flow run's MLflow run holds ``rounds`` rounds; its run id."""

    def reached() -> str | None:
        found = mlflow_run(flow_run_id)
        if found is None:
            return None
        return found.info.run_id if rounds_logged(found.info.run_id) >= rounds else None

    return str(wait_for(f"round {rounds} of flow run {flow_run_id}", reached, 600, 0.5))


def ends_finished(flow_run_id: str, run_id: str, what: str) -> None:
    """The flow run Completed, the MLflow run FINISHED with every round and a model version."""
    from mlflow import MlflowClient

    state = wait_for(
        f"{what}: the run to end", lambda: flow_run_state(flow_run_id, final=True), 900
    )
    client = MlflowClient()
    info = client.get_run(run_id).info
    rounds = rounds_logged(run_id)
    versions = client.search_model_versions(f"run_id = '{run_id}'")
    if state != "COMPLETED" or info.status != "FINISHED" or rounds != ROUNDS or not versions:
        raise StepError(
            f"{what}: flow run {state}, MLflow run {info.status} with {rounds} rounds and "
            f"{len(versions)} model version(s)"
        )


@contextlib.contextmanager
def fault(name: str) -> Iterator[dict[str, Any]]:
    print(f"== {name}", flush=True)
    record: dict[str, Any] = {}
    started = time.monotonic()
    yield record
    record["total_s"] = round(time.monotonic() - started, 1)
    RECORD[name] = record
    print(f"   {record}", flush=True)


def closed_and_resumed(
    flow_run: str, run_id: str, injected: float, record: dict[str, Any], name: str
) -> None:
    """The dead run marked Crashed and its MLflow run KILLED (seconds since the fault in
    ``record``); resumed, it continues that MLflow run to FINISHED with every round."""
    from mlflow import MlflowClient

    client = MlflowClient()
    wait_for("the flow run Crashed", lambda: flow_run_state(flow_run) == "CRASHED", 600)
    record["crashed_after_s"] = round(time.monotonic() - injected, 1)
    wait_for("its MLflow run KILLED", lambda: client.get_run(run_id).info.status == "KILLED", 300)
    record["mlflow_killed_after_s"] = round(time.monotonic() - injected, 1)
    record["rounds_before"] = rounds_logged(run_id)
    resumed = start_run(resume=True)
    ends_finished(resumed, run_id, f"{name}, resumed")
    reopened = mlflow_run(resumed)  # the resumed flow run's own MLflow run: the same one
    if reopened is None or reopened.info.run_id != run_id:
        raise StepError(f"{name}: the resumed run did not continue MLflow run {run_id}")
    record["resumed_into_the_same_run"] = True


def stop_and_resume(stack: Stack, action: str, name: str) -> None:
    """Fault 1 (``stop``) or 2 (``kill``) of the worker, then the resumed run."""
    with fault(name) as record:
        flow_run = start_run()
        run_id = at_round(flow_run)
        injected = time.monotonic()
        stack.docker(action, "worker")
        stack.docker("start", "worker")  # as `compose up` does: it runs the closing deployment
        closed_and_resumed(flow_run, run_id, injected, record, name)


def postgres_killed(stack: Stack) -> None:
    with fault("PostgreSQL killed (kill -9) and started 10 s later") as record:
        flow_run = start_run()
        run_id = at_round(flow_run)
        stack.docker("kill", "postgres")
        time.sleep(10)
        stack.docker("start", "postgres")
        ends_finished(flow_run, run_id, "PostgreSQL killed")
        record["rounds"] = rounds_logged(run_id)


def probes(stack: Stack) -> dict[str, bool]:
    """Whether each server's compose health probe passes now (the probe's own command)."""
    compose = yaml.safe_load(stack.compose_file.read_text())
    healthy = {}
    for service in ("mlflow", "prefect-server"):
        command = compose["services"][service]["healthcheck"]["test"][1:]  # after "CMD"
        container = stack("ps", "-q", service).stdout.strip()
        done = subprocess.run(
            ["docker", "exec", container, *command], capture_output=True, timeout=60
        )
        healthy[service] = done.returncode == 0
    return healthy


def database_outage(stack: Stack, seconds: int = 50) -> None:
    with fault(f"PostgreSQL stopped for {seconds} s") as record:
        flow_run = start_run()
        run_id = at_round(flow_run)
        stack.docker("stop", "postgres")
        time.sleep(20)
        record["probes_during_outage"] = probes(stack)
        time.sleep(seconds - 20)
        stack.docker("start", "postgres")
        wait_for("both probes healthy again", lambda: all(probes(stack).values()), 120, 3)
        ends_finished(flow_run, run_id, "PostgreSQL stopped")
        record["rounds"] = rounds_logged(run_id)
        if any(record["probes_during_outage"].values()):
            raise StepError(f"a health probe passed with PostgreSQL away: {record}")


def long_outage(stack: Stack, seconds: int = 240) -> None:
    from mlflow import MlflowClient

    with fault(f"PostgreSQL stopped for {seconds} s, past the calls' retries") as record:
        flow_run = start_run()
        run_id = at_round(flow_run)
        injected = time.monotonic()
        stack.docker("stop", "postgres")
        time.sleep(seconds)
        stack.docker("start", "postgres")
        wait_for("both probes healthy again", lambda: all(probes(stack).values()), 300, 3)
        record["flow_run"] = wait_for(
            "the run to end", lambda: flow_run_state(flow_run, final=True), 900
        )
        record["ended_after_s"] = round(time.monotonic() - injected, 1)
        client = MlflowClient()
        record["mlflow_run"] = wait_for(
            "its MLflow run closed",
            lambda: (status := client.get_run(run_id).info.status) != "RUNNING" and status,
            300,
        )
        record["rounds_before_resume"] = rounds_logged(run_id)
        worker_log = stack("logs", "--no-color", "worker").stdout
        record["tracking_failed_midway"] = "further tracking calls are skipped" in worker_log
        record["tracking_recovered_at_the_end"] = "is back (it failed" in worker_log
        resumed = start_run(resume=True)
        ends_finished(resumed, run_id, "the long outage, resumed")
        record["resumed_into_the_same_run_with_every_round"] = True


def whole_stack_restarted(stack: Stack) -> None:
    with fault("the whole stack stopped and started") as record:
        flow_run = start_run()
        run_id = at_round(flow_run)
        injected = time.monotonic()
        stack("stop", timeout=300)
        stack("start", timeout=300)
        wait_for("both probes healthy again", lambda: all(probes(stack).values()), 300, 3)
        closed_and_resumed(flow_run, run_id, injected, record, "the whole stack restarted")


FAULTS: dict[str, Callable[[Stack], None]] = {
    "1-worker-stop": lambda stack: stop_and_resume(stack, "stop", "worker stopped (docker stop)"),
    "2-worker-kill": lambda stack: stop_and_resume(stack, "kill", "worker killed (docker kill)"),
    "3-postgres-kill": postgres_killed,
    "4-database-outage": database_outage,
    "5-stack-restart": whole_stack_restarted,
    "6-long-outage": long_outage,
}


def logs_beside(results: Path | None) -> Path:
    """Where the stack's logs are kept: beside the results (``faults.json`` ->
    ``faults-compose.log``), or in the current folder."""
    if results is None:
        return Path("container-faults-compose.log").resolve()
    return results.with_name(f"{results.stem}-compose.log")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, help="write the faults' timings (JSON)")
    parser.add_argument(
        "--faults", nargs="+", choices=sorted(FAULTS), default=sorted(FAULTS), help="which faults"
    )
    args = parser.parse_args()
    if subprocess.run(["docker", "info"], capture_output=True).returncode:
        print("container-faults: no Docker engine answers (docker info failed)", file=sys.stderr)
        return 2
    root = os.environ.get("MEDMNIST_ROOT")
    work = Path(tempfile.mkdtemp(prefix="fedsieve-faults-"))
    stack = Stack(work, Path(root).resolve() if root else None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # torn down on SIGTERM too
    try:
        print("== build fedsieve:cpu; the stack up (servers, deployments, automations, worker)")
        build_args = shlex.split(os.environ.get("DOCKER_BUILD_ARGS", ""))
        run(["docker", "build", "--network", "host", *build_args, "-t", "fedsieve:cpu", "."],
            cwd=REPO, timeout=3600)  # fmt: skip
        stack("up", "-d", "--no-build", "postgres", "mlflow", "prefect-server")
        stack("run", "--rm", "deploy")
        stack("up", "-d", "--no-build", "worker")
        for name in args.faults:
            FAULTS[name](stack)
    except (StepError, subprocess.TimeoutExpired) as error:
        RECORD["failed"] = str(error).splitlines()[0]
        print(f"container-faults: {error}", file=sys.stderr)
        return 1
    finally:
        stack.down(logs_beside(args.results))
        shutil.rmtree(work, ignore_errors=True)
        if args.results:  # faults run on their own (--faults) join the others' record
            earlier = json.loads(args.results.read_text()) if args.results.exists() else {}
            record = {**earlier, "command": "make container-faults", **RECORD}
            args.results.write_text(json.dumps(record, indent=1) + "\n")
    print("container-faults: every fault ended as it should")
    return 0


if __name__ == "__main__":
    sys.exit(main())
