"""SCAFFOLD (Karimireddy et al. 2020, Algorithm 1, option II) in a federation, step by
step against the paper's pseudo-code written out on a tiny problem (three clients,
full-batch steps of a linear classifier) and against NIID-Bench's SCAFFOLD (minibatches,
unequal clients, sampling); with zero variates (round 1) or one local step it is FedAvg."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn
from torch.nn import functional

from aggregation import build_aggregator, build_filter
from federated.client import ClientData, LocalTraining, batch_order, batches
from federated.seeding import SHUFFLE, derive_seed
from federated.server import (
    Defence,
    EvaluationSets,
    Execution,
    Federation,
    FederationConfig,
    ServerState,
)
from federated.vectors import model_to_vector

FEATURES, CLASSES, PER_CLIENT, CLIENTS = 5, 3, 12, 3
STEPS, LR = 4, 0.2  # K local steps (full batches: one per epoch) at η_l


def clients() -> list[ClientData]:
    """Three clients of 12 points whose labels follow different linear rules (non-IID)."""
    generator = torch.Generator().manual_seed(7)
    out = []
    for client_id in range(CLIENTS):
        x = torch.randn(PER_CLIENT, FEATURES, generator=generator)
        w = torch.randn(FEATURES, CLASSES, generator=generator) + client_id
        out.append(ClientData(client_id, x, (x @ w).argmax(dim=1)))
    return out


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(FEATURES, CLASSES)


def federation(*, scaffold: bool, rounds: int = 3, fraction: float = 1.0, **defence) -> Federation:
    data = clients()
    test = (torch.cat([c.images for c in data]), torch.cat([c.targets for c in data]))
    return Federation(
        model=model(),
        clients=data,
        local=LocalTraining(epochs=STEPS, lr=LR, momentum=0.0, batch_size=PER_CLIENT),
        config=FederationConfig(rounds=rounds, scaffold=scaffold, client_fraction=fraction),
        defence=Defence(rule=build_aggregator("fedavg"), **defence),
        evaluation=EvaluationSets(test=test),
        execution=Execution(backend="sequential"),
    )


def run(fed: Federation, rounds: int, state: ServerState | None = None) -> ServerState:
    state = state or fed.initial_state()
    for _ in range(rounds):
        state, _ = fed.run_round(state)
    return state


def paper_scaffold(rounds: int) -> list[torch.Tensor]:
    """Algorithm 1 of the paper, every client sampled, η_g = 1, option II; x after each
    round. The loss of client i is the mean cross-entropy of its points."""
    data = clients()
    x = model_to_vector(model())
    c = torch.zeros_like(x)
    c_i = [torch.zeros_like(x) for _ in data]
    trajectory = []
    for _ in range(rounds):
        delta_y, delta_c = [], []
        for i, client in enumerate(data):
            y = x.clone()
            for _ in range(STEPS):
                g = gradient(y, client)
                y = y - LR * (g - c_i[i] + c)  # line 10
            c_plus = c_i[i] - c + (x - y) / (STEPS * LR)  # line 12, option II
            delta_y.append(y - x)
            delta_c.append(c_plus - c_i[i])  # line 13
            c_i[i] = c_plus
        x = x + torch.stack(delta_y).mean(dim=0)  # line 16 (η_g = 1)
        c = c + torch.stack(delta_c).sum(dim=0) / len(data)  # line 17 (S = N)
        trajectory.append(x.clone())
    return trajectory


def gradient(vector: torch.Tensor, client: ClientData) -> torch.Tensor:
    """∇f_i at ``vector`` (the Linear layer's weight then bias, as its state_dict)."""
    weight = vector[: FEATURES * CLASSES].view(CLASSES, FEATURES).clone().requires_grad_()
    bias = vector[FEATURES * CLASSES :].clone().requires_grad_()
    loss = functional.cross_entropy(client.images @ weight.T + bias, client.targets)
    grads = torch.autograd.grad(loss, (weight, bias))
    return torch.cat([g.reshape(-1) for g in grads])


def test_scaffold_follows_the_papers_algorithm_step_by_step() -> None:
    fed = federation(scaffold=True)
    state = fed.initial_state()

    for reference in paper_scaffold(3):
        state, _ = fed.run_round(state)
        torch.testing.assert_close(state.global_vector, reference, rtol=0, atol=2e-6)

    assert all(row["control_counted"] for row in state.trail)
    assert set(state.client_controls) == {0, 1, 2}
    # the server's c is the mean of the clients' c_i (every client in every round, S = N)
    mean = torch.stack(list(state.client_controls.values())).mean(dim=0)
    torch.testing.assert_close(state.control, mean, rtol=0, atol=1e-6)


NIID_BENCH = "Xtra-Computing/NIID-Bench@61b901ab645e62391772e9898384c2c3485b7a6c, experiments.py"
SIZES, BATCH, EPOCHS = (10, 14, 19), 4, 2  # unequal clients, minibatches: K differs by client


def uneven_clients() -> list[ClientData]:
    generator = torch.Generator().manual_seed(11)
    out = []
    for client_id, size in enumerate(SIZES):
        x = torch.randn(size, FEATURES, generator=generator)
        w = torch.randn(FEATURES, CLASSES, generator=generator) - client_id
        out.append(ClientData(client_id, x, (x @ w).argmax(dim=1)))
    return out


def niid_bench_scaffold(fed: Federation, rounds: int) -> list[torch.Tensor]:
    """NIID-Bench's SCAFFOLD (``NIID_BENCH``), in its own terms (state dicts, torch's SGD
    and CrossEntropyLoss): ``train_net_scaffold`` (lines 297-366) steps SGD, then moves
    every entry by −lr·(c_global − c_local), counts the steps ``cnt`` and sets
    c_new = c_local − c_global + (global − net)/(cnt·lr); ``local_train_net_scaffold``
    (638-690) adds the sampled clients' c_delta over n_parties into c_global; the round
    (1005-1036) averages the sampled nets weighted by their data. Its settings here: rho
    (momentum) 0, reg (weight decay) 0 and the variates starting at 0 as the paper's
    (NIID-Bench starts c and every c_i at one fresh network's weights). What is not the
    algorithm is fedsieve's: who is sampled and each epoch's batch order (the loader)."""
    data = {c.client_id: c for c in uneven_clients()}
    global_model = model()
    c_global = {k: torch.zeros_like(v) for k, v in global_model.state_dict().items()}
    c_nets = {i: dict(c_global) for i in data}
    nets = {i: model() for i in data}
    trajectory = []
    for round_number in range(1, rounds + 1):
        selected = [fed.clients[p].client_id for p in fed.sample_clients(round_number)]
        global_para = global_model.state_dict()
        total_delta = {k: torch.zeros_like(v) for k, v in global_para.items()}
        for net_id in selected:
            net, c_local = nets[net_id], c_nets[net_id]
            net.load_state_dict(global_para)
            optimizer = torch.optim.SGD(net.parameters(), lr=LR, momentum=0, weight_decay=0)
            cnt, seed = 0, derive_seed(fed.config.seed, round_number, net_id, SHUFFLE)
            for epoch in range(EPOCHS):
                for index in batches(
                    batch_order(len(data[net_id]), derive_seed(seed, epoch)), BATCH
                ):
                    optimizer.zero_grad()
                    loss = nn.CrossEntropyLoss()(
                        net(data[net_id].images[index]), data[net_id].targets[index]
                    )
                    loss.backward()
                    optimizer.step()
                    net_para = net.state_dict()
                    for key in net_para:
                        net_para[key] = net_para[key] - LR * (c_global[key] - c_local[key])
                    net.load_state_dict(net_para)
                    cnt += 1
            net_para = net.state_dict()
            c_new = {
                k: c_local[k] - c_global[k] + (global_para[k] - net_para[k]) / (cnt * LR)
                for k in net_para
            }
            for key in total_delta:
                total_delta[key] = total_delta[key] + c_new[key] - c_local[key]
            c_nets[net_id] = c_new
        c_global = {k: c_global[k] + total_delta[k] / len(data) for k in c_global}
        total = sum(len(data[i]) for i in selected)
        averaged = {
            k: sum(nets[i].state_dict()[k] * (len(data[i]) / total) for i in selected)
            for k in global_para
        }
        global_model.load_state_dict(averaged)
        trajectory.append(model_to_vector(global_model))
    return trajectory


def test_scaffold_equals_niid_benchs_update_round_by_round_with_sampling() -> None:
    """Clients of 10, 14 and 19 points in batches of 4 for two epochs (K = 6, 8 and 10
    steps), two of three sampled a round: the global model after every round is NIID-
    Bench's (``NIID_BENCH``)."""
    data = uneven_clients()
    test = (torch.cat([c.images for c in data]), torch.cat([c.targets for c in data]))
    fed = Federation(
        model=model(), clients=data,
        local=LocalTraining(epochs=EPOCHS, lr=LR, momentum=0.0, batch_size=BATCH),
        config=FederationConfig(rounds=4, scaffold=True, client_fraction=0.6, seed=3),
        defence=Defence(rule=build_aggregator("fedavg")),
        evaluation=EvaluationSets(test=test), execution=Execution(backend="sequential"),
    )  # fmt: skip
    state = fed.initial_state()

    for reference in niid_bench_scaffold(fed, 4):
        state, _ = fed.run_round(state)
        torch.testing.assert_close(state.global_vector, reference, rtol=0, atol=2e-6)

    trained = {row["client"] for row in state.trail}
    assert trained == {0, 1, 2} and len(state.trail) == 8  # sampled: two a round


def test_with_one_local_step_and_every_client_scaffold_is_fedavg_every_round() -> None:
    """One step: Δy_i = −η_l(g_i − c_i + c), and c is the mean of the c_i, so the
    corrections cancel in the (equal-weight) mean: SCAFFOLD's rounds are FedAvg's."""
    one_step = {"epochs": 1, "batch_size": PER_CLIENT}

    def one(scaffold: bool) -> Federation:
        data = clients()
        test = (torch.cat([c.images for c in data]), torch.cat([c.targets for c in data]))
        return Federation(
            model=model(), clients=data, local=LocalTraining(lr=LR, momentum=0.0, **one_step),
            config=FederationConfig(rounds=3, scaffold=scaffold),
            defence=Defence(rule=build_aggregator("fedavg")),
            evaluation=EvaluationSets(test=test), execution=Execution(backend="sequential"),
        )  # fmt: skip

    scaffold, fedavg = run(one(True), 3), run(one(False), 3)

    torch.testing.assert_close(scaffold.global_vector, fedavg.global_vector, rtol=0, atol=1e-6)
    assert scaffold.control.abs().max() > 1e-3  # the variates are not zero after round 1


def test_with_zero_variates_scaffold_is_fedavg_and_then_it_departs() -> None:
    fedavg = run(federation(scaffold=False), 1)
    first = run(federation(scaffold=True), 1)
    second = run(federation(scaffold=True), 2)

    torch.testing.assert_close(first.global_vector, fedavg.global_vector, rtol=0, atol=0)
    plain = run(federation(scaffold=False), 2)
    assert (second.global_vector - plain.global_vector).abs().max() > 1e-4


def test_a_sampled_round_moves_c_by_the_kept_clients_over_all_clients() -> None:
    """Two of three clients a round: c += (1/N)·Σ Δc_i over the two."""
    fed = federation(scaffold=True, fraction=0.6)
    start = fed.initial_state()

    state, report = fed.run_round(start)

    trained = [row["client"] for row in report.clients]
    assert len(trained) == 2
    changes = [state.client_controls[i] for i in trained]  # c_i⁺ − 0
    torch.testing.assert_close(state.control, sum(changes) / CLIENTS, rtol=0, atol=1e-7)
    assert set(state.client_controls) == set(trained)


def test_a_filtered_clients_control_delta_does_not_count_but_it_keeps_its_own() -> None:
    """The kept set of the model deltas is the kept set of the control deltas."""
    fed = federation(scaffold=True, filters=(build_filter("pid_made", threshold="k", k=0.5),))
    state = run(fed, 2)

    left_out = [row for row in state.trail if row["excluded"]]
    assert left_out, "the filter should leave someone out at k = 0.5"
    assert all(row["control_counted"] is False for row in left_out)
    assert all(row["control_counted"] for row in state.trail if not row["excluded"])


def test_the_variates_resume_exactly_from_a_weights_only_checkpoint() -> None:
    uninterrupted = run(federation(scaffold=True), 3)
    buffer = io.BytesIO()
    torch.save(run(federation(scaffold=True), 2).to_dict(), buffer)
    buffer.seek(0)
    restored = ServerState.from_dict(torch.load(buffer, weights_only=True))

    resumed = run(federation(scaffold=True), 1, restored)

    assert torch.equal(resumed.global_vector, uninterrupted.global_vector)
    assert torch.equal(resumed.control, uninterrupted.control)


def test_the_batched_engine_trains_scaffold_as_the_sequential_one() -> None:
    """Every client's corrected steps and Δc_i in one batched call: the same rounds, c and
    c_i as client by client (up to float rounding), with sampling and unequal clients."""

    def uneven(backend: str) -> Federation:
        data = uneven_clients()
        test = (torch.cat([c.images for c in data]), torch.cat([c.targets for c in data]))
        return Federation(
            model=model(), clients=data,
            local=LocalTraining(epochs=EPOCHS, lr=LR, momentum=0.0, batch_size=BATCH),
            config=FederationConfig(rounds=3, scaffold=True, client_fraction=0.6, seed=3),
            defence=Defence(rule=build_aggregator("fedavg")),
            evaluation=EvaluationSets(test=test), execution=Execution(backend=backend),
        )  # fmt: skip

    batched = uneven("batched")
    assert batched.batched
    one, many = run(uneven("sequential"), 3), run(batched, 3)

    torch.testing.assert_close(many.global_vector, one.global_vector, rtol=0, atol=1e-6)
    torch.testing.assert_close(many.control, one.control, rtol=0, atol=1e-6)
    assert many.client_controls.keys() == one.client_controls.keys()
    for client, variate in one.client_controls.items():
        torch.testing.assert_close(many.client_controls[client], variate, rtol=0, atol=1e-5)


def test_what_scaffold_cannot_run_with_is_refused() -> None:
    with pytest.raises(ValueError, match="local momentum and prox_mu must be 0"):
        Federation(
            model=model(), clients=clients(), local=LocalTraining(momentum=0.9),
            config=FederationConfig(rounds=1, scaffold=True),
            defence=Defence(rule=build_aggregator("fedavg")),
            evaluation=EvaluationSets(test=(clients()[0].images, clients()[0].targets)),
        )  # fmt: skip
