import pytest
import torch

from federated.seeding import seeded_init
from federated.vectors import layout_of, model_to_vector, vector_to_model_
from models import build_model, list_models
from registry import RegistryError

IMAGE_MODELS = ["logreg", "resnet18", "resnet34", "resnet50", "small_cnn"]


def test_registry_lists_the_image_models():
    assert set(IMAGE_MODELS) <= set(list_models())


@pytest.mark.parametrize("name", IMAGE_MODELS)
@pytest.mark.parametrize(("channels", "classes"), [(1, 2), (3, 5), (3, 14)])
def test_models_map_28x28_images_to_class_logits(name, channels, classes):
    model = build_model(name, in_channels=channels, num_classes=classes).eval()

    with torch.no_grad():
        logits = model(torch.randn(2, channels, 28, 28))

    assert logits.shape == (2, classes)
    assert torch.isfinite(logits).all()


def test_resnet18_matches_the_medmnist_adaptation():
    model = build_model("resnet18", in_channels=3, num_classes=2)

    stem = model.stem[0]
    assert (stem.kernel_size, stem.stride) == ((3, 3), (1, 1))
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(11.17e6, rel=0.01)


def test_group_norm_variant_has_no_running_statistics():
    model = build_model("resnet18", in_channels=1, num_classes=2, norm="group")

    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert all(not name.endswith("running_mean") for name in model.state_dict())


def test_unknown_model_or_parameter_lists_what_exists():
    with pytest.raises(RegistryError, match=r"available: .*resnet18.*small_cnn"):
        build_model("vgg16", in_channels=1, num_classes=2)
    with pytest.raises(RegistryError, match="accepted: in_channels, num_classes, width, hidden"):
        build_model("small_cnn", in_channels=1, num_classes=2, depth=3)


def test_seeded_init_is_reproducible_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = seeded_init(7, lambda: build_model("small_cnn", in_channels=1, num_classes=2))
    b = seeded_init(7, lambda: build_model("small_cnn", in_channels=1, num_classes=2))
    c = seeded_init(8, lambda: build_model("small_cnn", in_channels=1, num_classes=2))

    assert torch.equal(model_to_vector(a), model_to_vector(b))
    assert not torch.equal(model_to_vector(a), model_to_vector(c))
    assert torch.equal(torch.get_rng_state(), before)


def test_vector_round_trip_covers_float_state_including_batchnorm_buffers():
    model = build_model("resnet18", in_channels=1, num_classes=2)
    layout = layout_of(model)
    vector = torch.arange(layout.size, dtype=torch.float32)

    vector_to_model_(model, vector)

    assert torch.equal(model_to_vector(model), vector)
    assert "stem.1.running_var" in layout.slices()
    assert not any(name.endswith("num_batches_tracked") for name in layout.names)
    with pytest.raises(ValueError, match="entries"):
        vector_to_model_(model, vector[:-1])


def test_logistic_regression_is_one_linear_map_of_the_pixels():
    model = build_model("logreg", in_channels=1, num_classes=10, image_size=8)
    images = torch.randn(4, 1, 8, 8)

    logits = model(images)

    expected = images.flatten(1) @ model.linear.weight.T + model.linear.bias
    assert torch.allclose(logits, expected)
    assert sum(p.numel() for p in model.parameters()) == 64 * 10 + 10


VOLUME_MODELS = ["resnet18_3d", "resnet50_3d", "small_cnn3d"]


def test_volume_models_are_listed_apart_from_image_models():
    from models import model_spatial_dims

    assert list_models(3) == VOLUME_MODELS
    assert set(IMAGE_MODELS) == set(list_models(2))
    assert {model_spatial_dims(n) for n in VOLUME_MODELS} == {3}
    with pytest.raises(RegistryError, match="available: logreg"):
        model_spatial_dims("vgg16")


@pytest.mark.parametrize("size", [28, 64])
def test_the_small_3d_cnn_maps_volumes_at_both_sizes_to_logits_and_trains(size):
    model = build_model("small_cnn3d", in_channels=1, num_classes=3, image_size=size)
    volumes = torch.randn(2, 1, size, size, size)  # (B, C, D, H, W)

    logits = model(volumes)
    logits.sum().backward()

    assert logits.shape == (2, 3)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(0.1e6, rel=0.05)


def test_resnet18_3d_is_the_medmnist_2d_resnet18_with_every_kernel_made_3d():
    # MedMNIST3D/models.py through ACSConv's Conv3dConverter: k x k -> k x k x k, BatchNorm3d
    flat = build_model("resnet18", in_channels=1, num_classes=2)
    volume = build_model("resnet18_3d", in_channels=1, num_classes=2, image_size=64)

    convs_2d = [m for m in flat.modules() if isinstance(m, torch.nn.Conv2d)]
    convs_3d = [m for m in volume.modules() if isinstance(m, torch.nn.Conv3d)]
    assert [(m.kernel_size[0], m.stride[0]) for m in convs_3d] == [
        (m.kernel_size[0], m.stride[0]) for m in convs_2d
    ]
    assert all(len(set(m.kernel_size)) == 1 for m in convs_3d)  # cubic kernels
    assert (convs_3d[0].kernel_size, convs_3d[0].stride) == ((3, 3, 3), (1, 1, 1))  # at 64 too
    assert not any(isinstance(m, (torch.nn.MaxPool3d, torch.nn.Conv2d)) for m in volume.modules())
    assert any(isinstance(m, torch.nn.BatchNorm3d) for m in volume.modules())
    conv_weights = sum(m.weight.numel() for m in convs_2d)
    others = sum(p.numel() for p in flat.parameters()) - conv_weights
    expected = others + sum(m.weight.numel() * m.kernel_size[0] for m in convs_2d)
    assert sum(p.numel() for p in volume.parameters()) == expected
    with torch.no_grad():
        assert volume.eval()(torch.randn(1, 1, 8, 8, 8)).shape == (1, 2)
