"""The Prefect server's automations that close what a dead worker leaves open.

1. Prefect's documented zombie-flow automation (docs.prefect.io, "Detect zombie flows"):
   a flow run that stops sending heartbeats for six heartbeat periods is marked Crashed.
   Workers send them every ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` seconds (the compose
   stack sets 30: a dead run is Crashed within 180 s). The same automation then runs the
   ``close-crashed-run/fedsieve`` deployment (:mod:`flows.crashed`) for it on a worker of
   its own pool (``fedsieve-ops``: no training worker need be left): its subflow runs
   Crashed, its MLflow runs KILLED. Only the pipeline's runs are watched; their subflows
   die with them and are closed with them.
2. For every pipeline run that crashed otherwise (its process died while the worker
   lived, and the worker reported it), the same closing run, on the Crashed event. A run
   the zombie automation crashed sends that event too; it is told apart by the message the
   zombie automation gave its state (:data:`ZOMBIE_MESSAGE`, matched negated, as Prefect's
   triggers allow), so each crash gets one closing run. Should a second one come all the
   same (a closing run started by hand), it finds the first and ends at once, closing
   nothing twice (:func:`flows.crashed.close_crashed_run`).

Why the zombie automation closes the run itself rather than leave it to the Crashed
event: the server orders events causally in memory (``prefect.server.events.ordering``),
and a Crashed event follows the run's earlier state event. After a restart of the whole
stack the server no longer knows it saw that event, so it holds the Crashed event as
"arrived early" for its 15-minute lookback before any automation sees it (measured:
``make container-faults``, docs/operations.md).

    python -m flows.automations        # once per server, after `prefect deploy --all`

Re-running replaces them (by name). The compose stack's ``deploy`` service runs it.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from prefect.automations import Automation
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState, RunDeployment
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

__all__ = ["CLOSE_DEPLOYMENT", "PIPELINE_FLOWS", "ZOMBIE_MESSAGE", "automations", "install"]

CLOSE_DEPLOYMENT = "close-crashed-run/fedsieve"
PIPELINE_FLOWS = ["pipeline-from-file", "pipeline"]  # the flows deployments run
# Six heartbeats (180 s at 30 s): longer than the two minutes a worker's calls are retried
# through a database outage (docker-compose.yml), during which no heartbeat reaches the
# server; three (Prefect's example) marked a live run Crashed after a 50 s outage.
MISSED_HEARTBEATS = 6
# the Crashed state's message the zombie automation sets: how the Crashed-event automation
# knows the crash is closed already (no *, ? or [ in it: Prefect matches it as a glob)
ZOMBIE_MESSAGE = "Flow run marked as crashed due to missing heartbeats."


def automations(heartbeat_s: int, close_deployment_id: str) -> list[Automation]:
    """The two automations, for workers that send a heartbeat every ``heartbeat_s``."""
    zombie = Automation(
        name="fedsieve: crash zombie flow runs",
        description=(
            f"A flow run silent for {MISSED_HEARTBEATS} heartbeats is dead: mark it Crashed "
            f"and run {CLOSE_DEPLOYMENT} for it."
        ),
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.*"},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            # the pipeline's runs only: a stage's subflow stops beating with its parent, and
            # the parent's closing run closes it (one closing run per crash, not one each)
            match_related=pipeline_flows(),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=MISSED_HEARTBEATS * heartbeat_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=ZOMBIE_MESSAGE,
            ),
            closing_run(close_deployment_id),
        ],
    )
    close = Automation(
        name="fedsieve: close a crashed run's subflows and MLflow runs",
        description=(
            f"Runs {CLOSE_DEPLOYMENT} for every pipeline run that crashed, but for those the "
            "zombie automation crashed and closes itself."
        ),
        trigger=EventTrigger(
            expect={"prefect.flow-run.Crashed"},
            match=ResourceSpecification(
                {
                    "prefect.resource.id": ["prefect.flow-run.*"],
                    "prefect.state-message": f"!{ZOMBIE_MESSAGE}",
                }
            ),
            match_related=pipeline_flows(),
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[closing_run(close_deployment_id)],
    )
    return [zombie, close]


def pipeline_flows() -> ResourceSpecification:
    """Events about runs of the pipeline's flows (a run's flow is a related resource)."""
    return ResourceSpecification(
        {"prefect.resource.role": "flow", "prefect.resource.name": PIPELINE_FLOWS}
    )


def closing_run(close_deployment_id: str) -> RunDeployment:
    """A run of the closing deployment for the flow run the triggering event is about (a
    proactive trigger's event is the last one its bucket saw: the run's last heartbeat)."""
    return RunDeployment(
        source="selected",
        deployment_id=close_deployment_id,
        parameters={"flow_run": "{{ event.resource.id }}"},
    )


def install(heartbeat_s: int) -> list[Automation]:
    """Create the automations on the current server, replacing any of the same name."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        close_id = str(client.read_deployment_by_name(CLOSE_DEPLOYMENT).id)
    created = []
    for automation in automations(heartbeat_s, close_id):
        with contextlib.suppress(ValueError):  # not there yet
            Automation.read(name=automation.name).delete()
        created.append(automation.create())
    return created


def main() -> None:
    from prefect.settings import get_current_settings

    heartbeat = get_current_settings().flows.heartbeat_frequency
    if heartbeat is None:
        raise SystemExit("PREFECT_FLOWS_HEARTBEAT_FREQUENCY is off: no heartbeat to watch")
    for automation in install(heartbeat):
        print(f"automation {automation.name!r}: {automation.id}")


if __name__ == "__main__":
    main()
