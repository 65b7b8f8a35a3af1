"""The engine on volumes: client-level DP (central and local) on real AdrenalMNIST3D
volumes with the small 3-D CNN, and the backdoor's cube trigger."""

import pytest
import torch

from aggregation import build_aggregator
from federated.attacks import build_attack
from federated.client import ClientData, LocalTraining
from federated.data import Split, load_medmnist, to_tensors
from federated.privacy import ClientPrivacy
from federated.seeding import seeded_init
from federated.server import Defence, EvaluationSets, Federation, FederationConfig
from models import build_model

CLIENTS, PER_CLIENT = 4, 6


@pytest.fixture(scope="module")
def volumes(adrenal_root):
    """The first 24 training and 8 test volumes of the official AdrenalMNIST3D-64, as
    (N, 1, 64, 64, 64) tensors."""
    data = load_medmnist("adrenalmnist3d", adrenal_root, 64)
    count = CLIENTS * PER_CLIENT
    train = Split(images=data.train.images[:count], labels=data.train.labels[:count])
    test = Split(images=data.test.images[:8], labels=data.test.labels[:8])
    return to_tensors(train, data.info), to_tensors(test, data.info)


def one_private_round(volumes, privacy):
    (images, targets), test = volumes
    clients = [
        ClientData(
            i, images[i * PER_CLIENT : (i + 1) * PER_CLIENT], targets[i * PER_CLIENT :][:PER_CLIENT]
        )
        for i in range(CLIENTS)
    ]
    model = seeded_init(
        0, lambda: build_model("small_cnn3d", in_channels=1, num_classes=2, image_size=64)
    )
    federation = Federation(
        model=model,
        clients=clients,
        local=LocalTraining(lr=0.05, batch_size=3),
        config=FederationConfig(rounds=1, seed=0),
        defence=Defence(rule=build_aggregator("fedavg"), privacy=privacy),
        evaluation=EvaluationSets(test=test),
    )
    start = federation.initial_state()
    state, _ = federation.run_round(start)
    return state.global_vector - start.global_vector, state


@pytest.mark.parametrize("mode", ["central", "local"])
def test_dp_fedavg_on_volumes_releases_at_most_the_clip_plus_its_noise(volumes, mode):
    # a clip far below a 3-D CNN's update norm and almost no noise: the model moves by the
    # mean of clipped updates (norm <= clip), the same in either mode
    privacy = ClientPrivacy(
        clip=0.01, noise_multiplier=1e-9, population=CLIENTS, per_round=CLIENTS, mode=mode
    )

    moved, state = one_private_round(volumes, privacy)

    assert 0.001 < moved.norm() <= 0.01 + 1e-6
    assert state.history[0]["privacy_epsilon"] == pytest.approx(privacy.epsilon(1))
    assert torch.isfinite(moved).all()


def test_the_backdoor_trigger_on_volumes_is_a_cube():
    backdoor = build_attack("backdoor", size=2, margin=1, position="bottom_right")
    volumes = torch.zeros(3, 1, 8, 8, 8)  # (N, C, D, H, W)

    stamped = backdoor.stamp(volumes)

    cube = torch.zeros(8, 8, 8)
    cube[1:3, 5:7, 5:7] = 1.0  # 2 slices from slice 1; rows and columns 5-6 (bottom right)
    assert all(torch.equal(volume[0], cube) for volume in stamped)
    assert torch.equal(volumes, torch.zeros_like(volumes))  # a copy
    with pytest.raises(ValueError, match="does not fit 2x8x8 volumes"):
        backdoor.stamp(torch.zeros(1, 1, 2, 8, 8))
