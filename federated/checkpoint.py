"""The server's checkpoint: its state after a round, the params hash it was trained
under, its MLflow run and torch's random state, written atomically. The train stage and a
Flower hub's ServerApp write the same file, so ``--resume`` reads either."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from federated.server import ServerState

__all__ = ["read_checkpoint", "save_checkpoint"]


def save_checkpoint(path: Path, *, state: ServerState, digest: str, run_id: str | None) -> None:
    """Atomic: a kill during the write leaves the previous round's checkpoint intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "params_hash": digest,
            "run_id": run_id,
            "state": state.to_dict(),
            "torch_rng": torch.get_rng_state(),
        },
        tmp,
    )
    tmp.replace(path)


def read_checkpoint(path: Path, digest: str) -> dict[str, Any] | None:
    """The checkpoint at ``path`` if there is one written under params hash ``digest``."""
    if not path.exists():
        return None
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return checkpoint if checkpoint["params_hash"] == digest else None
