"""Prefect flows: one per pipeline stage, the whole pipeline, the comparison grid, the
deployable pipeline and the FedStNN experiments. Flows only sequence tasks.

The process environment (telemetry off, PREFECT_HOME) is set by whoever starts the
process: the CLI's entry, ``prefect.yaml``'s job variables for workers, the image's ENV."""

__all__: list[str] = []
