"""The compose stack under load (run by scripts/container_smoke.sh inside the image): a
comparison grid of 8 cells trained at once beside 2 deployment runs on the worker. Every
run and every per-round metric must reach the tracking server, and no database-lock
error may reach the console. Needs PREFECT_API_URL and MLFLOW_TRACKING_URI set to the
stack's servers."""

from __future__ import annotations

import subprocess
import sys
import time

from mlflow import MlflowClient
from prefect import get_client
from prefect.deployments import run_deployment

ROUNDS = 2
DEPLOYMENT = "pipeline-from-file/fedsieve"
PER_ROUND = ("test_acc", "test_loss", "test_auc")


def finished_runs(client: MlflowClient, experiment: str) -> list:
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id], max_results=1000)


def main() -> None:
    tracking = MlflowClient()
    before = {run.info.run_id for run in finished_runs(tracking, "fedsieve")}
    overrides = [f"train.rounds={ROUNDS}"]
    flow_runs = [
        run_deployment(DEPLOYMENT, parameters={"overrides": overrides}, timeout=0) for _ in range(2)
    ]
    grid = subprocess.run(
        ["fedsieve", "compare", "--set", f"train.rounds={ROUNDS}",
         "--set", "compare.seeds=[0, 1]", "--set", "compare.max_parallel=8"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    console = grid.stdout + grid.stderr
    if grid.returncode != 0:
        sys.exit(f"load: fedsieve compare failed:\n{console[-4000:]}")
    with get_client(sync_client=True) as prefect:
        deadline = time.monotonic() + 1200
        for flow_run in flow_runs:
            while not (state := prefect.read_flow_run(flow_run.id).state).is_final():
                if time.monotonic() > deadline:
                    sys.exit(f"load: deployment run {flow_run.name} still {state.name}")
                time.sleep(5)
            if not state.is_completed():
                sys.exit(f"load: deployment run {flow_run.name} ended {state.name}")

    runs = [r for r in finished_runs(tracking, "fedsieve") if r.info.run_id not in before]
    parents = [
        r
        for r in runs
        if "mlflow.parentRunId" not in r.data.tags and r.info.run_name.startswith("compare")
    ]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    pipelines = [r for r in runs if r not in parents and r not in children]
    problems = []
    if len(parents) != 1:
        problems.append(f"{len(parents)} grid parent runs tracked, 1 expected")
    if len(children) != 8:
        problems.append(f"{len(children)} grid cells tracked, 8 expected")
    if len(pipelines) != 2:
        problems.append(f"{len(pipelines)} deployment runs tracked, 2 expected")
    for run in runs:
        if run.info.status != "FINISHED":
            problems.append(f"run {run.info.run_name} is {run.info.status}")
    for run in children + pipelines:
        for key in PER_ROUND:
            steps = [m.step for m in tracking.get_metric_history(run.info.run_id, key)]
            if sorted(steps) != list(range(1, ROUNDS + 1)):
                problems.append(f"{run.info.run_name}: {key} logged at rounds {steps}")
    if "database is locked" in console.lower():
        problems.append("a 'database is locked' error reached the console")
    problems += dispatched_grid(tracking)
    if problems:
        sys.exit("load: " + "; ".join(problems))
    print(f"   load: {len(children)} cells and {len(pipelines)} deployment runs tracked, "
          f"every per-round metric present, no lock error on the console")  # fmt: skip


def dispatched_grid(tracking: MlflowClient) -> list[str]:
    """A grid of 2 cells dispatched to the worker (``compare.dispatch: deployment``): its
    parent and both cells tracked, FINISHED, each cell a run of the deployment."""
    grid = subprocess.run(
        ["fedsieve", "compare", "--set", f"train.rounds={ROUNDS}", "--set", "compare.seeds=[0, 1]",
         "--set", "compare.methods={fedavg: {aggregate: {name: fedavg}}}",
         "--set", "compare.attacks=[{name: none}]",
         "--set", "compare.dispatch=deployment", "--set", "tracking.experiment=dispatched"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if grid.returncode != 0:
        return [f"the dispatched grid failed: {(grid.stdout + grid.stderr)[-2000:]}"]
    runs = finished_runs(tracking, "dispatched")
    cells = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    problems = [f"dispatched run {r.info.run_name} is {r.info.status}"
                for r in runs if r.info.status != "FINISHED"]  # fmt: skip
    if len(runs) != 3 or len(cells) != 2:
        problems.append(f"dispatched grid: {len(runs)} runs, {len(cells)} cells (3 and 2 expected)")
    print(f"   load: a grid dispatched to the worker: {len(cells)} cells and their parent tracked")
    return problems


if __name__ == "__main__":
    main()
