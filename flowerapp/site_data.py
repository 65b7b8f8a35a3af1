"""A site's data file: MedMNIST's ``.npz`` layout, ``train_images``/``train_labels`` (what
the site trains on), ``test_images``/``test_labels`` (its held-out split, scored every
``eval.every`` rounds; may be empty) and, optionally, ``val_images``/``val_labels`` (its
validation split, for choosing the final model at the sites; empty when absent). An
official MedMNIST file is one. :func:`write_site_files` writes one such file per client of a partition."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from federated.data import DatasetInfo, MedMNISTData, Split, to_tensors

__all__ = ["SiteData", "SiteDataError", "load_site_data", "write_site_files"]

ARRAYS = ("train_images", "train_labels", "test_images", "test_labels")
OPTIONAL = ("val_images", "val_labels")


class SiteDataError(ValueError):
    """A site's data file that cannot be trained on: one line naming the file and why."""


@dataclass(frozen=True)
class SiteData:
    """A site's splits, uint8 images ``(N, H, W[, 3])`` and labels ``(N, L)``."""

    path: Path
    train: Split
    test: Split
    val: Split

    @property
    def channels(self) -> int:
        return 1 if self.train.images.ndim == 3 else int(self.train.images.shape[3])

    @property
    def size(self) -> int:
        return int(self.train.images.shape[1])

    def check_fits(self, *, channels: int, size: int, classes: int, multi_label: bool) -> None:
        """Refuse (one line) a model whose input or output does not fit this data."""
        if (self.channels, self.size) != (channels, size):
            raise SiteDataError(
                f"{self.path.name}: images are {self.size}x{self.size} with {self.channels} "
                f"channel(s); the task's model takes {size}x{size} with {channels}"
            )
        labels = self.train.labels
        if multi_label and labels.shape[1] != classes:
            raise SiteDataError(
                f"{self.path.name}: {labels.shape[1]} labels per image; the task has {classes}"
            )
        if not multi_label and (labels.shape[1] != 1 or labels.max(initial=0) >= classes):
            raise SiteDataError(
                f"{self.path.name}: labels up to {int(labels.max(initial=0))}; the task has "
                f"{classes} classes (0..{classes - 1})"
            )

    def tensors(
        self, info: DatasetInfo, device: torch.device | str = "cpu"
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """Both splits as the engine's tensors (:func:`federated.data.to_tensors`)."""
        return to_tensors(self.train, info, device=device), to_tensors(
            self.test, info, device=device
        )


def load_site_data(path: Path | str) -> SiteData:
    """Read and check a site's data file; :class:`SiteDataError` names what is wrong."""
    path = Path(path)
    try:
        with np.load(path) as archive:
            arrays = {name: archive[name] for name in archive.files if name in ARRAYS + OPTIONAL}
    except Exception as error:  # missing, not a zip, truncated, ...
        raise SiteDataError(
            f"{path}: not a readable .npz data file ({type(error).__name__}: {error})"
        ) from None
    missing = [name for name in ARRAYS if name not in arrays]
    if missing:
        raise SiteDataError(
            f"{path}: missing {', '.join(missing)}; a site file has {', '.join(ARRAYS)}"
        )
    if not all(name in arrays for name in OPTIONAL):
        empty = arrays["test_images"][:0]
        arrays |= {"val_images": empty, "val_labels": arrays["test_labels"][:0]}
    splits = {}
    for split in ("train", "test", "val"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.dtype != np.uint8 or images.ndim not in (3, 4):
            raise SiteDataError(
                f"{path}: {split}_images is {images.dtype} of shape {images.shape}; "
                "expected uint8 (N, H, W) or (N, H, W, 3)"
            )
        labels = labels.reshape(len(labels), -1) if labels.size else labels.reshape(0, 1)
        if len(labels) != len(images) or not np.issubdtype(labels.dtype, np.integer):
            raise SiteDataError(
                f"{path}: {split}_labels ({labels.dtype}, {len(labels)} rows) does not match "
                f"{split}_images ({len(images)} images): one integer label row per image"
            )
        splits[split] = Split(images=images, labels=labels.astype(np.int64))
    if len(splits["train"]) == 0:
        raise SiteDataError(f"{path}: train_images is empty; a site needs images to train on")
    for split in ("test", "val"):
        images = splits[split].images
        if len(images) and images.shape[1:] != splits["train"].images.shape[1:]:
            raise SiteDataError(f"{path}: {split}_images and train_images differ in shape")
    return SiteData(path=path, **splits)


def write_site_files(
    data: MedMNISTData,
    clients: list[np.ndarray],
    local_tests: list[np.ndarray],
    names: list[str],
    out_dir: Path,
) -> list[dict[str, Any]]:
    """One file per client (``<name>.npz``: its training part and local test split of
    ``data.train``) and ``sites.json``: each site's name, file, training-sample count (the
    count to register for it at the hub) and the file's SHA-256."""
    out_dir.mkdir(parents=True, exist_ok=True)
    train = data.train
    manifest = []
    for name, part, held in zip(names, clients, local_tests, strict=True):
        path = out_dir / f"{name}.npz"
        np.savez_compressed(
            path,
            train_images=train.images[part], train_labels=train.labels[part],
            test_images=train.images[held], test_labels=train.labels[held],
        )  # fmt: skip
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        manifest.append(
            {
                "name": name,
                "file": path.name,
                "samples": len(part),
                "test": len(held),
                "sha256": digest,
            }
        )
    (out_dir / "sites.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
