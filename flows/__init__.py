"""Prefect flows: one per pipeline stage, the whole pipeline, the comparison grid, the
deployable pipeline and the FedStNN experiments. Flows only sequence tasks."""

from fedsieve.env import configure_environment

configure_environment()  # telemetry off and PREFECT_HOME before Prefect loads (workers too)

__all__: list[str] = []
