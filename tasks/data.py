"""Dataset tasks: a verified local file (downloaded when allowed), or the user's own
images, and their arrays."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from config.dataset import read_dataset as read_dataset_of
from config.params import DataParams
from federated.data import MedMNISTData, ensure_medmnist, load_medmnist

__all__ = [
    "data_root",
    "ensure_dataset",
    "load_dataset",
    "load_own_images",
    "load_verified_dataset",
    "read_dataset",
]


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


@task(name="load-own-images", cache_policy=NO_CACHE)
def load_own_images(data: DataParams, workdir: Path) -> MedMNISTData:
    """The user's own images, read and checked against their declared schema; what the
    reader noticed (images resized, mixed sizes) goes to the run's log as a warning."""
    dataset = read_dataset(data, workdir)
    for note in dataset.notes:
        get_run_logger().warning("%s: %s", data.own.path if data.own else data.dataset, note)
    return dataset


def read_dataset(data: DataParams, workdir: Path) -> MedMNISTData:
    """The run's dataset outside a flow (preflight, ``fedsieve sites``): the same checks."""
    return read_dataset_of(
        data, medmnist_root=data_root(data.root, workdir), workdir=workdir,
        progress=sys.stderr.isatty(),
    )  # fmt: skip


def load_verified_dataset(data: DataParams, workdir: Path) -> MedMNISTData:
    """Every stage's preamble: the user's own images, or the md5-checked MedMNIST file
    (downloaded when allowed) and its splits, as Prefect tasks."""
    if data.own is not None:
        return load_own_images(data, workdir)
    root = data_root(data.root, workdir)
    ensure_dataset(data.dataset, root, data.download, data.size)
    return load_dataset(data.dataset, root, data.size)
