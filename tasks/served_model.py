"""The model a run registers: an MLflow pyfunc model that takes image files and answers
class probabilities, served by ``mlflow models serve`` and loaded with
``mlflow.pyfunc.load_model("models:/fedsieve-<dataset>@champion")``.

It wraps a classifier folder (:mod:`federated.inference`): the weights, the architecture's
name and the dataset's schema. Reading a file is the training reader's code
(:mod:`federated.image_files`), not a copy of it, so the package must be installed where
the model is loaded (``--env-manager local``).

Input: a table with a column ``image`` (a file's bytes: PNG, JPEG, DICOM, ...; base64 in
a REST request) or ``path`` (a file on the serving machine, read only where
``FEDSIEVE_MODEL_READS_PATHS=1``: a caller could otherwise learn which files exist
there), one image a row. A volume model (:mod:`federated.volume_files`) takes a NIfTI
file's, a multi-frame DICOM's or a zip of one DICOM series' bytes in the same column,
one volume a row. Output:
``class`` (the predicted class name) and one column ``p(<class>)`` per class. A file that
cannot be read is an error naming the image and why: a 400 reply when served.
"""

from __future__ import annotations

import gzip
import io
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

from federated.data import DatasetInfo
from federated.image_files import ImageFileError
from federated.inference import CLASSIFIER_FILE, ImageClassifier, Prediction, load_classifier

__all__ = [
    "CLASSIFIER_ARTIFACT",
    "AppliedModel",
    "ImageModel",
    "input_example",
    "load_applied_model",
    "prediction_frame",
    "probability_column",
    "signature",
]

CLASSIFIER_ARTIFACT = "classifier"  # the classifier folder among the model's artifacts
INPUT_COLUMNS = ("image", "path")
# "1" where the model may read files on its machine that a row's path names (off unless set)
READS_PATHS = "FEDSIEVE_MODEL_READS_PATHS"
# written by MLflow beside a model it downloads from the registry: its name and version
REGISTERED_MODEL_META = "registered_model_meta"


@dataclass(frozen=True)
class AppliedModel:
    """A classifier to apply, with the registered name and version it came from (a
    folder's name and no version when it was never registered)."""

    classifier: ImageClassifier
    name: str
    version: str


MODEL_FORMS = "give a models:/ URI, a run's model (runs:/<id>/model) or a model folder"


def load_applied_model(spec: str) -> AppliedModel:
    """The model ``spec`` names: a ``models:/`` or ``runs:/`` URI (from the tracking
    store), an MLflow model folder (copied to a site: a folder downloaded from the
    registry names its model and version), or a classifier folder. ValueError: why not."""
    import mlflow.artifacts
    import yaml

    path = Path(spec).expanduser()
    if path.is_dir() and (path / CLASSIFIER_FILE).is_file():
        return AppliedModel(load_classifier(path), path.name, "")
    if ":" not in spec and not path.exists():  # a folder's name, not a URI
        raise ValueError(f"--model {spec}: no such folder; {MODEL_FORMS}")
    with tempfile.TemporaryDirectory(prefix="fedsieve-model-") as scratch:
        try:
            local = path if path.is_dir() else Path(
                mlflow.artifacts.download_artifacts(artifact_uri=spec, dst_path=scratch)
            )  # fmt: skip
            classifier = mlflow.pyfunc.load_model(str(local)).unwrap_python_model().classifier
        except Exception as error:  # no such model, store, folder; not a fedsieve model
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise ValueError(
                f"--model {spec}: not a fedsieve model that takes image files "
                f"({type(error).__name__}: {first[:200]}); {MODEL_FORMS}"
            ) from None
        meta_file = local / REGISTERED_MODEL_META
        meta = yaml.safe_load(meta_file.read_text()) if meta_file.is_file() else {}
    name = str(meta.get("model_name") or (path.name if path.is_dir() else spec))
    return AppliedModel(classifier, name, str(meta.get("model_version") or ""))


def probability_column(label: str) -> str:
    return f"p({label})"


def prediction_frame(prediction: Prediction, info: DatasetInfo) -> pd.DataFrame:
    """The model's answer: the predicted class and one probability column per class."""
    frame = pd.DataFrame({"class": prediction.classes})
    for index, label in enumerate(info.labels):
        frame[probability_column(label)] = prediction.probabilities[:, index]
    return frame


class ImageModel(mlflow.pyfunc.PythonModel):
    """The pyfunc model: image files in, class probabilities out."""

    def load_context(self, context: Any) -> None:
        self.classifier: ImageClassifier = load_classifier(
            Path(context.artifacts[CLASSIFIER_ARTIFACT])
        )

    def predict(self, context: Any, model_input: pd.DataFrame, params: Any = None) -> pd.DataFrame:
        files = [_file_bytes(row) for row in _rows(model_input)]
        try:
            prediction = self.classifier.predict_bytes(files)
        except ImageFileError as error:
            raise _bad_input(str(error)) from None
        return prediction_frame(prediction, self.classifier.info)


def _rows(model_input: pd.DataFrame) -> list[dict[str, Any]]:
    if not isinstance(model_input, pd.DataFrame) or not set(model_input) & set(INPUT_COLUMNS):
        raise _bad_input("the input is a table with a column image (a file's bytes) or path")
    return model_input.to_dict("records")


def _file_bytes(row: dict[str, Any]) -> bytes:
    """A row's file: its ``image`` bytes, else the file at its ``path``."""
    image = row.get("image")
    if isinstance(image, bytes | bytearray) and image:
        return bytes(image)
    path = row.get("path")
    if isinstance(path, str) and path:
        if os.environ.get(READS_PATHS) != "1":
            raise _bad_input(
                f"this model reads no paths: send the file's bytes (column image), "
                f"or set {READS_PATHS}=1 where it runs"
            )
        try:
            return Path(path).read_bytes()
        except OSError as error:
            raise _bad_input(f"{path}: {error.strerror or error}") from None
    raise _bad_input("a row has neither image bytes nor a path")


def _bad_input(message: str) -> Exception:
    """MLflow's error for bad input: the scoring server answers it with a 400."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


def signature(info: DatasetInfo) -> Any:
    """Input ``image`` (bytes) or ``path`` (text), output ``class`` and ``p(<class>)``."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    inputs = Schema(
        [ColSpec("binary", "image", required=False), ColSpec("string", "path", required=False)]
    )
    outputs = Schema(
        [ColSpec("string", "class")]
        + [ColSpec("double", probability_column(label)) for label in info.labels]
    )
    return ModelSignature(inputs=inputs, outputs=outputs)


def input_example(info: DatasetInfo) -> pd.DataFrame:
    """One PNG file of the schema's size (mid-grey), or for a volume model one NIfTI file
    of the schema's size: what a request carries."""
    from PIL import Image

    if info.is_volume:
        import nibabel

        volume = np.full((info.size,) * 3, 128, dtype=np.uint8)
        nifti = nibabel.Nifti1Image(volume, np.eye(4))
        return pd.DataFrame({"image": [gzip.compress(nifti.to_bytes(), mtime=0)]})

    shape = (info.size, info.size) + ((3,) if info.n_channels == 3 else ())
    out = io.BytesIO()
    Image.fromarray(np.full(shape, 128, dtype=np.uint8)).save(out, format="PNG")
    return pd.DataFrame({"image": [out.getvalue()]})
