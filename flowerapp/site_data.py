"""A site's data: a folder of its own images, or volumes (NIfTI files, DICOM series
folders, multi-frame DICOM files), with a label table (:mod:`federated.own_data`, read
in the schema of the plan the site approved, with the reader training and the served
model use), or a file in MedMNIST's ``.npz`` layout, ``train_images``/``train_labels`` (what
the site trains on), ``test_images``/``test_labels`` (its held-out split, scored every
``eval.every`` rounds; may be empty) and, optionally, ``val_images``/``val_labels`` (its
validation split, for choosing the final model at the sites; empty when absent). An
official MedMNIST file is one. :func:`write_site_files` writes one such file per client of a partition."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from federated.data import DataError, DatasetInfo, MedMNISTData, Split, to_tensors
from federated.own_data import Reading, load_own_images, write_image_folder
from federated.volume_writers import VOLUME_FORMS, write_volume_folder

__all__ = [
    "IMAGE_FORMATS",
    "VOLUME_FORMATS",
    "SiteData",
    "SiteDataError",
    "load_site_data",
    "write_site_files",
]

ARRAYS = ("train_images", "train_labels", "test_images", "test_labels")
IMAGE_FORMATS = ("png", "dcm")  # a site's folder of 2-D images
VOLUME_FORMATS = (*VOLUME_FORMS, "volumes")  # of volumes; volumes: each site the next form
OPTIONAL = ("val_images", "val_labels")


class SiteDataError(ValueError):
    """A site's data file that cannot be trained on: one line naming the file and why."""


@dataclass(frozen=True)
class SiteData:
    """A site's splits, uint8 images ``(N, H, W[, 3])`` or volumes ``(N, D, H, W)``, and
    labels ``(N, L)``."""

    path: Path
    train: Split
    test: Split
    val: Split
    size_note: str | None = None  # images resized to the schema's size, and mixed sizes
    sha256: str = ""  # what the site trains on: its .npz file's, or its table's and files'

    def class_counts(self, split: str, classes: int) -> list[int]:
        """Images per class (per label, for a multi-label task) in ``split``: what the card
        says a site trained on, and the share a majority-class predictor scores on its
        held-out split; never an image."""
        labels = getattr(self, split).labels
        if labels.shape[1] == 1:
            return np.bincount(labels[:, 0], minlength=classes)[:classes].tolist()
        return labels.sum(axis=0).astype(np.int64).tolist()

    def check_fits(
        self, *, channels: int, size: int, classes: int, multi_label: bool, spatial_dims: int = 2
    ) -> None:
        """Refuse (one line) a model whose input or output does not fit this data: images
        ``(H, W[, 3])`` or volumes ``(D, H, W)`` at the task's size."""
        shape = self.train.images.shape[1:]
        expected = (size,) * spatial_dims + ((3,) if channels == 3 else ())
        if shape != expected:
            (kind, held), (_, taken) = _described(shape), _described(expected)
            raise SiteDataError(
                f"{self.path.name}: {kind} are {held} channel(s); the task's model takes {taken}"
            )
        labels = np.concatenate([s.labels for s in (self.train, self.val, self.test) if len(s)])
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


def _described(shape: tuple[int, ...]) -> tuple[str, str]:
    """What a sample's stored shape holds: ``("images", "28x28 with 3")``, ``("volumes",
    "16x16x16 with 1")`` (its sides, and its channels)."""
    colour = len(shape) == 3 and shape[2] == 3  # (H, W, 3); a volume (D, H, W) is grey
    spatial = shape[:2] if colour else shape
    kind = "volumes" if len(spatial) == 3 else "images"
    return kind, f"{'x'.join(map(str, spatial))} with {3 if colour else 1}"


def load_site_data(
    path: Path | str, schema: DatasetInfo | None = None, reading: Reading = Reading()
) -> SiteData:
    """Read and check a site's data: a folder of images (with ``labels.csv``) read in
    ``schema`` as ``reading`` says, or an ``.npz`` file; :class:`SiteDataError` names
    what is wrong."""
    path = Path(path)
    if path.suffix != ".npz":
        return _load_site_folder(path, schema, reading)
    try:
        raw = path.read_bytes()
        with np.load(io.BytesIO(raw), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files if name in ARRAYS + OPTIONAL}
    except Exception as error:  # missing, not a zip, truncated, pickled objects, ...
        raise SiteDataError(
            f"{path}: not a readable .npz file of arrays ({type(error).__name__}); a site's "
            "data is a folder with labels.csv or an .npz in MedMNIST's layout"
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
    return SiteData(path=path, **splits, sha256=hashlib.sha256(raw).hexdigest())


def _load_site_folder(path: Path, schema: DatasetInfo | None, reading: Reading) -> SiteData:
    """A folder's ``train``, ``val`` and ``test`` rows (every row trains when its table has
    no split column)."""
    if schema is None:
        raise SiteDataError(
            f"{path}: a folder of images is read in the schema of the approved plan; give --plan"
        )
    try:
        images = load_own_images(path, schema, reading)
    except DataError as error:
        raise SiteDataError(str(error)) from None
    splits = {name: images.split(name) for name in ("train", "val", "test")}
    if not len(splits["train"]):
        raise SiteDataError(f"{path}: no train rows; a site needs images to train on")
    return SiteData(
        path=path, **splits, size_note=images.size_note(schema.size), sha256=images.sha256
    )


def write_site_files(
    data: MedMNISTData,
    clients: list[np.ndarray],
    local_tests: list[np.ndarray],
    names: list[str],
    out_dir: Path,
    image_format: str = "npz",
) -> list[dict[str, Any]]:
    """One file per client (``<name>.npz``: its training part and local test split of
    ``data.train``), or with ``image_format`` ``png`` or ``dcm`` one folder of images with
    its ``labels.csv`` (a hospital's own data, for a pilot), or for volumes with ``nifti``,
    ``series`` or ``multiframe`` one folder of volumes in that form (``volumes``: each
    site the next form in turn), and ``sites.json``: each site's name, file,
    training-sample count (the count to register for it at the hub) and the data's SHA-256."""
    out_dir.mkdir(parents=True, exist_ok=True)
    train = data.train
    manifest = []
    for index, (name, part, held) in enumerate(zip(names, clients, local_tests, strict=True)):
        splits = {
            "train": Split(images=train.images[part], labels=train.labels[part]),
            "test": Split(images=train.images[held], labels=train.labels[held]),
        }
        if image_format == "npz":
            path = out_dir / f"{name}.npz"
            arrays = {f"{k}_{kind}": getattr(v, kind) for k, v in splits.items()
                      for kind in ("images", "labels")}  # fmt: skip
            np.savez_compressed(path, **arrays)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            path = out_dir / name
            if image_format in IMAGE_FORMATS:
                write_image_folder(path, splits, data.info.labels, image_format=image_format)
            else:
                forms = VOLUME_FORMS if image_format == "volumes" else (image_format,)
                form = forms[index % len(forms)]
                write_volume_folder(path, splits, data.info.labels, forms=(form,))
            digest = load_own_images(path, data.info).sha256
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
