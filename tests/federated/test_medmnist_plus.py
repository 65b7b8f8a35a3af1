"""MedMNIST+ (64, 128, 224 px): medmnist's own file names and md5s, the same download-and-
verify path, and models and the batched backend at those sizes. The real files cannot be
downloaded on these machines, so a fabricated file of the right shape is served on loopback
and registered under a test-only md5 table (the ``breastmnist_64`` fixture, conftest.py)."""

import pytest
import torch

from config.params import ConfigError, eval_batch_size, validate_params
from federated.batched import auto_max_parallel
from federated.data import DataError, dataset_info, ensure_medmnist, file_md5, load_medmnist
from models import build_model
from tasks.data import data_root, ensure_dataset


def test_each_size_names_medmnists_own_file_url_and_md5():
    from medmnist import INFO

    for size, suffix in [(28, ""), (64, "_64"), (128, "_128"), (224, "_224")]:
        info = dataset_info("pneumoniamnist", size)
        assert info.file_name == f"pneumoniamnist{suffix}.npz"
        assert info.url == INFO["pneumoniamnist"][f"url{suffix}"]
        assert info.md5 == INFO["pneumoniamnist"][f"MD5{suffix}"]
    with pytest.raises(DataError, match="allowed: 28, 64, 128, 224"):
        dataset_info("breastmnist", 32)
    with pytest.raises(DataError, match="digits exists at 28 pixels only"):
        dataset_info("digits", 64)


def test_a_larger_size_downloads_verifies_and_loads_like_28_px(breast_64, tmp_path):
    root = tmp_path / "root"

    path = ensure_medmnist("breastmnist", root, size=64, progress=False)
    data = load_medmnist("breastmnist", root, size=64)

    assert path == root / "breastmnist_64.npz" and file_md5(path) == file_md5(breast_64.path)
    assert data.train.images.shape == (546, 64, 64) and data.info.size == 64
    assert not (root / "breastmnist.npz").exists()  # the 28 px file is another file


def test_a_file_of_the_wrong_size_is_refused_naming_both_shapes(breast_64, tmp_path):
    breast_64.fabricate(tmp_path / "breastmnist_64.npz", 28)

    with pytest.raises(DataError, match=r"shape \(546, 28, 28\).*expected \(546, 64, 64\)"):
        load_medmnist("breastmnist", tmp_path, size=64)
    with pytest.raises(DataError, match="truncated or altered"):
        ensure_medmnist("breastmnist", tmp_path, size=64, download=False)


def test_params_choose_the_size_and_the_pipeline_loads_it(breast_64, tmp_path, monkeypatch):
    monkeypatch.delenv("MEDMNIST_ROOT", raising=False)
    params = validate_params(
        {"data": {"dataset": "breastmnist", "size": 64, "root": str(tmp_path / "data")}},
        "test",
    )

    root = data_root(params.data.root, tmp_path)  # what every stage's preamble does
    ensure_dataset.fn(params.data.dataset, root, params.data.download, params.data.size)
    data = load_medmnist(params.data.dataset, root, params.data.size)

    assert data.info.size == 64 and data.test.images.shape == (156, 64, 64)
    with pytest.raises(ConfigError, match=r"data\.size"):
        validate_params({"data": {"size": 100}}, "test")


def test_the_default_scoring_batch_shrinks_with_the_pixel_count():
    sizes = {
        size: eval_batch_size(validate_params({"data": {"size": size}}, "test"))
        for size in (28, 64, 128, 224)
    }

    assert sizes == {28: 512, 64: 98, 128: 24, 224: 8}
    assert (
        eval_batch_size(
            validate_params({"data": {"size": 224}, "eval": {"batch_size": 64}}, "test")
        )
        == 64
    )


@pytest.mark.parametrize("size", [64, 128, 224])
@pytest.mark.parametrize("name", ["logreg", "small_cnn", "resnet18"])
def test_models_map_medmnist_plus_images_to_class_logits(name, size):
    model = build_model(name, in_channels=3, num_classes=5, image_size=size).eval()

    with torch.no_grad():
        logits = model(torch.randn(2, 3, size, size))

    assert logits.shape == (2, 5) and torch.isfinite(logits).all()


def test_resnets_use_the_standard_stem_from_64_px_and_the_cnn_keeps_its_head():
    small = build_model("resnet18", in_channels=1, num_classes=2, image_size=28)
    large = build_model("resnet18", in_channels=1, num_classes=2, image_size=64)

    assert (large.stem[0].kernel_size, large.stem[0].stride) == ((7, 7), (2, 2))
    assert isinstance(large.stem[3], torch.nn.MaxPool2d)
    assert (small.stem[0].kernel_size, small.stem[0].stride) == ((3, 3), (1, 1))
    cnn_params = {
        size: sum(
            p.numel()
            for p in build_model(
                "small_cnn", in_channels=1, num_classes=2, image_size=size
            ).parameters()
        )
        for size in (28, 224)
    }
    assert cnn_params[28] == cnn_params[224]  # the adaptive pool keeps the head's input 7x7


def test_fewer_clients_fit_in_a_batched_chunk_as_images_grow():
    model = build_model("small_cnn", in_channels=1, num_classes=2, image_size=224)
    fits = {
        size: auto_max_parallel(model, torch.zeros(1, 1, size, size), 32, budget_bytes=8 << 30)
        for size in (28, 64, 224)
    }

    assert fits[28] > fits[64] > fits[224] >= 1
