"""Dataset tasks: a verified local file (downloaded when allowed) and its arrays."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from config.params import DataParams
from federated.data import MedMNISTData, ensure_medmnist, load_medmnist

__all__ = ["data_root", "ensure_dataset", "load_dataset", "load_verified_dataset"]


def data_root(configured: str, workdir: Path) -> Path:
    """``MEDMNIST_ROOT`` when set, else ``data.root`` (relative to the project)."""
    root = Path(os.environ.get("MEDMNIST_ROOT") or configured)
    return root if root.is_absolute() else workdir / root


@task(name="ensure-dataset", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def ensure_dataset(flag: str, root: Path, download: bool, size: int = 28) -> Path:
    return ensure_medmnist(flag, root, size=size, download=download, progress=sys.stderr.isatty())


@task(name="load-dataset", cache_policy=NO_CACHE)
def load_dataset(flag: str, root: Path, size: int = 28) -> MedMNISTData:
    return load_medmnist(flag, root, size)


def load_verified_dataset(data: DataParams, workdir: Path) -> MedMNISTData:
    """Every stage's preamble: the md5-checked file (downloaded when allowed), then its
    splits, as two Prefect tasks."""
    root = data_root(data.root, workdir)
    ensure_dataset(data.dataset, root, data.download, data.size)
    return load_dataset(data.dataset, root, data.size)
