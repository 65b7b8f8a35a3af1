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
3. ``docker kill`` of PostgreSQL (kill -9): compose's restart policy starts it again (or
   this script does, 10 s later, where no policy did); the run goes on and ends FINISHED
   with all 12 rounds.
4. PostgreSQL stopped for 50 s: Docker shows both servers unhealthy within 30 s (their
   health checks, watched every second); the run's calls wait (retried for about two
   minutes) and it ends FINISHED with all rounds.
5. The whole stack stopped and started (``compose stop``, ``compose start``): the run is
   Crashed and closed as in 1, and resumes to FINISHED with all rounds.
6. PostgreSQL stopped for longer than a worker's calls are retried (240 s): the run ends
   (never Running for good) and its MLflow run is closed, not RUNNING; resumed once the
   database is back, it continues into the same MLflow run, which is given the rounds
   its tracking lost (from the checkpoint) and ends FINISHED with all 12.
7. The MLflow server stopped when the run holds its last round, for 150 s (stopped: a
   killed one is started again at once by its restart policy): the model's logging and
   registration fall in the outage. The run is never green without its model version: it
   either logs and registers the model once the server answers, or fails (exit 1, one
   line saying what to run) and the resumed run registers it in the same MLflow run.
8. The only training worker stopped and not started again: the run is marked Crashed, its
   subflow runs and its MLflow run are closed by the operations worker (its own pool),
   by the one closing run the crash gets; started again later, the worker resumes it.

Each fault that hits the tracking store records the round it was injected at and the
seconds a round took just before (from the rounds' MLflow timestamps), and fails unless
rounds remained to be trained then and at least one round was logged after the store came
back: a fault that fell after training proves nothing about it.

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
HEALTH_WITHIN_S = 30  # docs/container.md: a server whose PostgreSQL is away shows unhealthy by then
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

    def container(self, service: str) -> str:
        """The service's container id (stopped ones too)."""
        return self("ps", "-aq", service).stdout.strip()

    def docker(self, action: str, service: str) -> None:
        """``docker stop|kill|start`` of the service's container."""
        run(["docker", action, self.container(service)], timeout=120)

    def running(self, service: str) -> bool:
        """Whether the service's container is running now."""
        done = run(["docker", "inspect", "--format", "{{.State.Running}}", self.container(service)])
        return done.stdout.strip() == "true"

    def logs_since(self, service: str, since: float) -> str:
        """The service's log lines since ``since`` (epoch seconds): this fault's, not an
        earlier one's."""
        done = run(
            ["docker", "logs", "--since", f"{since:.0f}", self.container(service)], timeout=120
        )
        return done.stdout + done.stderr

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


def round_times(run_id: str) -> dict[int, float]:
    """When each round was last logged (epoch seconds, by round): the worker's clock is
    this host's (containers share its kernel)."""
    from mlflow import MlflowClient

    times: dict[int, float] = {}
    for metric in MlflowClient().get_metric_history(run_id, ROUND_METRIC):
        times[metric.step] = max(times.get(metric.step, 0.0), metric.timestamp / 1000)
    return times


def injected_at(run_id: str, record: dict[str, Any]) -> float:
    """Record where in training a fault is injected now (the rounds logged, the last
    round's seconds) and return the time; a fault after the last round hits no training."""
    times = round_times(run_id)
    record["injected_at_round"] = len(times)
    steps = sorted(times)
    if len(steps) >= 2:
        record["round_s_before"] = round(times[steps[-1]] - times[steps[-2]], 2)
    if len(times) >= ROUNDS:
        raise StepError(f"the fault came after training: all {ROUNDS} rounds were logged")
    return time.time()


def hit_training(run_id: str, back: float, record: dict[str, Any], what: str) -> None:
    """Fail unless some round was logged after the store answered again (at ``back``):
    the fault then fell on training's tracking, as its name says."""
    after = sum(logged >= back for logged in round_times(run_id).values())
    record["rounds_logged_after_outage"] = after
    if after == 0:
        raise StepError(
            f"{what}: every round was logged before the outage ended; it hit no training"
        )


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
    with fault("PostgreSQL killed (kill -9)") as record:
        flow_run = start_run()
        run_id = at_round(flow_run)
        injected_at(run_id, record)
        stack.docker("kill", "postgres")
        time.sleep(10)
        # compose's `restart: unless-stopped` starts a killed container again by itself
        record["started_again_by_its_restart_policy"] = stack.running("postgres")
        if not record["started_again_by_its_restart_policy"]:
            stack.docker("start", "postgres")
        back = time.time()
        ends_finished(flow_run, run_id, "PostgreSQL killed")
        record["rounds"] = rounds_logged(run_id)
        hit_training(run_id, back, record, "PostgreSQL killed")


def probes(stack: Stack) -> dict[str, bool]:
    """Whether each server's compose health probe passes now (the probe's own command)."""
    compose = yaml.safe_load(stack.compose_file.read_text())
    healthy = {}
    for service in ("mlflow", "prefect-server"):
        command = compose["services"][service]["healthcheck"]["test"][1:]  # after "CMD"
        container = stack.container(service)
        done = subprocess.run(
            ["docker", "exec", container, *command], capture_output=True, timeout=60
        )
        healthy[service] = done.returncode == 0
    return healthy


def database_outage(stack: Stack, seconds: int = 50) -> None:
    with fault(f"PostgreSQL stopped for {seconds} s") as record:
        flow_run = start_run()
        run_id = at_round(flow_run)
        injected_at(run_id, record)
        stopped = time.monotonic()
        stack.docker("stop", "postgres")
        record["unhealthy_after_s"] = unhealthy_after(stack, stopped, seconds - 5)
        time.sleep(max(0.0, seconds - (time.monotonic() - stopped)))
        stack.docker("start", "postgres")
        back = time.time()
        wait_for("both probes healthy again", lambda: all(probes(stack).values()), 120, 3)
        ends_finished(flow_run, run_id, "PostgreSQL stopped")
        record["rounds"] = rounds_logged(run_id)
        hit_training(run_id, back, record, "PostgreSQL stopped")
        late = {name: after for name, after in record["unhealthy_after_s"].items()
                if after is None or after > HEALTH_WITHIN_S}  # fmt: skip
        if late:
            raise StepError(
                f"Docker still showed a server healthy {HEALTH_WITHIN_S} s into the outage: {late}"
            )


def unhealthy_after(stack: Stack, since: float, limit: float) -> dict[str, float | None]:
    """Seconds from ``since`` until Docker shows each server unhealthy (its compose health
    check), looked at every second for ``limit`` seconds; None: never within them."""
    containers = {name: stack.container(name) for name in ("mlflow", "prefect-server")}
    after: dict[str, float | None] = dict.fromkeys(containers)
    while time.monotonic() - since < limit and None in after.values():
        for name, container in containers.items():
            if after[name] is None and _health(container) == "unhealthy":
                after[name] = round(time.monotonic() - since, 1)
        time.sleep(1)
    return after


def _health(container: str) -> str:
    done = subprocess.run(["docker", "inspect", "--format", "{{.State.Health.Status}}", container],
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip()


def long_outage(stack: Stack, seconds: int = 240) -> None:
    from mlflow import MlflowClient

    with fault(f"PostgreSQL stopped for {seconds} s, past the calls' retries") as record:
        flow_run = start_run()
        run_id = at_round(flow_run)
        since = injected_at(run_id, record)
        injected = time.monotonic()
        stack.docker("stop", "postgres")
        time.sleep(seconds)
        stack.docker("start", "postgres")
        back = time.time()
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
        worker_log = stack.logs_since("worker", since)
        record["tracking_failed_midway"] = "further tracking calls are skipped" in worker_log
        record["tracking_recovered_at_the_end"] = "is back (it failed" in worker_log
        resumed = start_run(resume=True)
        ends_finished(resumed, run_id, "the long outage, resumed")
        record["resumed_into_the_same_run_with_every_round"] = True
        hit_training(run_id, back, record, "the long outage")


def registration_outage(stack: Stack, seconds: int = 150) -> None:
    """Fault 7: the tracking server lost while the model is logged and registered."""
    from mlflow import MlflowClient

    with fault(f"MLflow stopped for {seconds} s at the last round (model logging)") as record:
        flow_run = start_run()
        run_id = at_round(flow_run, ROUNDS)  # training is done; the evaluate stage follows
        since = time.time()
        # stopped, not killed: a killed container is started again by its restart policy
        stack.docker("stop", "mlflow")
        time.sleep(seconds)
        record["away_for_good_s"] = seconds if not stack.running("mlflow") else 0
        if not record["away_for_good_s"]:
            raise StepError("MLflow came back before it was started again: the fault did not hold")
        stack.docker("start", "mlflow")
        back = time.time()
        wait_for("both probes healthy again", lambda: all(probes(stack).values()), 300, 3)
        state = wait_for("the run to end", lambda: flow_run_state(flow_run, final=True), 900)
        record["flow_run"] = state
        versions = MlflowClient().search_model_versions(f"run_id = '{run_id}'")
        record["model_version_after_the_run"] = bool(versions)
        worker_log = stack.logs_since("worker", since)
        record["tracking_failed_then_recovered"] = (
            "failed while" in worker_log and "is back (it failed" in worker_log
        )
        if state == "COMPLETED":
            if not versions:
                raise StepError(
                    "a green run without its model version (MLflow stopped at the last round)"
                )
            record["registered_after_outage"] = (
                min(int(v.creation_timestamp) / 1000 for v in versions) >= back
            )
            ends_finished(flow_run, run_id, "MLflow killed at the last round")
            return
        resumed = start_run(resume=True)
        ends_finished(resumed, run_id, "MLflow killed at the last round, resumed")
        record["resumed_registered_the_model_in_the_same_run"] = True


def worker_lost(stack: Stack) -> None:
    """Fault 8: the only training worker gone for good; the operations worker closes."""
    from mlflow import MlflowClient

    with fault("the only training worker stopped and not started again") as record:
        flow_run = start_run()
        run_id = at_round(flow_run)
        injected = time.monotonic()
        stack.docker("stop", "worker")
        wait_for("the flow run Crashed", lambda: flow_run_state(flow_run) == "CRASHED", 600)
        record["crashed_after_s"] = round(time.monotonic() - injected, 1)
        client = MlflowClient()
        wait_for(
            "its MLflow run KILLED", lambda: client.get_run(run_id).info.status == "KILLED", 300
        )
        record["mlflow_killed_after_s"] = round(time.monotonic() - injected, 1)
        subflows = wait_for(
            "its subflow runs closed", lambda: _subflows_if_closed(flow_run), 300, 2
        )
        record["subflow_runs"] = subflows
        record["subflows_closed_after_s"] = round(time.monotonic() - injected, 1)
        closing = wait_for(
            "its closing runs ended", lambda: _closing_runs_if_ended(flow_run), 300, 2
        )
        record["closing_runs"] = closing
        if list(closing.values()) != ["COMPLETED"]:
            raise StepError(
                f"worker lost: not one closing run, completed, for the crash: {closing}"
            )
        stack.docker("start", "worker")
        resumed = start_run(resume=True)
        ends_finished(resumed, run_id, "worker lost, started again later and resumed")
        record["resumed_into_the_same_run"] = True


def _subflows_if_closed(flow_run_id: str) -> dict[str, str] | None:
    """The states of the flow run's subflow runs by name, once none is still running."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])
            )
        )
    states = {child.name: str(child.state_type.value) for child in children if child.state_type}
    return None if not states or "RUNNING" in states.values() else states


def _closing_runs_if_ended(flow_run_id: str) -> dict[str, str] | None:
    """The closing runs made for the crashed flow run (name: state; a run that closed
    nothing because an earlier one did is tagged so), once each has ended."""
    from prefect.client.orchestration import get_client

    from flows.crashed import DEFERRED  # here: Prefect reads its settings when imported

    with get_client(sync_client=True) as client:
        runs = [
            run
            for run in client.read_flow_runs(limit=200)
            if str(run.parameters.get("flow_run", "")).endswith(flow_run_id)
        ]
    if not runs or any(run.state is None or not run.state.is_final() for run in runs):
        return None
    return {
        run.name: "DEFERRED" if DEFERRED in run.tags else str(run.state_type.value) for run in runs
    }


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
    "7-registration-outage": registration_outage,
    "8-worker-lost": worker_lost,
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
        stack("up", "-d", "--no-build", "worker", "ops-worker")
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
            if "failed" not in RECORD:  # an earlier run's failure, since rerun: gone
                record.pop("failed", None)
            args.results.write_text(json.dumps(record, indent=1) + "\n")
    print("container-faults: every fault ended as it should")
    return 0


if __name__ == "__main__":
    sys.exit(main())
