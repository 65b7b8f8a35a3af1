"""The server's checkpoint: its state after a round, the params hash it was trained
under, the digest of the code that trained it, its MLflow run and torch's random state,
written atomically. The train stage and a Flower hub's ServerApp write the same file, so
``--resume`` reads either.

A checkpoint resumes only under the params *and* the code that wrote it: DVC re-runs
``fedsieve train --resume`` because the code changed, and resuming the old code's rounds
would hand back the old code's numbers as the new baseline."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import torch

from federated.server import ServerState

__all__ = ["code_digest", "read_checkpoint", "save_checkpoint", "stale_checkpoint"]

# The packages whose source decides a run's numbers (the CLI, fedsieve/, does not).
ENGINE_PACKAGES = (
    "aggregation", "config", "federated", "flowerapp", "flows", "models", "registry", "tasks",
)  # fmt: skip
SOURCE_ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def code_digest(root: Path = SOURCE_ROOT) -> str:
    """sha256 of the engine packages' Python sources under ``root``, by path and content."""
    digest = hashlib.sha256()
    for package in ENGINE_PACKAGES:
        for source in sorted((root / package).rglob("*.py")):
            digest.update(source.relative_to(root).as_posix().encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def save_checkpoint(path: Path, *, state: ServerState, digest: str, run_id: str | None) -> None:
    """Atomic: a kill during the write leaves the previous round's checkpoint intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "params_hash": digest,
            "code": code_digest(),
            "run_id": run_id,
            "state": state.to_dict(),
            "torch_rng": torch.get_rng_state(),
        },
        tmp,
    )
    tmp.replace(path)


def stale_checkpoint(checkpoint: dict[str, Any], digest: str) -> str | None:
    """Why ``checkpoint`` cannot be resumed under params hash ``digest`` and this code."""
    if checkpoint["params_hash"] != digest:
        return f"the checkpoint is for other params (hash {checkpoint['params_hash']})"
    if checkpoint.get("code") != code_digest():
        return "the checkpoint was written by other code (its source digest differs)"
    return None


def read_checkpoint(path: Path, digest: str) -> dict[str, Any] | None:
    """The checkpoint at ``path`` if there is one written under params hash ``digest`` by
    this code."""
    if not path.exists():
        return None
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return checkpoint if stale_checkpoint(checkpoint, digest) is None else None
