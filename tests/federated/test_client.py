import pytest
import torch

from federated.client import (
    ClientData,
    LocalTraining,
    LocalWork,
    batch_order,
    batches,
    local_steps,
    train_client,
)
from federated.metrics import loss_function
from federated.seeding import seeded_init
from federated.vectors import model_to_vector
from models import build_model


def tiny_setup(n=40):
    generator = torch.Generator().manual_seed(0)
    data = ClientData(
        0,
        torch.randn(n, 1, 28, 28, generator=generator),
        torch.randint(0, 2, (n,), generator=generator),
    )
    model = seeded_init(
        0, lambda: build_model("small_cnn", in_channels=1, num_classes=2, width=4, hidden=8)
    )
    return model, data


def test_update_is_local_minus_global_and_counts_samples():
    model, data = tiny_setup()
    start = model_to_vector(model)

    update = train_client(model, start, data, LocalTraining(lr=0.1), loss_function(False), seed=1)

    assert update.num_samples == 40
    torch.testing.assert_close(start + update.delta, model_to_vector(model))
    assert update.delta.abs().sum() > 0


def test_same_seed_same_update_other_seed_other_batches():
    model, data = tiny_setup()
    start = model_to_vector(model)

    def run(seed):
        config = LocalTraining(lr=0.1, batch_size=8)
        return train_client(model, start, data, config, loss_function(False), seed=seed)

    assert torch.equal(run(1).delta, run(1).delta)
    assert not torch.equal(run(1).delta, run(2).delta)


def test_fedprox_term_keeps_the_client_closer_to_the_global_model():
    model, data = tiny_setup()
    start = model_to_vector(model)
    settings = {"lr": 0.2, "epochs": 3, "batch_size": 8}

    plain = train_client(
        model, start, data, LocalTraining(**settings), loss_function(False), seed=1
    )
    prox = train_client(
        model, start, data, LocalTraining(prox_mu=5.0, **settings), loss_function(False), seed=1
    )

    assert prox.delta.norm() < 0.8 * plain.delta.norm()


def test_a_trailing_single_sample_batch_joins_the_previous_one():
    order = torch.arange(9)

    chunks = batches(order, 4)

    assert [len(c) for c in chunks] == [4, 5]
    assert torch.equal(torch.cat(chunks), order)


def reference_with_torch_optim(model, start, data, config, seed):
    """train_client's loop written with torch.optim.SGD, the semantics sgd_step_ copies."""
    from federated.client import batch_order
    from federated.seeding import derive_seed
    from federated.vectors import vector_to_model_

    vector_to_model_(model, start)
    model.train()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )
    loss_fn = loss_function(False)
    for epoch in range(config.epochs):
        for index in batches(batch_order(len(data), derive_seed(seed, epoch)), config.batch_size):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(data.images[index]), data.targets[index]).backward()
            optimizer.step()
    return model_to_vector(model) - start


def test_local_sgd_is_torch_optim_sgd_bit_for_bit():
    model, data = tiny_setup()
    start = model_to_vector(model)
    for config in (
        LocalTraining(lr=0.1, momentum=0.9, weight_decay=1e-3, batch_size=8, epochs=2),
        LocalTraining(lr=0.05, momentum=0.0, batch_size=16),
    ):
        ours = train_client(model, start, data, config, loss_function(False), seed=3).delta
        reference = reference_with_torch_optim(model, start, data, config, seed=3)
        assert torch.equal(ours, reference)


@pytest.mark.parametrize(
    ("samples", "batch_size"), [(1, 32), (32, 32), (33, 32), (34, 32), (65, 32), (7, 3)]
)
def test_local_steps_count_the_batches_train_client_takes(samples: int, batch_size: int) -> None:
    per_epoch = len(batches(batch_order(samples, 0), batch_size))

    assert local_steps(samples, batch_size, epochs=3) == 3 * per_epoch


def test_local_work_draws_seeded_epochs_in_its_range_per_round_and_client() -> None:
    work = LocalWork(epochs=(1, 4))

    draws = [work.epochs_of(0, r, c) for r in range(1, 30) for c in range(5)]

    assert set(draws) == {1, 2, 3, 4}
    assert draws == [work.epochs_of(0, r, c) for r in range(1, 30) for c in range(5)]
    assert draws != [work.epochs_of(1, r, c) for r in range(1, 30) for c in range(5)]
    with pytest.raises(ValueError, match=r"1 <= low <= high, got \[3, 2\]"):
        LocalWork(epochs=(3, 2))
