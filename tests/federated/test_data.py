import dataclasses
import functools
import http.server
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from federated.data import (
    DataError,
    dataset_info,
    download_medmnist,
    ensure_medmnist,
    file_md5,
    list_datasets,
    load_medmnist,
    to_tensors,
)

VOLUME_FLAGS = (
    "organmnist3d", "nodulemnist3d", "adrenalmnist3d", "fracturemnist3d", "vesselmnist3d",
    "synapsemnist3d",
)  # fmt: skip


def test_2d_and_3d_flags_are_offered():
    flags = list_datasets()
    assert {"breastmnist", "retinamnist", "bloodmnist", "pneumoniamnist"} <= set(flags)
    assert set(VOLUME_FLAGS) <= set(flags)
    with pytest.raises(DataError, match="available: adrenalmnist3d, bloodmnist"):
        dataset_info("cifar10")


@pytest.mark.parametrize("flag", VOLUME_FLAGS)
def test_each_3d_flag_names_medmnists_file_url_and_md5_at_28_and_64_voxels(flag):
    from medmnist import INFO

    for size, suffix in [(28, ""), (64, "_64")]:
        info = dataset_info(flag, size)
        assert info.file_name == f"{flag}{suffix}.npz"
        assert (info.url, info.md5) == (INFO[flag][f"url{suffix}"], INFO[flag][f"MD5{suffix}"])
        assert info.is_volume and info.input_shape == (1, size, size, size)
        assert info.stored_shape == (size, size, size)
    with pytest.raises(DataError, match=f"{flag} is a 3-D set and exists at 28 and 64 voxels"):
        dataset_info(flag, 128)


def test_the_official_adrenalmnist3d_verifies_loads_and_becomes_c_d_h_w_tensors(adrenal_root):
    path = ensure_medmnist("adrenalmnist3d", adrenal_root, size=64, download=False)
    data = load_medmnist("adrenalmnist3d", adrenal_root, 64)
    few = dataclasses.replace(
        data.train, images=data.train.images[:3], labels=data.train.labels[:3]
    )

    images, targets = to_tensors(few, data.info)

    assert file_md5(path) == "17721accfe9fb005146a47d33bc54b2f"  # medmnist's MD5_64
    assert (len(data.train), len(data.val), len(data.test)) == (1188, 98, 298)
    assert data.train.images.shape == (1188, 64, 64, 64)
    assert np.bincount(data.train.targets).tolist() == [929, 259]  # normal, hyperplasia
    assert images.shape == (3, 1, 64, 64, 64) and targets.shape == (3,)
    expected = (data.train.images[2, 10, 20, 30] / 255.0 - 0.5) / 0.5
    assert images[2, 0, 10, 20, 30].item() == pytest.approx(expected)
    with pytest.raises(DataError, match="holds volumes: no 2-D image file"):
        data.info.image_schema()


def test_a_volume_file_of_the_wrong_shape_is_refused_naming_both(tmp_path):
    from medmnist import INFO

    counts = INFO["adrenalmnist3d"]["n_samples"]
    arrays = {}
    for split in ("train", "val", "test"):
        arrays[f"{split}_images"] = np.zeros((counts[split], 28, 28), dtype=np.uint8)  # 2-D
        arrays[f"{split}_labels"] = np.zeros((counts[split], 1), dtype=np.uint8)
    np.savez(tmp_path / "adrenalmnist3d.npz", **arrays)

    with pytest.raises(DataError, match=r"shape \(1188, 28, 28\).*expected \(1188, 28, 28, 28\)"):
        load_medmnist("adrenalmnist3d", tmp_path, 28)


def test_official_files_load_with_the_promised_shapes(medmnist_root):
    breast = load_medmnist(
        "breastmnist", ensure_medmnist("breastmnist", medmnist_root, download=False).parent
    )
    retina = load_medmnist("retinamnist", medmnist_root)

    assert (len(breast.train), len(breast.val), len(breast.test)) == (546, 78, 156)
    assert breast.info.n_channels == 1 and breast.info.n_classes == 2
    assert retina.train.images.shape == (1080, 28, 28, 3) and retina.info.n_classes == 5
    assert set(np.unique(retina.train.targets)) == {0, 1, 2, 3, 4}


def test_tensors_are_channels_first_and_normalised(medmnist_root):
    data = load_medmnist("retinamnist", medmnist_root)

    images, targets = to_tensors(data.test, data.info)

    assert images.shape == (400, 3, 28, 28) and images.dtype == torch.float32
    assert images.min() >= -1 and images.max() <= 1
    expected = (data.test.images[7, 3, 5, 2] / 255.0 - 0.5) / 0.5
    assert images[7, 2, 3, 5].item() == pytest.approx(expected)
    assert targets.dtype == torch.int64 and targets.shape == (400,)


def test_a_corrupt_file_is_refused_with_both_md5s(tmp_path, medmnist_root):
    data = (medmnist_root / "breastmnist.npz").read_bytes()
    (tmp_path / "breastmnist.npz").write_bytes(data[: len(data) // 2])  # a truncated download

    with pytest.raises(DataError, match="750601b1f35ba3300ea97c75c52ff8f6") as error:
        ensure_medmnist("breastmnist", tmp_path, download=False)
    assert "truncated" in str(error.value)


def test_a_missing_file_without_download_names_file_md5_and_url(tmp_path):
    with pytest.raises(DataError) as error:
        ensure_medmnist("breastmnist", tmp_path, download=False)

    message = str(error.value)
    assert "breastmnist.npz" in message and "750601b1f35ba3300ea97c75c52ff8f6" in message
    assert "zenodo.org" in message and "MEDMNIST_ROOT" in message


def test_a_wrong_shape_npz_is_a_clear_error(tmp_path):
    arrays = {f"{s}_images": np.zeros((3, 28, 28), np.uint8) for s in ("train", "val", "test")}
    arrays |= {f"{s}_labels": np.zeros((3, 1), np.uint8) for s in ("train", "val", "test")}
    np.savez(tmp_path / "breastmnist.npz", **arrays)

    with pytest.raises(
        DataError, match=r"train_images has shape \(3, 28, 28\).*expected \(546, 28, 28\)"
    ):
        load_medmnist("breastmnist", tmp_path)


def test_an_unreadable_npz_is_a_clear_error(tmp_path):
    (tmp_path / "breastmnist.npz").write_bytes(b"not a zip file")

    with pytest.raises(DataError, match="not a readable MedMNIST file"):
        load_medmnist("breastmnist", tmp_path)


@pytest.fixture
def file_server(medmnist_root, tmp_path):
    """A real HTTP server on loopback serving a copy of the official files."""
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(medmnist_root / "breastmnist.npz", served / "breastmnist.npz")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_download_fetches_and_verifies_the_file(file_server, tmp_path):
    info = dataclasses.replace(dataset_info("breastmnist"), url=f"{file_server}/breastmnist.npz")
    root = tmp_path / "root"

    path = download_medmnist(info, root, progress=False)

    assert path == root / "breastmnist.npz"
    assert file_md5(path) == info.md5
    assert len(load_medmnist("breastmnist", root).train) == 546


def test_a_download_with_the_wrong_md5_never_lands(file_server, tmp_path):
    info = dataclasses.replace(
        dataset_info("breastmnist"), url=f"{file_server}/breastmnist.npz", md5="0" * 32
    )
    root = tmp_path / "root"

    root.mkdir()
    with pytest.raises(DataError, match="expected 0000"):
        download_medmnist(info, root, progress=False)
    assert list(Path(root).iterdir()) == []  # a folder that was there stays


def test_an_unreachable_download_is_one_clear_error(tmp_path, monkeypatch):
    import federated.data as data_module

    def refuse(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(data_module.urllib.request, "urlopen", refuse)
    with pytest.raises(DataError, match=r"download failed.*750601b1f35ba3300ea97c75c52ff8f6"):
        ensure_medmnist("breastmnist", tmp_path / "new" / "root", download=True, progress=False)
    assert list(tmp_path.iterdir()) == []  # the folders it made for the file are gone


def test_digits_is_a_dataset_like_any_flag_with_a_seeded_stratified_split(tmp_path):
    # scikit-learn's real digits: no download, the root is not read
    assert "digits" in list_datasets()
    first, again = load_medmnist("digits", tmp_path), load_medmnist("digits", tmp_path)

    sizes = {name: len(getattr(first, name)) for name in ("train", "val", "test")}
    assert sizes == {"train": 1257, "val": 180, "test": 360}
    assert first.train.images.shape[1:] == (28, 28) and first.train.images.dtype == np.uint8
    assert np.array_equal(first.test.images, again.test.images)
    assert np.bincount(first.test.targets).min() >= 35  # every class in every split
    assert first.info.n_classes == 10 and first.info.task == "multi-class"
    assert ensure_medmnist("digits", tmp_path, download=False).name == "digits.csv.gz"
    assert file_md5(ensure_medmnist("digits", tmp_path)) == first.info.md5
