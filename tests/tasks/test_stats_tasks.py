"""The pre-test tasks called directly (``.fn``): collection modes and per-layer rates."""

import numpy as np
import torch

from aggregation import build_aggregator
from federated.client import ClientData, LocalTraining, client_gradient
from federated.data import load_medmnist, to_tensors
from federated.metrics import loss_function
from federated.partition import build_partitioner
from federated.seeding import seeded_init
from federated.server import Defence, EvaluationSets, Federation, FederationConfig
from federated.vectors import layout_of, model_to_vector
from models import build_model
from tasks.stats import collect_client_updates, test_normality


def small_federation(medmnist_root, clients=5):
    data = load_medmnist("breastmnist", medmnist_root)
    images, targets = to_tensors(data.train, data.info)
    parts = build_partitioner("iid")(data.train.targets, clients, seed=0)
    model = seeded_init(
        0, lambda: build_model("small_cnn", in_channels=1, num_classes=2, width=4, hidden=8)
    )
    return Federation(
        model=model,
        clients=[ClientData(i, images[p], targets[p]) for i, p in enumerate(parts)],
        local=LocalTraining(lr=0.05),
        config=FederationConfig(rounds=1),
        defence=Defence(rule=build_aggregator("fedavg")),
        evaluation=EvaluationSets(test=to_tensors(data.test, data.info)),
    )


def test_gradient_mode_is_the_full_data_gradient_batched_or_not(medmnist_root):
    federation = small_federation(medmnist_root)
    state = federation.initial_state()
    client = federation.clients[0]

    rows = collect_client_updates.fn(federation, state, "gradient")
    whole = client_gradient(
        federation.model, state.global_vector, client, loss_function(False), batch_size=10_000
    )

    assert rows.shape == (5, layout_of(federation.model).size)
    torch.testing.assert_close(rows[0], whole, rtol=1e-4, atol=1e-6)
    assert torch.equal(model_to_vector(federation.model), state.global_vector)  # no step taken


def test_delta_mode_is_one_local_epoch_update(medmnist_root):
    federation = small_federation(medmnist_root)
    state, _ = federation.run_round(federation.initial_state())

    rows = collect_client_updates.fn(federation, state, "delta")

    assert rows.shape[0] == 5 and torch.isfinite(rows).all()
    assert not torch.equal(rows[0], rows[1])


def test_normality_task_reports_sampled_coordinates_per_layer(medmnist_root):
    federation = small_federation(medmnist_root)
    rows = collect_client_updates.fn(federation, federation.initial_state(), "gradient")

    result = test_normality.fn(federation.model, rows, alpha=0.05, max_tests=500, seed=3)
    again = test_normality.fn(federation.model, rows, alpha=0.05, max_tests=500, seed=3)

    assert result.n_tests == 500
    assert set(result.per_layer) <= set(layout_of(federation.model).names)
    assert sum(layer.n_tests for layer in result.per_layer.values()) == 500
    assert np.array_equal(result.coords, again.coords) and result.shapiro_rate == again.shapiro_rate
