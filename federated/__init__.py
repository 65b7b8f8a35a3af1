"""The federated engine: plain Python + PyTorch, no Prefect, no MLflow, no file writes.

Submodules are imported explicitly (``from federated.data import load_medmnist``) so that
importing one part never drags in the rest.
"""

__all__: list[str] = []
