"""A consortium's own volumes: a label table whose rows name NIfTI files, multi-frame
DICOM files and series folders, written from the real AdrenalMNIST3D, read as the
volumes they were written from, fingerprinted over every slice file, decoded in parallel
and cached like images."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from pydicom import dcmread

from config.dataset import dataset_info_of
from config.params import ConfigError, load_params, validate_params
from federated.data import DataError, DatasetInfo, MedMNISTData, Split, load_medmnist
from federated.own_data import Reading, load_own_dataset, load_own_images
from federated.volume_writers import write_volume_folder

COUNT = 6  # train volumes: two of each form
SIZE = 32  # AdrenalMNIST3D's 64³ volumes, every second voxel: lean on CI's two cores


def schema(size: int = SIZE, **own: object) -> DatasetInfo:
    """The DatasetInfo params give for own AdrenalMNIST3D-like volumes at ``size`` voxels."""
    declared = {"path": "x", "task": "binary-class", "classes": ["normal", "hyperplasia"]}
    data = {"dataset": "adrenal-ct", "size": size, "own": declared | {"spatial_dims": 3} | own}
    return dataset_info_of(
        validate_params(
            {"data": data, "model": {"name": "small_cnn3d"}},
            "t",
        ).data
    )


@pytest.fixture(scope="module")
def adrenal(adrenal_root: Path) -> MedMNISTData:
    return load_medmnist("adrenalmnist3d", adrenal_root, 64)


@pytest.fixture(scope="module")
def folder(adrenal: MedMNISTData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two train volumes of each form and two test volumes, a label table naming them."""
    root = tmp_path_factory.mktemp("adrenal-ct")
    splits = {
        "train": Split(halved(adrenal.train.images[:COUNT]), adrenal.train.labels[:COUNT]),
        "test": Split(halved(adrenal.test.images[:2]), adrenal.test.labels[:2]),
    }
    write_volume_folder(root, splits, adrenal.info.labels)
    return root


def halved(volumes: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(volumes[:, ::2, ::2, ::2])


def test_a_table_of_nifti_multiframe_and_series_reads_back_the_volumes_written(
    folder: Path, adrenal: MedMNISTData
) -> None:
    data = load_own_dataset(folder, schema())

    # AdrenalMNIST3D's masks are 0 and 255: stored as HU, each volume's range is 0..255 again
    np.testing.assert_array_equal(data.train.images, halved(adrenal.train.images[:COUNT]))
    np.testing.assert_array_equal(data.test.images, halved(adrenal.test.images[:2]))
    np.testing.assert_array_equal(data.train.labels, adrenal.train.labels[:COUNT])
    assert data.train.images.shape == (COUNT, SIZE, SIZE, SIZE) and data.notes == ()


def test_the_fingerprint_covers_every_slice_file(folder: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    before = load_own_images(copy, schema()).sha256
    slice_file = copy / "train" / "00001" / "0015.dcm"  # one slice of a series folder
    dataset = dcmread(slice_file)
    pixels = dataset.pixel_array.copy()
    pixels[0, 0] += 1
    dataset.PixelData = pixels.tobytes()
    dataset.save_as(slice_file)

    after = load_own_images(copy, schema())

    assert after.sha256 != before and len(after.sha256) == 64


def test_volumes_decoded_in_parallel_equal_one_read_in_this_process(folder: Path) -> None:
    alone = load_own_images(folder, schema(), Reading(workers=1))
    parallel = load_own_images(folder, schema(), Reading(workers=2))

    np.testing.assert_array_equal(parallel.images, alone.images)
    assert parallel.sha256 == alone.sha256


def test_the_cache_serves_volumes_until_a_slice_or_a_setting_changes(
    folder: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    reading = Reading(cache=cache)
    first_read = load_own_images(folder, schema(), reading)
    (entry,) = cache.glob("*.npz")
    with np.load(entry) as stored:  # mark the entry: a read it serves gives the mark back
        np.savez(entry, images=255 - stored["images"], source_sizes=stored["source_sizes"])

    served = load_own_images(folder, schema(), reading)
    resampled = load_own_images(folder, schema(spacing="stretch", intensity="range"), reading)

    np.testing.assert_array_equal(served.images, 255 - first_read.images)
    assert served.sha256 == first_read.sha256
    assert len(list(cache.glob("*.npz"))) == 2 and resampled.sha256 == first_read.sha256


def test_volumes_at_another_size_are_resampled_and_counted(folder: Path) -> None:
    small = load_own_images(folder, schema(size=16))

    assert small.images.shape == (COUNT + 2, 16, 16, 16)
    assert small.size_note(16) == "8 volumes resampled to 16x16x16 (8 from 32x32x32)"


def test_a_row_that_is_not_a_volume_is_named_with_its_row(folder: Path, tmp_path: Path) -> None:
    table = tmp_path / "labels.csv"
    (tmp_path / "slice").mkdir()
    (tmp_path / "slice" / "0000.dcm").write_bytes(
        (folder / "train" / "00001" / "0000.dcm").read_bytes()
    )
    table.write_text("file,label\nslice,normal\n")

    with pytest.raises(DataError) as refused:
        load_own_images(table, schema())

    line = str(refused.value)
    assert f"{table}, row 2: slice: a series of a single slice (0000.dcm)" in line
    assert "\n" not in line


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["data.own.spatial_dims=3", "data.own.channels=3"], "volumes are grey"),
        (["data.own.spatial_dims=3", "data.size=512"], "own volumes are resampled to 8..256"),
        (["data.own.spatial_dims=3", "data.own.spacing=nearest"], "data.own.spacing"),
        (["data.own.spatial_dims=3", "data.own.slice_tolerance=2"], "slice_tolerance"),
        (["data.own.spatial_dims=3", "model.name=small_cnn"], "allowed: "),
        (["data.own.spatial_dims=3", "data.own.resample=bicubic"], "data.own.resample"),
        (["model.name=small_cnn", "data.own.spacing=stretch"], "spatial_dims is 2"),
    ],
)
def test_a_volume_schema_that_cannot_hold_is_refused_in_one_line(
    project: Path, overrides: list[str], says: str
) -> None:
    own = ["data.dataset=adrenal-ct", "data.own={path: x, task: binary-class, classes: [a, b]}"]
    model = [] if any(o.startswith("model.") for o in overrides) else ["model.name=small_cnn3d"]

    with pytest.raises(ConfigError) as refused:
        load_params(project / "params.yaml", [*own, *model, *overrides])

    assert says in str(refused.value) and "\n" not in str(refused.value).strip()
