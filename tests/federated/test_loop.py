"""The one round loop: every training runs its rounds through ``federated.loop.train``."""

from dataclasses import replace

from aggregation import build_aggregator
from federated.client import ClientData, LocalTraining
from federated.data import load_medmnist, to_tensors
from federated.loop import train
from federated.partition import build_partitioner
from federated.privacy import ClientPrivacy
from federated.seeding import seeded_init
from federated.server import Defence, EvaluationSets, Federation, FederationConfig
from models import build_model


def small_federation(medmnist_root, num_clients=4, **defence):
    data = load_medmnist("breastmnist", medmnist_root)
    images, targets = to_tensors(data.train, data.info)
    parts = build_partitioner("iid")(data.train.targets, num_clients, seed=0)
    return Federation(
        model=seeded_init(
            0, lambda: build_model("small_cnn", in_channels=1, num_classes=2, width=8, hidden=16)
        ),
        clients=[ClientData(i, images[p], targets[p]) for i, p in enumerate(parts)],
        local=LocalTraining(lr=0.05, batch_size=64),
        config=FederationConfig(rounds=3, seed=0),
        defence=Defence(**{"rule": build_aggregator("fedavg"), **defence}),
        evaluation=EvaluationSets(test=to_tensors(data.test, data.info)),
    )


def test_it_runs_the_rounds_asked_telling_on_round_of_each(medmnist_root):
    federation = small_federation(medmnist_root)
    seen = []

    state = train(
        federation,
        federation.initial_state(),
        3,
        on_round=lambda r, s: seen.append((r.round, s.round)),
    )

    assert state.round == 3 and seen == [(1, 1), (2, 2), (3, 3)]
    assert [row["round"] for row in state.history] == [1.0, 2.0, 3.0]


def test_it_resumes_from_a_state_as_if_never_stopped(medmnist_root):
    federation = small_federation(medmnist_root)
    whole = train(federation, federation.initial_state(), 3)

    halfway = train(federation, federation.initial_state(), 1)
    resumed = train(federation, halfway, 3)

    assert resumed.history == whole.history
    assert resumed.global_vector.equal(whole.global_vector)


def test_should_stop_ends_it_before_the_next_round(medmnist_root):
    federation = small_federation(medmnist_root)
    asked = []

    def stop_after_two() -> bool:
        asked.append(True)
        return len(asked) > 2

    state = train(federation, federation.initial_state(), 3, should_stop=stop_after_two)

    assert state.round == 2 and len(asked) == 3


def test_a_round_over_the_exclusion_bound_halts_it(medmnist_root):
    federation = small_federation(
        medmnist_root, num_clients=5, rule=build_aggregator("multi_krum", f=1, m=2)
    )
    federation.config = replace(federation.config, max_excluded=0)

    state = train(federation, federation.initial_state(), 3)

    assert state.round == 1 and "more than train.max_excluded" in state.halted


def test_a_spent_privacy_budget_ends_it_with_the_last_admissible_round(medmnist_root):
    privacy = ClientPrivacy(
        clip=1.0, noise_multiplier=1.0, population=4, per_round=4, target_epsilon=8.0
    )
    admitted = sum(privacy.admits(r) for r in range(1, 4))
    federation = small_federation(medmnist_root, privacy=privacy)

    state = train(federation, federation.initial_state(), 3)

    assert 1 <= admitted < 3, "the budget must end this run early for the test to mean anything"
    assert state.round == admitted and federation.budget_spent(state) is not None
