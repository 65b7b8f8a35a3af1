"""The executor seam: the round asks an executor for the sampled clients' updates; what
does not come back, or comes back wrong, is recorded in the trail and the round goes on."""

from dataclasses import dataclass, replace

import torch

from aggregation import build_aggregator
from federated.client import ClientData, ClientUpdate, LocalTraining
from federated.data import load_medmnist, to_tensors
from federated.execution import ClientResult, SequentialExecutor
from federated.loop import train
from federated.partition import build_partitioner
from federated.seeding import seeded_init
from federated.server import (
    Defence,
    EvaluationSets,
    Execution,
    Federation,
    FederationConfig,
)
from models import build_model


def federation_with(medmnist_root, execution=None, *, min_clients=1, rounds=2):
    data = load_medmnist("breastmnist", medmnist_root)
    images, targets = to_tensors(data.train, data.info)
    parts = build_partitioner("iid")(data.train.targets, 4, seed=0)
    return Federation(
        model=seeded_init(
            0, lambda: build_model("small_cnn", in_channels=1, num_classes=2, width=8, hidden=16)
        ),
        clients=[ClientData(i, images[p], targets[p]) for i, p in enumerate(parts)],
        local=LocalTraining(lr=0.05, batch_size=64),
        config=FederationConfig(rounds=rounds, seed=0, min_clients=min_clients),
        defence=Defence(rule=build_aggregator("fedavg")),
        evaluation=EvaluationSets(test=to_tensors(data.test, data.info)),
        execution=execution or Execution(),
    )


@dataclass
class Unreliable:
    """Clients elsewhere: some answer, some time out, one is away, one sends garbage."""

    inner: SequentialExecutor
    answers: dict[int, str]  # client id -> what happens to it
    calls: int = 0

    def train(self, global_vector, round_number, client_ids, on_result=None):
        self.calls += 1
        results = []
        for client_id in client_ids:
            happens = self.answers.get(client_id, "ok")
            if happens == "ok":
                result = self.inner.train_one(global_vector, round_number, client_id)
            elif happens == "wrong_shape":
                update = ClientUpdate(client_id, torch.zeros(7), 10, 0.5)
                result = ClientResult(client_id, "ok", update)
            else:
                result = ClientResult(client_id, happens, message=f"no answer: {happens}")
            results.append(result)
            if on_result is not None:
                on_result(result)
        return results


def unreliable(federation, answers):
    return Unreliable(inner=federation.executor, answers=answers)


def test_what_does_not_come_back_is_recorded_and_the_round_goes_on(medmnist_root):
    local = federation_with(medmnist_root)
    executor = unreliable(local, {1: "timeout", 2: "unavailable", 3: "wrong_shape"})
    federation = federation_with(medmnist_root, Execution(executor=executor))

    state, report = federation.run_round(federation.initial_state())

    reasons = {row["client"]: row["reason"] for row in report.clients}
    assert reasons == {0: "", 1: "client_timeout", 2: "client_unavailable", 3: "bad_update"}
    assert report.clients[1]["message"] == "no answer: timeout"
    assert "shape (7,)" in report.clients[3]["message"]
    assert report.metrics["clients_kept"] == 1 and not report.metrics["round_skipped"]
    # the one update that came is the aggregate: the model moved by client 0's update alone
    alone = local.executor.train_one(local.initial_state().global_vector, 1, 0).update
    moved = state.global_vector - federation.initial_state().global_vector
    torch.testing.assert_close(moved, alone.delta)


def test_a_round_with_too_few_answers_is_skipped_with_the_reasons_kept(medmnist_root):
    local = federation_with(medmnist_root)
    answers = {1: "timeout", 2: "unavailable", 3: "error"}
    federation = federation_with(
        medmnist_root, Execution(executor=unreliable(local, answers)), min_clients=2
    )
    start = federation.initial_state()

    state, report = federation.run_round(start)

    assert report.metrics["round_skipped"] == 1.0
    assert torch.equal(state.global_vector, start.global_vector)
    assert [row["reason"] for row in report.clients] == [
        "", "client_timeout", "client_unavailable", "client_error",
    ]  # fmt: skip


def test_failures_to_answer_are_not_detections(medmnist_root):
    local = federation_with(medmnist_root)
    executor = unreliable(local, {1: "timeout"})
    federation = federation_with(medmnist_root, Execution(executor=executor))
    federation.config = replace(federation.config, max_excluded=0)  # fail closed on any exclusion

    state = train(federation, federation.initial_state(), 2)

    assert state.halted is None and state.round == 2  # a timeout is no exclusion
    assert state.history[-1]["false_positives"] == 0.0


def test_a_clients_own_executor_replaces_this_processes_and_gives_the_same_model(medmnist_root):
    plain = federation_with(medmnist_root)
    executor = unreliable(plain, {})
    remote = federation_with(medmnist_root, Execution(executor=executor))

    here = train(plain, plain.initial_state(), 2)
    there = train(remote, remote.initial_state(), 2)

    assert executor.calls == 2
    assert torch.equal(here.global_vector, there.global_vector)
    assert here.history == there.history
