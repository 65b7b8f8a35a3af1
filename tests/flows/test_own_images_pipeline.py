"""The whole pipeline on a folder of PNG images written from BreastMNIST: the same numbers
as on the official file, its images fingerprinted in the partition, and a folder changed
since its partition refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from config.errors import ConfigError
from config.params import load_params
from federated.data import load_medmnist
from federated.own_data import write_image_folder
from flows.pipeline import pipeline_flow
from flows.train import train_flow

SMALL = ["partition.num_clients=3", "train.local_epochs=1", "train.rounds=2"]
SCORES = ("test_acc", "test_auc", "test_loss", "test_ece", "test_brier")

pytestmark = pytest.mark.e2e


def own_overrides(folder: Path, classes: tuple[str, ...]) -> list[str]:
    schema = {"path": str(folder), "task": "binary-class", "classes": list(classes)}
    return [f"data.own={json.dumps(schema)}", "data.dataset=breast-folder"]


def test_a_png_folder_written_from_breastmnist_runs_to_the_files_numbers(
    project: Path, prefect_server: str, medmnist_root: Path
) -> None:
    breast = load_medmnist("breastmnist", medmnist_root)
    folder = project / "hospital-images"
    splits = {name: getattr(breast, name) for name in ("train", "val", "test")}
    write_image_folder(folder, splits, breast.info.labels)
    as_file = load_params(project / "params.yaml", SMALL)
    as_folder = load_params(
        project / "params.yaml", [*SMALL, *own_overrides(folder, breast.info.labels)]
    )

    from_file = pipeline_flow(as_file, project)
    from_folder = pipeline_flow(as_folder, project)

    for score in SCORES:
        assert from_folder[score] == pytest.approx(from_file[score], abs=1e-6), score
    partition = json.loads((project / "reports" / "partition.json").read_text())
    assert partition["dataset"] == "breast-folder" and len(partition["data_sha256"]) == 64
    assert MlflowClient().get_registered_model("fedsieve-breast-folder").latest_versions

    first = folder / "train" / "00000.png"
    first.write_bytes((folder / "train" / "00001.png").read_bytes())  # an image replaced
    with pytest.raises(ConfigError, match="the images changed since they were partitioned"):
        train_flow(as_folder, project)
