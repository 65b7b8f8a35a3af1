"""docs/operations.md's fault table, from ``make container-faults``' JSON record
(scripts/container_faults.py): one row per fault, in the order they ran."""

from __future__ import annotations

from typing import Any

from benchmarks.evidence.tables.cells import table
from benchmarks.evidence.tables.records import results_json


def faults_block() -> str:
    """docs/operations.md's fault table, from ``make container-faults``' JSON record
    (scripts/container_faults.py): one row per fault, in the order they ran."""
    record = results_json("container-faults")
    rows = [
        (name, _injected(fault), _flow_run(fault), _mlflow_run(fault), _afterwards(fault))
        for name, fault in record.items()
        if isinstance(fault, dict)
    ]
    return table(("fault", "injected at", "flow run", "MLflow run", "afterwards"), rows)


def _injected(fault: dict[str, Any]) -> str:
    if "injected_at_round" not in fault:
        return "round 3" if "crashed_after_s" in fault else "round 12 (training done)"
    pace = f", {fault['round_s_before']:.1f} s a round" if "round_s_before" in fault else ""
    return f"round {fault['injected_at_round']}{pace}"


def _flow_run(fault: dict[str, Any]) -> str:
    if "crashed_after_s" in fault:
        return f"Crashed after {fault['crashed_after_s']:.0f} s"
    return str(fault.get("flow_run", "COMPLETED")).capitalize()


def _mlflow_run(fault: dict[str, Any]) -> str:
    if "mlflow_killed_after_s" in fault:
        return f"KILLED after {fault['mlflow_killed_after_s']:.0f} s"
    if fault.get("mlflow_run") not in (None, "FINISHED"):
        return f"{fault['mlflow_run']}, {fault.get('rounds_before_resume', '?')} rounds"
    return "FINISHED, every round, model version"


def _afterwards(fault: dict[str, Any]) -> str:
    said = []
    if "unhealthy_after_s" in fault:
        shown = ", ".join(f"{name} {after:.0f} s" if after is not None else f"{name} never"
                          for name, after in fault["unhealthy_after_s"].items())  # fmt: skip
        said.append(f"Docker showed the servers unhealthy after: {shown}")
    if "started_again_by_its_restart_policy" in fault:
        said.append("came back by itself" if fault["started_again_by_its_restart_policy"]
                    else "still down 10 s later; started again then")  # fmt: skip
    if fault.get("away_for_good_s"):
        said.append(f"MLflow down {fault['away_for_good_s']} s, then started again")
    if "subflow_runs" in fault:
        said.append("subflow runs " + ", ".join(sorted(set(fault["subflow_runs"].values()))))
    if "closing_runs" in fault:
        states = list(fault["closing_runs"].values())
        said.append(
            f"{len(states)} closing run(s) on the operations worker: "
            + ", ".join(f"{states.count(s)} {s.lower()}" for s in sorted(set(states)))
        )
    if fault.get("tracking_failed_midway"):
        said.append(
            "tracking failed midway and the lost rounds were logged when the store answered"
        )
    if "model_version_after_the_run" in fault:
        if not fault["model_version_after_the_run"]:
            said.append("no model version after the run (it failed in one line)")
        elif fault.get("tracking_failed_then_recovered"):
            said.append(
                "tracking failed in the evaluate stage; once MLflow answered, the final "
                "results and the model were logged again in the same run and registered"
            )
        else:
            said.append("model version registered by the run itself")
    if any(key.startswith("resumed") for key in fault):
        said.append("resumed into the same MLflow run: FINISHED, every round, model version")
    if "rounds_logged_after_outage" in fault:
        said.append(
            f"{fault['rounds_logged_after_outage']} round(s) logged after the store came back"
        )
    return "; ".join(said)
