"""A trained model applied to image files: what a hospital runs on a new scan.

An :class:`ImageClassifier` is the model's weights, its architecture's name and the
dataset's schema (:class:`~federated.data.DatasetInfo`: classes, channels, size, the
intensity policy, the normalisation). It reads a file with the reader that read the
training images (:mod:`federated.image_files`), brings it to a tensor with the training
code (:func:`~federated.data.to_tensors`), and answers one probability per class
(softmax; sigmoid per label for a multi-label task) and the predicted class.

Saved as a folder (:func:`save_classifier`): ``weights.pt`` (the state dict) and
``classifier.json`` (the rest), read back by :func:`load_classifier` with torch alone;
the MLflow model a run registers wraps that folder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from federated.data import DatasetInfo, Split, to_tensors
from federated.image_files import (
    DecodedImage,
    ImageFileError,
    decode_file,
    decode_image,
    refusal_as_line,
    suffix_of_content,
)
from federated.metrics import logits_of, probabilities_of
from federated.volume_files import DecodedVolume, decode_volume, decode_volume_bytes
from models import build_model

__all__ = [
    "CLASSIFIER_FILE",
    "WEIGHTS_FILE",
    "ImageClassifier",
    "Prediction",
    "load_classifier",
    "predicted_classes",
    "save_classifier",
]

CLASSIFIER_FILE = "classifier.json"
WEIGHTS_FILE = "weights.pt"


@dataclass(frozen=True)
class Prediction:
    """Class probabilities ``(N, C)`` and each image's predicted class name (a
    multi-label image: the labels at 0.5 or more, joined by ``;``)."""

    probabilities: np.ndarray
    classes: list[str]


@dataclass
class ImageClassifier:
    """A model and the schema its images are read in."""

    model: nn.Module
    model_name: str
    info: DatasetInfo

    def predict_images(self, images: np.ndarray | list[np.ndarray]) -> Prediction:
        """uint8 images already in the schema: ``(N, S, S[, 3])``, or a list of them."""
        images = self._stacked(images) if isinstance(images, list) else images
        labels = np.zeros((len(images), 1), dtype=np.int64)
        tensors, _ = to_tensors(Split(images=images, labels=labels), self.info)
        logits = logits_of(self.model, tensors) if len(images) else torch.zeros((0, 1))
        probabilities = probabilities_of(logits, self.info.multi_label)
        if not np.isfinite(probabilities).all():
            raise ValueError("the model's outputs are NaN or infinite: it cannot be applied")
        return Prediction(probabilities, predicted_classes(probabilities, self.info))

    def predict_bytes(self, files: list[bytes]) -> Prediction:
        """Image files' contents (PNG, JPEG, DICOM, ...: told apart by their bytes), or a
        volume model's NIfTI or multi-frame DICOM files' contents.
        :class:`~federated.image_files.ImageFileError` names the first unreadable one."""
        images = []
        for number, raw in enumerate(files, start=1):
            try:
                images.append(self._decoded_bytes(raw))
            except ImageFileError as error:
                kind = "volume" if self.info.is_volume else "image"
                raise ImageFileError(f"{kind} {number} of {len(files)}: {error}") from None
        return self.predict_images(images)

    def _decoded_bytes(self, raw: bytes) -> np.ndarray:
        if self.info.is_volume:
            return decode_volume_bytes(raw, self.info.volume_schema()).pixels
        return decode_image(raw, suffix_of_content(raw), self.info.image_schema())[0]

    def read(self, path: Path) -> np.ndarray:
        """One image file in the schema, told apart by its bytes as :meth:`predict_bytes`
        does, whatever its suffix; for a volume model one volume (a NIfTI, a multi-frame
        DICOM, a series folder) with the reader that read the training volumes
        (ImageFileError or OSError: why not)."""
        if self.info.is_volume:
            return decode_volume(path, self.info.volume_schema(), by_content=True).pixels
        return decode_file(path, self.info.image_schema(), by_content=True).pixels

    def read_or_refuse(self, path: Path) -> DecodedImage | DecodedVolume | str:
        """:meth:`read`'s whole reading (its size as read, its digest), or its refusal's
        one line."""
        if self.info.is_volume:
            schema = self.info.volume_schema()
            return refusal_as_line(decode_volume, path, schema, by_content=True)
        return refusal_as_line(decode_file, path, self.info.image_schema(), by_content=True)

    def predict_files(self, paths: list[Path]) -> Prediction:
        return self.predict_images([self.read(path) for path in paths])

    def _stacked(self, images: list[np.ndarray]) -> np.ndarray:
        shape = self.info.stored_shape
        return np.stack(images) if images else np.zeros((0, *shape), dtype=np.uint8)


def predicted_classes(probabilities: np.ndarray, info: DatasetInfo) -> list[str]:
    """The class with the highest probability; for a multi-label task every label at 0.5
    or more, joined by ``;`` (an empty string: none)."""
    if info.multi_label:
        return [
            ";".join(info.labels[i] for i in np.flatnonzero(row >= 0.5)) for row in probabilities
        ]
    return [info.labels[i] for i in probabilities.argmax(axis=1)] if len(probabilities) else []


def save_classifier(folder: Path, model: nn.Module, model_name: str, info: DatasetInfo) -> Path:
    """Write the classifier's folder (weights and description); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / WEIGHTS_FILE)
    description = {"model": model_name, "dataset": _info_fields(info)}
    (folder / CLASSIFIER_FILE).write_text(json.dumps(description, indent=2) + "\n")
    return folder


def load_classifier(folder: Path) -> ImageClassifier:
    """The classifier a folder holds (ValueError: what is missing or wrong)."""
    try:
        description = json.loads((folder / CLASSIFIER_FILE).read_text())
        info = DatasetInfo(**_info_from_json(description["dataset"]))
        state = torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"{folder}: not a fedsieve classifier ({type(error).__name__}: {error}); it holds "
            f"{CLASSIFIER_FILE} and {WEIGHTS_FILE}"
        ) from None
    model = build_model(
        description["model"], in_channels=info.n_channels, num_classes=info.n_classes,
        image_size=info.size,
    )  # fmt: skip
    model.load_state_dict(state)
    model.eval()
    return ImageClassifier(model=model, model_name=description["model"], info=info)


def _info_fields(info: DatasetInfo) -> dict[str, Any]:
    """The schema's fields as JSON values (the download fields left out)."""
    fields = asdict(info)
    for unused in ("url", "md5", "n_samples"):
        fields.pop(unused)
    return fields


def _info_from_json(fields: dict[str, Any]) -> dict[str, Any]:
    return fields | {
        "labels": tuple(fields["labels"]),
        "percentiles": tuple(fields["percentiles"]),
        "url": "",
        "md5": "",
        "n_samples": {},
    }
