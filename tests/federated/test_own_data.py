"""A consortium's own images: folders of PNG and DICOM files with a label table, read in
their declared schema, equal to the MedMNIST arrays they were written from; anything that
cannot be read is named in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from config.dataset import dataset_info_of
from config.params import ConfigError, validate_params
from federated.data import DataError, DatasetInfo, MedMNISTData, Split, load_medmnist, to_tensors
from federated.own_data import (
    Reading,
    load_own_dataset,
    load_own_images,
    read_image,
    write_image_folder,
)


def schema(**data: object) -> DatasetInfo:
    """The DatasetInfo params give for an own dataset (BreastMNIST's two classes, grey,
    28 px unless told)."""
    own = {"path": "x", "task": "binary-class", "classes": ["malignant", "normal, benign"]}
    own |= data.pop("own", {})  # type: ignore[arg-type]
    return dataset_info_of(
        validate_params({"data": {"dataset": "own", "own": own, **data}}, "t").data
    )


@pytest.fixture(scope="module")
def breast(medmnist_root: Path) -> MedMNISTData:
    return load_medmnist("breastmnist", medmnist_root)


def first(split: Split, count: int) -> Split:
    return Split(images=split.images[:count], labels=split.labels[:count])


@pytest.mark.parametrize("image_format", ["png", "dcm"])
def test_a_folder_written_from_medmnist_reads_back_as_the_same_arrays(
    tmp_path: Path, breast, image_format: str
) -> None:
    splits = {name: first(getattr(breast, name), 40) for name in ("train", "val", "test")}
    write_image_folder(tmp_path, splits, breast.info.labels, image_format=image_format)

    data = load_own_dataset(tmp_path, schema())

    for name, split in splits.items():
        assert np.array_equal(getattr(data, name).images, split.images)
        assert np.array_equal(getattr(data, name).labels, split.labels)
    assert len(data.sha256) == 64


def test_the_fingerprint_changes_when_an_image_changes(tmp_path: Path, breast) -> None:
    write_image_folder(tmp_path, {"train": first(breast.train, 5)}, breast.info.labels)
    before = load_own_images(tmp_path, schema()).sha256
    image = breast.train.images[0].copy()
    image[0, 0] ^= 1
    write_image_folder(tmp_path / "other", {"train": Split(image[None], breast.train.labels[:1])},
                       breast.info.labels)  # fmt: skip
    (tmp_path / "train" / "00000.png").write_bytes(
        (tmp_path / "other/train/00000.png").read_bytes()
    )
    assert load_own_images(tmp_path, schema()).sha256 != before


def test_rgb_images_are_resized_to_the_schema_and_normalised_by_its_mean_and_std(
    tmp_path: Path, medmnist_root: Path
) -> None:
    retina = load_medmnist("retinamnist", medmnist_root)
    write_image_folder(tmp_path, {"train": first(retina.train, 6)}, retina.info.labels)
    own = {"task": "multi-class", "classes": list(retina.info.labels), "channels": 3,
           "mean": 0.25, "std": 0.5}  # fmt: skip
    info = schema(size=32, own=own)

    data = load_own_images(tmp_path, info)
    images, _ = to_tensors(data.split("train"), info)

    assert data.images.shape == (6, 32, 32, 3) and data.splits is not None
    assert images.shape == (6, 3, 32, 32)
    assert float(images.min()) >= (0 - 0.25) / 0.5 and float(images.max()) <= (1 - 0.25) / 0.5
    grey = load_own_images(tmp_path, schema(own={"task": "multi-class",
                                                  "classes": list(retina.info.labels)}))  # fmt: skip
    assert grey.images.shape == (6, 28, 28)


def test_dicom_values_get_their_rescale_window_and_photometric_interpretation(
    tmp_path: Path,
) -> None:
    from pydicom import dcmread

    ramp = np.tile(np.arange(0, 256, 16, dtype=np.uint8), (16, 1))  # (16, 16)
    write_image_folder(
        tmp_path, {"train": Split(ramp[None], np.array([[0]]))}, ("a", "b"), image_format="dcm"
    )
    file = tmp_path / "train" / "00000.dcm"
    info = schema(size=16)
    assert np.array_equal(read_image(file, info), ramp)  # 8-bit: as stored

    dataset = dcmread(file)
    dataset.PhotometricInterpretation = "MONOCHROME1"
    dataset.save_as(file)
    assert np.array_equal(read_image(file, info), 255 - ramp)

    dataset.PhotometricInterpretation = "MONOCHROME2"
    dataset.RescaleSlope, dataset.RescaleIntercept = 2, -1000  # CT-like units, no window
    dataset.save_as(file)
    rescaled = read_image(file, info)
    assert rescaled.min() == 0 and rescaled.max() == 255  # by the image's own range

    dataset.WindowCenter, dataset.WindowWidth = -900, 100  # a narrow window: low values only
    dataset.save_as(file)
    windowed = read_image(file, info)
    assert windowed[:, 0].max() < windowed[:, -1].min()


def test_labels_are_class_names_or_indices_and_multi_label_rows_list_them(
    tmp_path: Path, breast
) -> None:
    write_image_folder(tmp_path, {"train": first(breast.train, 3)}, breast.info.labels)
    files = [f"train/{k:05d}.png" for k in range(3)]
    (tmp_path / "labels.csv").write_text(
        "file,label\n"
        + "\n".join(f"{f},{label}" for f, label in zip(files, ["a", "2", "a;c"], strict=True))
    )
    info = schema(own={"task": "multi-label", "classes": ["a", "b", "c"]})

    data = load_own_images(tmp_path, info)

    assert data.labels.tolist() == [[1, 0, 0], [0, 0, 1], [1, 0, 1]]
    assert data.splits is None and len(data.split("train")) == 3 and not len(data.split("test"))


def test_a_table_without_a_split_column_is_split_seeded_and_stratified(
    tmp_path: Path, breast
) -> None:
    write_image_folder(tmp_path, {"train": first(breast.train, 100)}, breast.info.labels)
    table = tmp_path / "labels.csv"
    table.write_text(
        "".join(line.rsplit(",", 1)[0] + "\n" for line in table.read_text().splitlines())
    )

    once, again = (load_own_dataset(tmp_path, schema()) for _ in range(2))

    assert (len(once.train), len(once.val), len(once.test)) == (70, 10, 20)
    assert np.array_equal(once.test.images, again.test.images)
    share = breast.train.labels[:100].mean()
    assert abs(once.test.labels.mean() - share) <= 0.05


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("file,label,split\ntrain/00000.png,1,train\nnone.png,malignant,train\n",
         "row 3: none.png: No such file"),
        ("file,label\ntrain/00000.png,cancer\n",
         "row 2: label 'cancer' is not a class; allowed: 'malignant', 'normal, benign' (or 0..1)"),
        ("file,label\ntrain/00000.png,0;1\n",
         "row 2: label '0;1'; a binary-class dataset has one class per image"),
        ("file,label,split\ntrain/00000.png,0,holdout\n",
         "row 2: split 'holdout'; allowed: train, val, test"),
        ("name,label\ntrain/00000.png,0\n",
         "columns are name, label; expected file, label and optionally split"),
        ("file,label\n", "no rows"),
        ("file,label\ntrain/00000.png,0\ntrain/00000.png,1\n",
         "row 3: train/00000.png is listed again (first on row 2)"),
        ("file,label\nbroken.png,0\n", "row 2: broken.png: not a readable image"),
        ("file,label\nnotes.txt,0\n", "row 2: notes.txt: unknown image type .txt"),
    ],
)  # fmt: skip
def test_what_cannot_be_read_is_named_in_one_line(
    tmp_path: Path, breast, table: str, message: str
) -> None:
    write_image_folder(tmp_path, {"train": first(breast.train, 1)}, breast.info.labels)
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "labels.csv").write_text(table)

    with pytest.raises(DataError) as error:
        load_own_images(tmp_path, schema())

    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_npz_in_medmnist_layout_is_checked_against_the_schema(tmp_path: Path, breast) -> None:
    good, rgb, pickled = tmp_path / "good.npz", tmp_path / "rgb.npz", tmp_path / "pickled.npz"
    np.savez(good, train_images=breast.train.images[:5], train_labels=breast.train.labels[:5])
    np.savez(
        rgb, train_images=np.zeros((2, 28, 28, 3), np.uint8), train_labels=np.zeros((2, 1), int)
    )
    np.savez(pickled, train_images=np.array([object()]), train_labels=np.zeros(1, int))

    assert len(load_own_dataset(good, schema()).train) == 5
    with pytest.raises(
        DataError,
        match=r"train_images is uint8 \(2, 28, 28, 3\); the schema takes uint8 \(N, 28, 28\)",
    ):
        load_own_images(rgb, schema())
    with pytest.raises(DataError, match=r"not a readable \.npz of arrays") as error:
        load_own_images(pickled, schema())
    assert "allow_pickle" not in str(error.value)
    with pytest.raises(DataError, match=r"no labels\.csv here"):
        load_own_images(tmp_path, schema())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"dataset": "breastmnist", "own": {"path": "x", "task": "binary-class", "classes": ["a", "b"]}},
         "not a MedMNIST flag"),
        ({"dataset": "mine", "own": {"path": "x", "task": "binary-class", "classes": ["a", "b", "c"]}},
         "a binary-class task has exactly two classes"),
        ({"dataset": "mine", "own": {"path": "x", "task": "multi-class", "classes": ["a", "a"]}},
         "must be distinct names"),
        ({"dataset": "mine", "size": 4, "own": {"path": "x", "task": "multi-label", "classes": ["a"]}},
         "data.size = 4: own images are resized to 8..1024 pixels"),
        ({"dataset": "breastmnist", "size": 32}, "data.size = 32: not a MedMNIST size"),
        ({"dataset": "mine", "own": {"task": "multi-label", "classes": ["a"], "intensity": "bright"}},
         """data.own.intensity = "bright": Input should be 'auto', 'window', 'range' or 'percentiles'"""),
        ({"dataset": "mine", "own": {"task": "multi-label", "classes": ["a"], "percentiles": [99, 1]}},
         "percentiles is [lower, upper] with 0 <= lower < upper <= 100"),
        ({"dataset": "mine", "own": {"task": "multi-label", "classes": ["a"]}},
         "data.own.path is not set: a simulation reads the images here"),
    ],
)  # fmt: skip
def test_a_schema_that_cannot_hold_is_refused_in_one_line(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        validate_params({"data": data}, "params.yaml")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_folder_decoded_in_parallel_equals_one_read_in_this_process(
    tmp_path: Path, breast
) -> None:
    write_image_folder(tmp_path / "png", {"train": first(breast.train, 30)}, breast.info.labels)
    write_image_folder(
        tmp_path / "dcm", {"train": first(breast.test, 30)}, breast.info.labels, image_format="dcm"
    )
    for folder in ("png", "dcm"):
        alone = load_own_images(tmp_path / folder, schema(), Reading(workers=1))
        parallel = load_own_images(tmp_path / folder, schema(), Reading(workers=2))
        assert np.array_equal(alone.images, parallel.images)
        assert alone.sha256 == parallel.sha256


def test_the_cache_serves_a_folder_until_a_file_or_a_setting_changes(
    tmp_path: Path, breast
) -> None:
    folder, cache = tmp_path / "images", tmp_path / "cache"
    write_image_folder(folder, {"train": first(breast.train, 12)}, breast.info.labels)
    reading = Reading(cache=cache)
    first_read = load_own_images(folder, schema(), reading)
    (entry,) = cache.glob("*.npz")
    with np.load(entry) as stored:  # mark the entry: a read it serves gives the mark back
        np.savez(entry, images=255 - stored["images"], source_sizes=stored["source_sizes"])

    assert np.array_equal(
        load_own_images(folder, schema(), reading).images, 255 - first_read.images
    )
    assert load_own_images(folder, schema(), reading).sha256 == first_read.sha256

    other = schema(own={"intensity": "range"})
    assert not np.array_equal(
        load_own_images(folder, other, reading).images, 255 - first_read.images
    )
    changed = breast.train.images[5].copy()
    changed[0, 0] ^= 1
    write_image_folder(tmp_path / "one", {"train": Split(changed[None], breast.train.labels[:1])},
                       breast.info.labels)  # fmt: skip
    (folder / "train" / "00000.png").write_bytes((tmp_path / "one/train/00000.png").read_bytes())
    again = load_own_images(folder, schema(), reading)
    assert again.sha256 != first_read.sha256
    assert np.array_equal(again.images[0], changed)
    assert np.array_equal(again.images[1:], first_read.images[1:])


def test_resized_images_are_counted_by_size_and_mixed_sizes_are_warned_of(
    tmp_path: Path, breast
) -> None:
    from PIL import Image

    write_image_folder(tmp_path, {"train": first(breast.train, 6)}, breast.info.labels)
    for index in range(4):  # four exported at 32 px
        path = tmp_path / "train" / f"{index:05d}.png"
        Image.open(path).resize((32, 32)).save(path)

    data = load_own_dataset(tmp_path, schema())
    every = load_own_images(tmp_path, schema(size=32))

    assert data.notes == (
        "4 images resized to 28x28 (4 from 32x32); warning: the images have mixed sizes, often "
        "the sign of a wrong export",
    )
    assert every.resized(32) == {"28x28": 2}


def test_a_progress_bar_shows_the_rate_and_the_time_left(tmp_path: Path, breast, capsys) -> None:
    write_image_folder(tmp_path, {"train": first(breast.train, 5)}, breast.info.labels)

    load_own_images(tmp_path, schema(), Reading(progress=True))

    bar = capsys.readouterr().err
    assert "reading images" in bar and "5/5" in bar and "image/s" in bar


def test_an_unreadable_file_among_many_is_named_with_the_count_of_the_others(
    tmp_path: Path, breast
) -> None:
    write_image_folder(tmp_path, {"train": first(breast.train, 8)}, breast.info.labels)
    for index in (2, 5, 7):
        (tmp_path / "train" / f"{index:05d}.png").write_bytes(b"not a png")

    with pytest.raises(DataError) as error:
        load_own_images(tmp_path, schema(), Reading(workers=2))

    assert "row 4: train/00002.png: not a readable image" in str(error.value)
    assert str(error.value).endswith("(and 2 more unreadable files)")


def test_the_cache_lives_where_the_environment_says_or_nowhere() -> None:
    from config.environment import image_cache_dir

    assert image_cache_dir({"FEDSIEVE_CACHE": "/data/cache"}) == Path("/data/cache")
    assert image_cache_dir({"FEDSIEVE_CACHE": "off"}) is None
    assert image_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/fedsieve/images")
    assert image_cache_dir({}) == Path.home() / ".cache" / "fedsieve" / "images"
