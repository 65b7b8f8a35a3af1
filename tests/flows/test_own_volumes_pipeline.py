"""A consortium's own volumes through the pipeline: real AdrenalMNIST3D volumes written as
hospitals store them (NIfTI files, DICOM series folders, enhanced multi-frame DICOM files)
and a label table, partitioned across three clients and trained on the small 3-D CNN;
the partition records the data's fingerprint, ``fedsieve predict`` reads a new series
folder, NIfTI and multi-frame file with the reader training used, and a later stage that
finds a slice changed refuses in one line. Registered as a run registers it, the served
model answers a NIfTI's, a zipped series' and a multi-frame file's bytes as ``predict``
read the files, and anything else with a 400 and one reason.

Lean on CI's two cores: 30 volumes, every second voxel of the official 64³ (32³)."""

from __future__ import annotations

import csv
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.exceptions import MlflowException
from pydicom import dcmread

from config.dataset import dataset_info_of
from config.errors import ConfigError
from config.params import load_params
from federated.data import DatasetInfo, Split, load_medmnist
from federated.inference import save_classifier
from federated.volume_writers import write_volume_folder
from fedsieve.cli import main
from flows.evaluate import evaluate_flow
from flows.partition import partition_flow
from flows.train import train_flow
from models import build_model
from tasks.tracking import Tracker, fluent_tracking_at

pytestmark = pytest.mark.e2e
SUBSET = {"train": 18, "val": 6, "test": 6}  # volumes per split, both classes in each


def own_volumes(adrenal_root: Path, folder: Path) -> tuple[str, ...]:
    """A seeded subset of AdrenalMNIST3D-64 at 32³, each volume in the next of the three
    forms, under ``folder`` with its ``labels.csv``; returns the class names."""
    official = load_medmnist("adrenalmnist3d", adrenal_root, 64)
    rng = np.random.default_rng(0)
    splits = {}
    for name, count in SUBSET.items():
        part = getattr(official, name)
        by_class = [np.flatnonzero(part.targets == c) for c in (0, 1)]
        rows = np.sort(np.concatenate([rng.choice(r, count // 2, replace=False) for r in by_class]))
        halved = np.ascontiguousarray(part.images[rows][:, ::2, ::2, ::2])
        splits[name] = Split(images=halved, labels=part.labels[rows])
    write_volume_folder(folder, splits, official.info.labels)
    return official.info.labels


def registered_model(root: Path, classifier: Path, info: DatasetInfo) -> Any:
    """``classifier`` logged and registered in a store under ``root`` as a run does it,
    loaded back as the pyfunc model ``mlflow models serve`` serves."""
    uri = f"sqlite:///{root / 'mlflow.db'}"
    tracker = Tracker("own-volumes", uri)
    tracker.start(run_id=None, run_name="volumes", tags={})
    version = tracker.log_model(classifier, info, registered_name="fedsieve-adrenal-ct")
    tracker.end()
    assert version is not None, tracker.failed
    with fluent_tracking_at(uri):
        return mlflow.pyfunc.load_model(f"models:/fedsieve-adrenal-ct/{version}")


def test_own_volumes_in_three_forms_partition_train_and_are_predicted(
    project: Path,
    prefect_server: str,
    adrenal_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = project / "adrenal-ct"
    classes = own_volumes(adrenal_root, folder)
    own = {"path": str(folder), "task": "binary-class", "classes": list(classes),
           "spatial_dims": 3}  # fmt: skip
    params = load_params(
        project / "params.yaml",
        [
            "data.dataset=adrenal-ct",
            f"data.own={json.dumps(own)}",
            "data.size=32",
            "model.name=small_cnn3d",
            "tracking.register_model=false",  # the gate would refuse 2 rounds: registered below
            "partition.num_clients=3",
            "partition.min_samples=4",
            "train.rounds=2",
            "train.local_epochs=1",
            "train.batch_size=4",
        ],
    )

    partition_flow(params, project)
    trained = train_flow(params, project)
    metrics = evaluate_flow(params, project)

    assert trained["rounds"] == 2 and 0 <= metrics["test_acc"] <= 1
    assert 0 <= metrics["test_auc"] <= 1
    partition = json.loads((project / "reports" / "partition.json").read_text())
    assert partition["dataset"] == "adrenal-ct" and len(partition["data_sha256"]) == 64
    assert partition["total"] + partition["local_test_total"] == SUBSET["train"]
    state = torch.load(project / "artifacts" / "model" / "model.pt", weights_only=True)
    assert state["features.0.weight"].shape[2:] == (3, 3, 3)  # a 3-D kernel

    # fedsieve predict reads a series folder, a NIfTI and a multi-frame file as training did
    classifier = tmp_path / "classifier"
    model = build_model("small_cnn3d", in_channels=1, num_classes=2, image_size=32)
    model.load_state_dict(state)
    save_classifier(classifier, model, "small_cnn3d", dataset_info_of(params.data))
    new = [folder / "test" / name for name in ("00000.nii.gz", "00001", "00002.dcm")]
    monkeypatch.chdir(project)
    given = [*map(str, new), str(folder / "test")]  # and a folder of volumes
    code = main(["predict", "--model", str(classifier), "--out", "p.csv", *given])
    with (project / "p.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert code == 0 and "9 volumes predicted by classifier" in capsys.readouterr().out
    in_folder = sorted(p for p in (folder / "test").iterdir())
    assert [row["file"] for row in rows] == list(map(str, [*new, *in_folder]))
    assert all(row["class"] in classes and not row["error"] for row in rows)

    # registered as a run registers it, the served model takes a volume's bytes
    served = registered_model(tmp_path, classifier, dataset_info_of(params.data))
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        for file in sorted(new[1].iterdir()):
            archive.write(file, f"series/{file.name}")
    bodies = [new[0].read_bytes(), zipped.getvalue(), new[2].read_bytes()]
    answered = served.predict(pd.DataFrame({"image": bodies}))
    assert list(answered["class"]) == [row["class"] for row in rows[:3]]  # as predict read them
    with pytest.raises(MlflowException) as refused:
        served.predict(pd.DataFrame({"image": [b"\x89PNG\r\n\x1a\n" + bytes(400)]}))
    assert refused.value.get_http_status_code() == 400
    assert str(refused.value.message).startswith("volume 1 of 1: not a volume: neither a NIfTI")

    slice_file = folder / "train" / "00001" / "0010.dcm"  # one slice of a series folder
    dataset = dcmread(slice_file)
    dataset.RescaleIntercept = -1000  # a slice re-exported with another rescale
    dataset.save_as(slice_file)
    with pytest.raises(ConfigError, match="the images changed since they were partitioned"):
        train_flow(params, project)
