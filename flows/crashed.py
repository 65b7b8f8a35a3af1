"""What a dead process leaves open, closed: a flow run the server marked Crashed (Prefect's
zombie-flow automation, once its heartbeats stopped: a worker's container killed, its
machine lost) gets its subflow runs marked Crashed and its MLflow runs closed KILLED. An
automation runs this flow's deployment on a worker for every crashed pipeline run
(:mod:`flows.automations`); a later ``--resume`` or retry continues from the checkpoint.

No ``from __future__ import annotations``: Prefect validates the parameters against the
annotations (see flows/deployment.py).
"""

from typing import Any

from prefect import flow, get_run_logger

__all__ = ["close_crashed_run", "flow_run_id_of"]

RESOURCE_PREFIX = "prefect.flow-run."  # an event's resource id: prefect.flow-run.<uuid>


def flow_run_id_of(resource: str) -> str:
    """The flow run id in an automation's ``{{ event.resource.id }}`` (or the bare id)."""
    return resource.removeprefix(RESOURCE_PREFIX)


@flow(name="close-crashed-run")
def close_crashed_run(flow_run: str) -> dict[str, Any]:
    """Mark the subflow runs of crashed ``flow_run`` Crashed and close the MLflow runs it
    opened (tagged ``prefect_flow_run_id``) KILLED; what was closed."""
    flow_run_id = flow_run_id_of(flow_run)
    subflows = _crash_unfinished_subflows(flow_run_id)
    killed = _kill_tracking_runs(flow_run_id)
    get_run_logger().info(
        "flow run %s: %d subflow run(s) marked Crashed, %d MLflow run(s) closed KILLED",
        flow_run_id, len(subflows), len(killed),
    )  # fmt: skip
    return {"flow_run": flow_run_id, "subflow_runs": subflows, "mlflow_runs": killed}


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
