"""Prefect flows: one per pipeline stage plus the whole pipeline. Flows only sequence
tasks; ``python -m flows.<stage>`` runs a stage the way dvc.yaml does."""

import fedsieve  # noqa: F401  (sets telemetry-off and PREFECT_HOME before Prefect loads)

__all__: list[str] = []
