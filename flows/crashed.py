"""What a dead process leaves open, closed: a flow run the server marked Crashed (Prefect's
zombie-flow automation, once its heartbeats stopped: a worker's container killed, its
machine lost) gets its subflow runs marked Crashed and its MLflow runs closed KILLED. An
automation runs this flow's deployment on a worker for every crashed pipeline run
(:mod:`flows.automations`); a later ``--resume`` or retry continues from the checkpoint.

No ``from __future__ import annotations``: Prefect validates the parameters against the
annotations (see flows/deployment.py).
"""

from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger

__all__ = ["close_crashed_run", "earlier_closing_run", "flow_run_id_of"]

RESOURCE_PREFIX = "prefect.flow-run."  # an event's resource id: prefect.flow-run.<uuid>
DEFERRED = "closed-by-an-earlier-run"  # the tag of a closing run that left it to another


def flow_run_id_of(resource: str) -> str:
    """The flow run id in an automation's ``{{ event.resource.id }}`` (or the bare id)."""
    return resource.removeprefix(RESOURCE_PREFIX)


@flow(name="close-crashed-run")
def close_crashed_run(flow_run: str) -> dict[str, Any]:
    """Mark the subflow runs of crashed ``flow_run`` Crashed and close the MLflow runs it
    opened (tagged ``prefect_flow_run_id``) KILLED; what was closed. A closing run that
    finds an earlier one for the same crash (one started by hand beside the automation's)
    leaves the closing to it and says so."""
    flow_run_id = flow_run_id_of(flow_run)
    if (earlier := _earlier_closing_run(flow_run_id)) is not None:
        get_run_logger().info("flow run %s is closed by closing run %s", flow_run_id, earlier)
        return {"flow_run": flow_run_id, "closed_by": earlier}
    subflows = _crash_unfinished_subflows(flow_run_id)
    killed = _kill_tracking_runs(flow_run_id)
    get_run_logger().info(
        "flow run %s: %d subflow run(s) marked Crashed, %d MLflow run(s) closed KILLED",
        flow_run_id, len(subflows), len(killed),
    )  # fmt: skip
    return {"flow_run": flow_run_id, "subflow_runs": subflows, "mlflow_runs": killed}


def _earlier_closing_run(flow_run_id: str) -> str | None:
    """The closing run this one defers to, when run from the deployment (by hand or in a
    test it closes the run itself)."""
    from prefect import runtime
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.sorting import FlowRunSort

    deployment_id, this_run = runtime.deployment.id, runtime.flow_run.id
    if deployment_id is None or this_run is None:
        return None
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC,
            limit=200,  # the recent ones: both automations fire within minutes
        )
        earlier = earlier_closing_run(runs, this_run, flow_run_id)
        if earlier is not None:  # on the record: this run closed nothing
            tags = next(run.tags for run in runs if str(run.id) == this_run)
            client.update_flow_run(UUID(this_run), tags=[*tags, DEFERRED])
    return earlier


def earlier_closing_run(runs: list[Any], this_run: str, flow_run_id: str) -> str | None:
    """Of ``runs`` (closing runs), one for crashed ``flow_run_id`` created before
    ``this_run``, neither failed, cancelled or crashed itself nor deferring (tagged
    ``DEFERRED``) to another: it closes the crash."""
    created = {str(run.id): run.created for run in runs}
    if this_run not in created:
        return None
    given_up = {"FAILED", "CANCELLED", "CRASHED"}
    earlier = [
        run
        for run in runs
        if str(run.id) != this_run
        and flow_run_id_of(str(run.parameters.get("flow_run", ""))) == flow_run_id
        and run.created < created[this_run]
        and (run.state_type is None or run.state_type.value not in given_up)
        and DEFERRED not in run.tags
    ]
    return str(min(earlier, key=lambda run: run.created).id) if earlier else None


def _crash_unfinished_subflows(flow_run_id: str) -> list[str]:
    """Every descendant flow run not in a final state, marked Crashed (a subflow shares its
    parent's process, so it died with it)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.states import Crashed

    crashed, parents = [], [flow_run_id]
    with get_client(sync_client=True) as client:
        while parents:
            children = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=parents)
                )
            )
            for child in children:
                if child.state is not None and not child.state.is_final():
                    message = f"its parent flow run {flow_run_id} crashed"
                    client.set_flow_run_state(child.id, Crashed(message=message), force=True)
                    crashed.append(str(child.id))
            parents = [str(child.id) for child in children]
    return crashed


def _kill_tracking_runs(flow_run_id: str) -> list[str]:
    """The MLflow runs the flow run opened and left RUNNING, closed KILLED (in the store the
    pipeline's tracker uses: ``MLFLOW_TRACKING_URI``, else the project's file)."""
    from mlflow import MlflowClient

    from config.environment import tracking_uri

    client = MlflowClient(tracking_uri())
    experiments = [e.experiment_id for e in client.search_experiments()]
    running = client.search_runs(
        experiments,
        f"tags.prefect_flow_run_id = '{flow_run_id}' and attributes.status = 'RUNNING'",
    )
    for run in running:
        client.set_terminated(run.info.run_id, status="KILLED")
    return [run.info.run_id for run in running]
