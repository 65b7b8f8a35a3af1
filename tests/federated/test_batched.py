"""The batched backend trains every client exactly as the sequential one does.

Float32 agreement is held to a relative error of 1e-5 where float32 itself can promise
it. Deep ReLU networks have gradient kinks: a pre-activation within ~1e-6 of zero flips
sign under any change of convolution kernel, the gradient jumps, and later steps carry
the jump on. Two *sequential* float32 runs of the same ResNet-18 on tiny batches, one
with oneDNN convolutions and one without, differ by ~1e-3 after three steps at lr 0.01.
So the float32 ResNet test takes two local steps per client; runs with aggressive
settings (lr 0.05, momentum, weight decay, FedProx, two epochs of uneven batches of 3-4,
BatchNorm and GroupNorm) are checked in float64, where both backends agree to the last
float32 bit of the update. The exactness tests also run on CUDA where a GPU is present,
with cuDNN's TF32 convolutions turned off (they round to 10 mantissa bits, ~1e-3 a step).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from aggregation import build_aggregator, build_server_optimizer
from federated.batched import supports_batched, train_clients_batched
from federated.client import ClientData, ClientUpdate, LocalTraining, LocalWork, train_client
from federated.data import load_medmnist, to_tensors
from federated.metrics import loss_function
from federated.partition import build_partitioner
from federated.seeding import seeded_init
from federated.server import Defence, EvaluationSets, Execution, Federation, FederationConfig
from federated.vectors import layout_of, model_to_vector
from models import build_model

AGGRESSIVE = LocalTraining(
    epochs=2, lr=0.05, momentum=0.9, weight_decay=1e-3, batch_size=8, prox_mu=0.1
)


@pytest.fixture(
    params=[
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ),
    ]
)
def device(request: pytest.FixtureRequest) -> Iterator[torch.device]:
    """Each exactness test on the CPU and, where one is present, on a CUDA GPU (exact
    float32: no TF32 convolutions)."""
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        yield torch.device(request.param)


def make_clients(
    sizes: list[int],
    shape: tuple[int, int, int],
    num_classes: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> list[ClientData]:
    """Clients of the given sizes; the last one's labels are flipped (y -> C-1-y)."""
    generator = torch.Generator().manual_seed(0)
    clients = []
    for client_id, n in enumerate(sizes):
        targets = torch.randint(0, num_classes, (n,), generator=generator)
        if client_id == len(sizes) - 1:
            targets = num_classes - 1 - targets  # a label-flipping client
        images = torch.randn(n, *shape, generator=generator, dtype=dtype)
        clients.append(ClientData(10 + client_id, images.to(device), targets.to(device)))
    return clients


def both_backends(
    model: nn.Module,
    clients: list[ClientData],
    config: LocalTraining,
    max_parallel: int | None,
) -> tuple[list[ClientUpdate], list[ClientUpdate]]:
    start = model_to_vector(model)
    loss_fn = loss_function(False)
    seeds = [1000 + c.client_id for c in clients]
    sequential = [
        train_client(model, start, c, config, loss_fn, seed=s)
        for c, s in zip(clients, seeds, strict=True)
    ]
    batched = train_clients_batched(
        model, start, clients, config, loss_fn, seeds=seeds, max_parallel=max_parallel
    )
    return sequential, batched


def assert_same_updates(
    sequential: list[ClientUpdate], batched: list[ClientUpdate], rtol: float
) -> None:
    assert [u.client_id for u in batched] == [u.client_id for u in sequential]
    for s, b in zip(sequential, batched, strict=True):
        assert b.num_samples == s.num_samples
        error = float((b.delta - s.delta).norm() / s.delta.norm())
        assert error <= rtol, f"client {s.client_id}: relative error {error:.2e}"
        assert b.train_loss == pytest.approx(s.train_loss, rel=rtol)


@pytest.mark.parametrize(
    ("config", "max_parallel"),
    [
        (AGGRESSIVE, 3),  # chunks of 3, uneven last batches, momentum, decay, FedProx
        (LocalTraining(lr=0.05, momentum=0.0, batch_size=8), None),  # plain SGD, one chunk
    ],
)
def test_small_cnn_batched_updates_equal_sequential_ones(config, max_parallel, device):
    # sizes 3, 9, 17, 24, 30 at batch 8: 1 to 4 batches, the last ones of 3, 9 (8 + 1
    # merged), 9, 8 and 6 samples; chunks of 3 train clients of unequal batch counts together
    clients = make_clients([3, 9, 17, 24, 30], (1, 28, 28), num_classes=4, device=device)
    model = seeded_init(
        0, lambda: build_model("small_cnn", in_channels=1, num_classes=4, width=8, hidden=16)
    ).to(device)

    sequential, batched = both_backends(model, clients, config, max_parallel)

    assert_same_updates(sequential, batched, rtol=1e-5)


@pytest.mark.parametrize("name", ["small_cnn", "resnet18"])
def test_medmnist_plus_sized_models_train_the_same_batched(name, device):
    # 64 px: the CNN's adaptive pool (16 -> 7) and the ResNet's 7x7 stride-2 stem and max-pool;
    # float64, so the comparison is of the computation, not of float32 summation orders
    clients = make_clients([5, 9], (1, 64, 64), num_classes=3, dtype=torch.float64, device=device)
    settings = {"width": 4, "hidden": 8} if name == "small_cnn" else {"norm": "group", "groups": 8}
    model = seeded_init(
        0, lambda: build_model(name, in_channels=1, num_classes=3, image_size=64, **settings)
    ).to(device, torch.float64)
    config = LocalTraining(lr=0.05, momentum=0.9, batch_size=4)

    sequential, batched = both_backends(model, clients, config, max_parallel=2)

    assert_same_updates(sequential, batched, rtol=1e-9)


def test_volume_models_train_the_same_batched(device):
    # volumes (B, 1, 16, 16, 16): vmapped Conv3d, MaxPool3d and AdaptiveAvgPool3d; float64
    clients = make_clients(
        [5, 9], (1, 16, 16, 16), num_classes=3, dtype=torch.float64, device=device
    )
    model = seeded_init(
        0, lambda: build_model("small_cnn3d", in_channels=1, num_classes=3, width=4, hidden=8)
    ).to(device, torch.float64)
    config = LocalTraining(lr=0.05, momentum=0.9, batch_size=4)

    sequential, batched = both_backends(model, clients, config, max_parallel=2)

    assert_same_updates(sequential, batched, rtol=1e-9)


def test_resnet18_3d_batchnorm3d_updates_equal_sequential_ones(device):
    # MedMNIST's 3-D baseline (33M parameters) on 4x4x4 volumes: one step per client, so
    # BatchNorm3d's batch statistics and running averages are compared, not float32 drift
    clients = make_clients([3, 4], (1, 4, 4, 4), num_classes=2, device=device)
    model = seeded_init(0, lambda: build_model("resnet18_3d", in_channels=1, num_classes=2))
    model.to(device)
    config = LocalTraining(lr=0.01, momentum=0.9, batch_size=4)

    sequential, batched = both_backends(model, clients, config, max_parallel=2)

    assert_same_updates(sequential, batched, rtol=1e-5)


def test_resnet18_batchnorm_float32_updates_equal_sequential_ones(device):
    # one batch per epoch, two epochs: chunks of sizes 8 and 8 (one vmap call) and 12
    clients = make_clients([8, 8, 12], (1, 16, 16), num_classes=3, device=device)
    model = seeded_init(0, lambda: build_model("resnet18", in_channels=1, num_classes=3))
    model.to(device)
    config = LocalTraining(
        epochs=2, lr=0.01, momentum=0.9, weight_decay=1e-3, batch_size=12, prox_mu=0.1
    )

    sequential, batched = both_backends(model, clients, config, max_parallel=2)

    assert_same_updates(sequential, batched, rtol=1e-5)


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_resnet18_float64_updates_are_identical_under_aggressive_settings(norm, device):
    # 12x12 images keep ResNet-18 cheap (2x2 maps in the last stage); at batch 3 the
    # clients see batches of [4] (3 + 1 merged) and [3, 4]
    clients = make_clients([4, 7], (1, 12, 12), num_classes=3, dtype=torch.float64, device=device)
    model = seeded_init(
        0, lambda: build_model("resnet18", in_channels=1, num_classes=3, norm=norm, groups=8)
    ).to(device, torch.float64)
    config = LocalTraining(
        epochs=2, lr=0.05, momentum=0.9, weight_decay=1e-3, batch_size=3, prox_mu=0.1
    )

    sequential, batched = both_backends(model, clients, config, max_parallel=2)

    assert_same_updates(sequential, batched, rtol=1e-6)
    if norm == "batch":  # per-client running statistics moved, and moved identically
        stats = [s for n, s in layout_of(model).slices().items() if "running" in n]
        for s, b in zip(sequential, batched, strict=True):
            moved = torch.cat([s.delta[i] for i in stats])
            assert moved.abs().max() > 0
            assert torch.allclose(torch.cat([b.delta[i] for i in stats]), moved, rtol=1e-6)


def test_support_check_names_what_the_batched_backend_cannot_train():
    cnn = build_model("small_cnn", in_channels=1, num_classes=2)
    with_dropout = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(4, 2))
    cumulative_bn = nn.Sequential(nn.BatchNorm1d(4, momentum=None), nn.Linear(4, 2))

    assert supports_batched(cnn)
    assert supports_batched(build_model("resnet18", in_channels=1, num_classes=2))
    assert supports_batched(build_model("resnet18", in_channels=1, num_classes=2, norm="group"))
    assert not supports_batched(with_dropout)
    assert not supports_batched(cumulative_bn)
    with pytest.raises(ValueError, match="dropout"):
        train_clients_batched(
            with_dropout,
            model_to_vector(with_dropout),
            [ClientData(0, torch.randn(4, 1, 2, 2), torch.zeros(4, dtype=torch.long))],
            LocalTraining(),
            loss_function(False),
            seeds=[0],
        )


def federation(
    medmnist_root, backend: str, *, broken_client=None, max_parallel: int | None = 2,
    server_optimizer: str = "sgd", local_work: LocalWork | None = None,
) -> Federation:  # fmt: skip
    data = load_medmnist("breastmnist", medmnist_root)
    images, targets = to_tensors(data.train, data.info)
    parts = build_partitioner("dirichlet", alpha=1.0)(data.train.targets, 4, seed=0)
    clients = [ClientData(i, images[p], targets[p]) for i, p in enumerate(parts)]
    if broken_client is not None:
        clients[2] = broken_client(2, clients[2])
    model = seeded_init(
        0, lambda: build_model("small_cnn", in_channels=1, num_classes=2, width=8, hidden=16)
    )
    return Federation(
        model=model,
        clients=clients,
        local=LocalTraining(lr=0.05, momentum=0.9, batch_size=32, prox_mu=0.01),
        config=FederationConfig(rounds=2, seed=0),
        defence=Defence(
            rule=build_aggregator("fedavg"),
            server_optimizer=build_server_optimizer(server_optimizer),
        ),
        evaluation=EvaluationSets(test=to_tensors(data.test, data.info)),
        execution=Execution(backend=backend, max_parallel=max_parallel, local_work=local_work),  # type: ignore[arg-type]
    )


def test_a_federation_sizes_its_batched_chunks_once_and_keeps_the_size(medmnist_root):
    fed = federation(medmnist_root, "batched", max_parallel=None)
    size = fed.executor.max_parallel

    run_rounds(fed, 2)

    assert isinstance(size, int) and size >= 1 and fed.executor.max_parallel == size


def run_rounds(fed: Federation, rounds: int):
    state = fed.initial_state()
    for _ in range(rounds):
        state, report = fed.run_round(state)
    return state, report


@pytest.mark.parametrize(
    ("broken", "rounds", "server", "work"), [(False, 2, "adam", (1, 3)), (True, 1, "sgd", None)]
)
def test_federation_rounds_match_across_backends(
    medmnist_root, broken_client, broken, rounds, server, work
):
    """The server optimizer (FedAdam here) steps on either backend's aggregate alike;
    clients drawing unequal local epochs train batched in groups of equal epochs."""
    breaking = broken_client if broken else None
    local_work = None if work is None else LocalWork(epochs=work)
    sequential_fed, batched_fed = (
        federation(
            medmnist_root, backend, broken_client=breaking, server_optimizer=server,
            local_work=local_work,
        )
        for backend in ("sequential", "batched")
    )  # fmt: skip
    start = sequential_fed.initial_state().global_vector

    sequential, last_sequential = run_rounds(sequential_fed, rounds)
    batched, last_batched = run_rounds(batched_fed, rounds)

    assert batched_fed.batched and not sequential_fed.batched
    assert batched.server_optimizer_state["step"] == sequential.server_optimizer_state["step"]
    moved = (sequential.global_vector - start).norm()
    assert (batched.global_vector - sequential.global_vector).norm() <= 1e-5 * moved
    for s, b in zip(sequential.history, batched.history, strict=True):
        assert b.keys() == s.keys()
        assert b["clients_kept"] == s["clients_kept"]
        assert b["test_acc"] == pytest.approx(s["test_acc"], abs=1e-9)
    rows = [(r["client"], r["excluded"], r["reason"]) for r in last_batched.clients]
    assert rows == [(r["client"], r["excluded"], r["reason"]) for r in last_sequential.clients]
    steps = [r.get("local_steps") for r in last_batched.clients]
    assert steps == [r.get("local_steps") for r in last_sequential.clients]
    drawn = {r["local_epochs"] for r in last_batched.clients if "local_epochs" in r}
    assert (len(drawn) > 1) == (work is not None)  # the draw made the epochs unequal
    # a broken client makes the batched call fail; retried one by one, it alone is dropped
    assert ((2, True, "client_error") in rows) == broken


def test_backend_choice_is_validated_and_auto_falls_back_for_unsupported_models():
    generator = torch.Generator().manual_seed(0)
    images, targets = torch.randn(8, 1, 2, 2, generator=generator), torch.zeros(8, dtype=torch.long)
    settings = {
        "model": nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(4, 2)),
        "clients": [ClientData(0, images, targets)],
        "local": LocalTraining(),
        "config": FederationConfig(rounds=1),
        "defence": Defence(rule=build_aggregator("fedavg")),
        "evaluation": EvaluationSets(test=(images, targets)),
    }

    assert not Federation(**settings, execution=Execution(backend="auto")).batched
    with pytest.raises(ValueError, match="cannot train this model: 1 is a dropout layer"):
        Federation(**settings, execution=Execution(backend="batched"))
    with pytest.raises(ValueError, match="backend must be one of"):
        Execution(backend="vectorised")  # type: ignore[arg-type]


def test_cpu_federation_trains_channels_last_weights_and_reads_them_in_logical_order(
    medmnist_root,
):
    fed = federation(medmnist_root, "sequential")
    contiguous = seeded_init(
        0, lambda: build_model("small_cnn", in_channels=1, num_classes=2, width=8, hidden=16)
    )

    start = fed.initial_state()
    state, _ = fed.run_round(start)
    round_trip = model_to_vector(fed.global_model(state))

    conv = fed.model.features[3].weight  # (16, 8, 3, 3): the oneDNN route on CPU
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    assert torch.equal(start.global_vector, model_to_vector(contiguous))
    assert torch.equal(round_trip, state.global_vector)


def test_auto_batches_where_it_pays_on_cuda_always_on_a_cpu_without_convolutions():
    from federated.batched import batched_pays
    from models import build_model

    cnn = build_model("small_cnn", in_channels=1, num_classes=2)
    logreg = build_model("logreg", in_channels=1, num_classes=2)

    assert batched_pays(cnn, torch.device("cuda")) and batched_pays(logreg, torch.device("cuda"))
    assert not batched_pays(cnn, torch.device("cpu"))
    assert batched_pays(logreg, torch.device("cpu"))
