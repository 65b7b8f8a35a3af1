"""The run's dataset from params: its description (opening no file) and its images.

Kept apart from :mod:`config.assembly` (the engine's parts) so that what reads data imports
only the data modules: the partition stage depends on these, not on the round loop.
"""

from __future__ import annotations

from pathlib import Path

from config.environment import image_cache_dir
from config.params import DataParams
from federated.data import (
    DataError,
    DatasetInfo,
    MedMNISTData,
    dataset_info,
    ensure_medmnist,
    load_medmnist,
)
from federated.own_data import Reading, load_own_dataset

__all__ = ["dataset_info_of", "read_dataset"]


def dataset_info_of(data: DataParams) -> DatasetInfo:
    """What the model and the sites need to know of the run's dataset (image size,
    channels, classes, task), from params alone: no data file is opened, so a hub that
    holds no images can build its model and its sites' task from it."""
    own = data.own
    if own is None:
        return dataset_info(data.dataset, data.size)
    return DatasetInfo(
        flag=data.dataset,
        task="multi-label, binary-class" if own.task == "multi-label" else own.task,
        n_channels=own.channels,
        n_classes=len(own.classes),
        labels=tuple(own.classes),
        url=own.path or "",
        md5="",  # the images' SHA-256 is taken where they are read
        n_samples={},
        size=data.size,
        mean=own.mean,
        std=own.std,
        resample=own.resample,
        intensity=own.intensity,
        percentiles=own.percentiles,
        spatial_dims=own.spatial_dims,
        spacing=own.spacing,
        slice_tolerance=own.slice_tolerance,
    )


def read_dataset(
    data: DataParams, *, medmnist_root: Path, workdir: Path, progress: bool = False
) -> MedMNISTData:
    """The run's dataset: the user's own images (``data.own.path``, relative to
    ``workdir``) read in their schema, or the md5-checked MedMNIST file under
    ``medmnist_root`` (downloaded when ``data.download`` allows)."""
    if data.own is not None:
        if data.own.path is None:
            raise DataError("data.own.path is not set: this machine holds none of the images")
        path = Path(data.own.path).expanduser()
        reading = Reading(cache=image_cache_dir(), progress=progress)
        return load_own_dataset(
            path if path.is_absolute() else workdir / path, dataset_info_of(data), reading=reading
        )
    ensure_medmnist(
        data.dataset, medmnist_root, size=data.size, download=data.download, progress=progress
    )
    return load_medmnist(data.dataset, medmnist_root, data.size)
