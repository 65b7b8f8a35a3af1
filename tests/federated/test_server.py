import io
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from aggregation import build_aggregator, build_filter, build_server_optimizer
from federated.attacks import build_attack
from federated.client import ClientData, LocalTraining, RegisteredClient
from federated.data import load_medmnist, to_tensors
from federated.metrics import ModelDiverged, scores_of
from federated.partition import build_partitioner
from federated.privacy import ClientPrivacy
from federated.seeding import CLIENT_STREAM, seeded_init
from federated.server import (
    Defence,
    EvaluationSets,
    Execution,
    Federation,
    FederationConfig,
    NonIIDCheck,
    ServerState,
    ThreatModel,
)
from federated.vectors import model_to_vector
from models import build_model


def make_federation(
    medmnist_root, *, rounds=2, num_clients=4, seed=0, edit_clients=None, **overrides
):
    data = load_medmnist("breastmnist", medmnist_root)
    images, targets = to_tensors(data.train, data.info)
    parts = build_partitioner("iid")(data.train.targets, num_clients, seed=seed)
    clients = [ClientData(i, images[p], targets[p]) for i, p in enumerate(parts)]
    if edit_clients is not None:  # e.g. a broken client in place of a good one
        edit_clients(clients)
    model = seeded_init(
        seed, lambda: build_model("small_cnn", in_channels=1, num_classes=2, width=8, hidden=16)
    )
    defence = {"rule": build_aggregator("fedavg")}
    evaluation = {"test": to_tensors(data.test, data.info)}
    threat = {}
    execution = {k: overrides[k] for k in ("local_work",) if k in overrides}
    for key, value in overrides.items():  # each override goes to the part that holds it
        if key in (
            "rule",
            "filters",
            "preaggregators",
            "noniid",
            "privacy",
            "root",
            "server_optimizer",
        ):
            defence[key] = value
        elif key in ("val", "sites", "site_vals", "where"):
            evaluation[key] = value
        elif key in ("malicious", "model_attack", "backdoor_test"):
            threat[key] = value
    if evaluation.get("where") == "sites":  # the server holds no split
        del evaluation["test"]
    return Federation(
        model=model,
        clients=overrides.get("clients", clients),
        local=overrides.get("local", LocalTraining(lr=0.05, batch_size=64)),
        config=overrides.get("config", FederationConfig(rounds=rounds, seed=seed)),
        defence=Defence(**defence),
        evaluation=EvaluationSets(**evaluation),
        threat=ThreatModel(**threat),
        execution=overrides.get("execution", Execution(**execution)),
    )


def run(federation, rounds):
    state = federation.initial_state()
    for _ in range(rounds):
        state, _ = federation.run_round(state)
    return state


def test_same_seed_gives_identical_metrics_and_weights(medmnist_root):
    first = run(make_federation(medmnist_root), 2)
    second = run(make_federation(medmnist_root), 2)

    assert first.history == second.history
    assert torch.equal(first.global_vector, second.global_vector)


def test_a_round_moves_the_global_model_by_the_weighted_mean_update(medmnist_root):
    federation = make_federation(medmnist_root, num_clients=3)
    state = federation.initial_state()
    from federated.client import train_client
    from federated.seeding import SHUFFLE, derive_seed

    updates = [
        train_client(
            federation.model, state.global_vector, c, federation.local, federation.loss_fn,
            seed=derive_seed(0, 1, c.client_id, SHUFFLE),
        )
        for c in federation.clients
    ]  # fmt: skip
    sizes = torch.tensor([float(u.num_samples) for u in updates])
    expected = state.global_vector + (sizes / sizes.sum()) @ torch.stack([u.delta for u in updates])

    new_state, report = federation.run_round(state)

    torch.testing.assert_close(new_state.global_vector, expected)
    assert report.metrics["clients_kept"] == 3


def test_client_sampling_is_seeded_and_takes_the_fraction(medmnist_root):
    federation = make_federation(
        medmnist_root,
        num_clients=10,
        config=FederationConfig(rounds=3, client_fraction=0.3, seed=5),
    )

    picks = [federation.sample_clients(r) for r in (1, 2, 1)]

    assert all(len(p) == 3 for p in picks)
    assert picks[0] == picks[2] and picks[0] != picks[1]


def test_stream_sampling_draws_each_round_from_one_generator_and_replays_on_resume(medmnist_root):
    config = FederationConfig(rounds=3, client_fraction=0.3, seed=5, sampling="stream")
    federation = make_federation(medmnist_root, num_clients=10, config=config)
    stream = np.random.default_rng(np.random.SeedSequence([5, CLIENT_STREAM]))
    drawn = [sorted(stream.choice(10, size=3, replace=False).tolist()) for _ in range(3)]

    picks = [federation.sample_clients(r) for r in (1, 2, 3, 2)]

    assert picks == [*drawn, drawn[1]]


def test_a_model_that_is_no_classifier_is_scored_by_the_callers_own_scores(medmnist_root):
    seen = []

    def scores(model, round_number):
        seen.append(round_number)
        return {"weight_norm": float(model_to_vector(model).norm())}

    federation = make_federation(medmnist_root, rounds=2)
    federation = Federation(
        model=federation.model, clients=federation.clients, local=federation.local,
        config=federation.config, defence=federation.defence,
        evaluation=EvaluationSets(model_scores=scores),
    )  # fmt: skip

    state = run(federation, 2)

    assert seen == [1, 2]
    assert state.history[-1]["weight_norm"] == float(state.global_vector.norm())
    assert not any(key.startswith("test_") for key in state.history[-1])


def test_clients_held_here_need_their_local_training(medmnist_root):
    federation = make_federation(medmnist_root)

    with pytest.raises(ValueError, match="local= is needed"):
        Federation(
            model=federation.model, clients=federation.clients, local=None,
            config=federation.config, defence=federation.defence,
            evaluation=federation.evaluation,
        )  # fmt: skip


def test_a_client_that_raises_is_dropped_and_recorded(medmnist_root, broken_client):
    def break_client_1(clients):
        clients[1] = broken_client(1, clients[0])

    federation = make_federation(medmnist_root, edit_clients=break_client_1)

    state, report = federation.run_round(federation.initial_state())

    row = next(r for r in report.clients if r["client"] == 1)
    assert row["excluded"] and row["reason"] == "client_error"
    assert "disk read error" in row["message"]
    assert report.metrics["clients_kept"] == 3
    assert torch.isfinite(state.global_vector).all()


def test_non_finite_updates_never_reach_the_global_model(medmnist_root):
    federation = make_federation(
        medmnist_root, malicious=frozenset({2}), model_attack=build_attack("nan")
    )

    state, report = federation.run_round(federation.initial_state())

    row = next(r for r in report.clients if r["client"] == 2)
    assert row["excluded"] and row["reason"] == "non_finite" and row["malicious"]
    assert torch.isfinite(state.global_vector).all()
    assert report.metrics["clients_kept"] == 3


def test_too_few_survivors_skip_the_round_and_keep_the_model(medmnist_root):
    federation = make_federation(
        medmnist_root,
        malicious=frozenset({0, 1, 2}),
        model_attack=build_attack("inf"),
        config=FederationConfig(rounds=1, min_clients=2),
    )
    start = federation.initial_state()

    state, report = federation.run_round(start)

    assert report.metrics["round_skipped"] == 1.0
    assert torch.equal(state.global_vector, start.global_vector)


def test_state_survives_a_weights_only_checkpoint(medmnist_root):
    federation = make_federation(medmnist_root)
    state = run(federation, 1)
    buffer = io.BytesIO()

    torch.save(state.to_dict(), buffer)
    buffer.seek(0)
    restored = ServerState.from_dict(torch.load(buffer, weights_only=True))

    assert (
        restored.round == 1 and restored.history == state.history and restored.trail == state.trail
    )
    assert torch.equal(restored.global_vector, state.global_vector)


def test_resumed_rounds_equal_uninterrupted_rounds(medmnist_root):
    uninterrupted = run(make_federation(medmnist_root), 3)
    first_part = run(make_federation(medmnist_root), 1)
    resumed_federation = make_federation(medmnist_root)  # a fresh process would rebuild it
    state = ServerState.from_dict(first_part.to_dict())
    for _ in range(2):
        state, _ = resumed_federation.run_round(state)

    assert state.history == uninterrupted.history
    assert torch.equal(state.global_vector, uninterrupted.global_vector)


def test_the_server_optimizer_steps_on_the_rules_aggregate(medmnist_root):
    """FedAdam on the median: the median's aggregate is Adam's pseudo-gradient."""
    start = make_federation(medmnist_root).initial_state()
    plain = run(make_federation(medmnist_root, rule=build_aggregator("median")), 1)
    aggregate = plain.global_vector - start.global_vector
    expected = build_server_optimizer("adam", lr=0.01).step(start.global_vector, aggregate)

    adam = run(
        make_federation(
            medmnist_root, rule=build_aggregator("median"),
            server_optimizer=build_server_optimizer("adam", lr=0.01),
        ),
        1,
    )  # fmt: skip

    torch.testing.assert_close(adam.global_vector, expected, rtol=0, atol=1e-6)
    assert adam.server_optimizer_state["step"] == 1


def test_a_server_optimizers_memory_resumes_exactly_from_a_weights_only_checkpoint(
    medmnist_root,
):
    def federation():
        return make_federation(medmnist_root, server_optimizer=build_server_optimizer("yogi"))

    uninterrupted = run(federation(), 3)
    buffer = io.BytesIO()
    torch.save(run(federation(), 2).to_dict(), buffer)
    buffer.seek(0)
    state = ServerState.from_dict(torch.load(buffer, weights_only=True))

    state, _ = federation().run_round(state)

    assert state.server_optimizer_state["step"] == 3
    assert torch.equal(state.global_vector, uninterrupted.global_vector)
    assert torch.equal(state.server_optimizer_state["v"], uninterrupted.server_optimizer_state["v"])


def test_fednova_with_equal_local_work_is_fedavg(medmnist_root):
    """Four IID clients of 136-137 images, batches of 64: three steps each."""
    fedavg = run(make_federation(medmnist_root), 2)
    fednova = run(make_federation(medmnist_root, rule=build_aggregator("fednova")), 2)

    steps = {row["local_steps"] for row in fednova.trail}
    assert steps == {3} and {row["local_epochs"] for row in fednova.trail} == {1}
    torch.testing.assert_close(fednova.global_vector, fedavg.global_vector, rtol=0, atol=1e-6)


def test_local_work_is_drawn_logged_and_normalised_by_fednova(medmnist_root):
    from aggregation.fednova import local_norm
    from federated.client import LocalWork

    work = LocalWork(epochs=(1, 3))
    federation = make_federation(medmnist_root, rule=build_aggregator("fednova"), local_work=work)
    start = federation.initial_state()
    fedavg = make_federation(medmnist_root, local_work=work)

    state, report = federation.run_round(start)
    plain, _ = fedavg.run_round(fedavg.initial_state())

    rows = report.clients
    assert [r["local_epochs"] for r in rows] == [work.epochs_of(0, 1, r["client"]) for r in rows]
    assert [r["local_steps"] for r in rows] == [3 * r["local_epochs"] for r in rows]
    assert len({r["local_steps"] for r in rows}) > 1  # the draw made the work unequal
    # the same clients' updates as FedAvg got them; FedNova re-weights them by their work
    sizes = torch.tensor([float(r["num_samples"]) for r in rows], dtype=torch.float64)
    norms = torch.tensor(
        [local_norm(r["local_steps"], momentum=0.9) for r in rows], dtype=torch.float64
    )
    p = sizes / sizes.sum()
    weight = p * (p @ norms) / norms
    assert [r["effective_weight"] for r in rows] == pytest.approx(
        weight.tolist(), rel=1e-6
    )  # float32 sizes
    assert not torch.allclose(state.global_vector, plain.global_vector)


def _equal_sizes(clients):
    for i, c in enumerate(clients):
        clients[i] = ClientData(c.client_id, c.images[:136], c.targets[:136])


def test_afl_without_ascent_is_fedavg_and_logs_lambda_and_the_worst_clients_loss(medmnist_root):
    """Equal client sizes: FedAvg's sample weights are AFL's uniform λ."""
    fedavg = run(make_federation(medmnist_root, edit_clients=_equal_sizes), 2)
    still = run(
        make_federation(
            medmnist_root, edit_clients=_equal_sizes, rule=build_aggregator("afl", step_size=0.0)
        ),
        2,
    )
    moving = make_federation(
        medmnist_root, edit_clients=_equal_sizes, rule=build_aggregator("afl", step_size=1.0)
    )

    state, report = moving.run_round(moving.initial_state())

    torch.testing.assert_close(still.global_vector, fedavg.global_vector, rtol=0, atol=1e-6)
    losses = {r["client"]: r["model_loss"] for r in report.clients}
    expected = moving.scorer.model_losses(moving.initial_vector, list(losses))
    assert losses == pytest.approx(expected)
    assert report.metrics["worst_client_loss"] == max(losses.values())
    assert report.metrics["worst_client"] == max(losses, key=losses.get)
    lambdas = [r["afl_lambda"] for r in report.clients]
    assert sum(lambdas) == pytest.approx(1.0) and len(set(lambdas)) > 1
    assert state.aggregator_state["lambda"].tolist() == pytest.approx(lambdas)


def test_config_values_are_validated():
    with pytest.raises(ValueError, match="client_fraction"):
        FederationConfig(rounds=1, client_fraction=0)
    with pytest.raises(ValueError, match="rounds"):
        FederationConfig(rounds=0)
    with pytest.raises(
        ValueError, match="sampling must be one of 'per_round', 'stream', got 'shuffled'"
    ):
        FederationConfig(rounds=1, sampling="shuffled")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^momentum must be a number in \[0, 1\), got 1.5$"):
        LocalTraining(momentum=1.5)


def test_noniid_check_reports_cv_and_excludes_outlying_clients(medmnist_root):
    federation = make_federation(medmnist_root, num_clients=6)
    state, _ = federation.run_round(federation.initial_state())  # a model that has learnt a little
    # Client 3's labels contradict every prediction of the global model: its loss stands out.
    client = federation.clients[3]
    with torch.no_grad():
        predicted = federation.global_model(state)(client.images).argmax(dim=1)
    clients = [*federation.clients[:3], ClientData(3, client.images, 1 - predicted)]
    federation = Federation(
        model=federation.model,
        clients=clients + federation.clients[4:],
        local=federation.local,
        config=federation.config,
        defence=replace(
            federation.defence, noniid=NonIIDCheck(every=1, threshold=0.25, exclude=True, z=1.5)
        ),
        evaluation=federation.evaluation,
    )

    state, report = federation.run_round(state)

    losses = [row["noniid_loss"] for row in report.clients]
    mean, std = sum(losses) / len(losses), torch.tensor(losses).std(unbiased=False).item()
    assert report.metrics["noniid_cv"] == pytest.approx(std / mean, rel=1e-5)
    assert report.metrics["noniid_non_iid"] == float(std / mean > 0.25)
    excluded = [row["client"] for row in report.clients if row["reason"] == "noniid_loss"]
    assert excluded == [3]
    assert "train_loss" not in next(r for r in report.clients if r["client"] == 3)
    assert report.metrics["clients_kept"] == 5


def test_the_trained_model_check_scores_every_client_as_the_paper_does(medmnist_root):
    federation = make_federation(medmnist_root, num_clients=5)
    state, _ = federation.run_round(federation.initial_state())
    model = federation.global_model(state)
    before = federation.scorer.trained_model_noniid(model, "cross_entropy", 0.25)
    client = federation.clients[1]  # labels against every prediction: a client unlike the rest
    with torch.no_grad():
        predicted = model(client.images).argmax(dim=1)
    federation.clients[1] = ClientData(1, client.images, 1 - predicted)

    after = federation.scorer.trained_model_noniid(model, "cross_entropy", before.cv)

    assert len(before.losses) == len(after.losses) == 5
    assert int(after.losses.argmax()) == 1
    assert after.cv == pytest.approx(after.losses.std() / after.losses.mean())
    assert after.cv > before.cv and after.verdict == "non_iid" and before.verdict == "iid"


def test_on_client_is_called_once_for_every_sampled_client(medmnist_root, broken_client):
    def break_client_2(clients):
        clients[2] = broken_client(2, clients[0])

    federation = make_federation(medmnist_root, num_clients=4, edit_clients=break_client_2)
    seen = []

    _, report = federation.run_round(federation.initial_state(), on_client=seen.append)

    assert seen == [0, 1, 2, 3]  # the broken client too: the bar must reach its total
    assert [row["client"] for row in report.clients] == seen


def test_detection_counts_credit_a_selecting_rules_choice():
    from federated.server import detection_counts

    rows = [
        {"malicious": True, "excluded": False, "reason": "", "selected": False},
        {"malicious": True, "excluded": True, "reason": "pid_made"},
        {"malicious": False, "excluded": False, "reason": "", "selected": False},
        {"malicious": False, "excluded": False, "reason": "", "selected": True},
        {"malicious": True, "excluded": False, "reason": "", "selected": True},
        {"malicious": True, "excluded": True, "reason": "client_error"},
    ]

    counts = detection_counts(rows)

    assert counts["true_positives"] == 2  # one excluded by a filter, one not selected
    assert counts["false_positives"] == 1  # an honest client Krum passed over
    assert counts["false_negatives"] == 1  # a malicious client the rule chose
    assert counts["precision"] == pytest.approx(2 / 3)
    assert counts["recall"] == pytest.approx(2 / 3)


def test_best_val_selection_keeps_the_best_validation_round(medmnist_root):
    data = load_medmnist("breastmnist", medmnist_root)
    val = to_tensors(data.val, data.info)
    federation = make_federation(
        medmnist_root, rounds=4, val=val, config=FederationConfig(rounds=4, select="best_val")
    )

    state = run(federation, 4)

    aucs = [row["val_auc"] for row in state.history]
    assert state.best_round == 1 + aucs.index(max(aucs))  # the earliest best round
    assert state.best_val_auc == max(aucs)
    restored = ServerState.from_dict(state.to_dict())
    assert restored.selected_round == state.best_round
    selected = model_to_vector(federation.selected_model(restored))
    assert torch.equal(selected, state.best_vector)
    assert federation.scorer.evaluate(selected, "val")["auc"] == max(aucs)


def test_last_selection_ends_with_the_last_round_and_best_val_needs_a_split(medmnist_root):
    data = load_medmnist("breastmnist", medmnist_root)
    federation = make_federation(medmnist_root, val=to_tensors(data.val, data.info))

    state = run(federation, 2)

    assert {"val_acc", "val_auc", "val_loss"} <= state.history[-1].keys()
    assert state.selected_round == 2 and state.best_vector is None
    with pytest.raises(ValueError, match="select='best_val' needs a validation split"):
        make_federation(medmnist_root, config=FederationConfig(rounds=1, select="best_val"))


def test_a_state_keeps_only_a_better_validation_round_as_its_selected_weights():
    state = ServerState(
        round=1, global_vector=torch.zeros(3), aggregator_state={}, filter_states=[]
    )
    state.keep_if_best(0.6)
    state.round, state.global_vector = 2, torch.ones(3)

    state.keep_if_best(0.5)  # worse
    state.keep_if_best(float("nan"))  # one class, or no validation split

    assert (state.best_round, state.best_val_auc, state.selected_round) == (1, 0.6, 1)
    assert torch.equal(state.selected_vector, torch.zeros(3))
    state.keep_if_best(0.7)
    assert state.selected_round == 2 and torch.equal(state.selected_vector, torch.ones(3))
    assert state.selected_vector is not state.global_vector  # a copy, kept as it was


def test_an_optimising_attack_sees_the_servers_defence_and_its_state_is_kept(medmnist_root):
    federation = make_federation(
        medmnist_root,
        malicious=frozenset({1}),
        rule=build_aggregator("median"),
        model_attack=build_attack("opt_alie"),
    )

    state, report = federation.run_round(federation.initial_state())

    assert "attack_factor" in report.metrics  # the factor its search chose against the median
    assert torch.isfinite(state.global_vector).all()
    restored = ServerState.from_dict(state.to_dict())
    assert restored.attack_state == state.attack_state


def test_a_stateful_attack_carries_its_memory_through_a_checkpoint(medmnist_root):
    federation = make_federation(
        medmnist_root, malicious=frozenset({0}), model_attack=build_attack("mimic")
    )
    state = run(federation, 2)

    saved = torch.load(io.BytesIO(_saved(state)), weights_only=True)

    assert ServerState.from_dict(saved).attack_state.keys() == state.attack_state.keys()


def _saved(state):
    buffer = io.BytesIO()
    torch.save(state.to_dict(), buffer)
    return buffer.getvalue()


def test_a_backdoor_is_scored_every_round_beside_clean_accuracy(medmnist_root):
    from federated.attacks import Backdoor
    from federated.backdoor_eval import triggered_test_set

    data = load_medmnist("breastmnist", medmnist_root)
    test = to_tensors(data.test, data.info)
    backdoor = Backdoor(target_label=0)
    federation = make_federation(
        medmnist_root, backdoor_test=(triggered_test_set(*test, backdoor), 0)
    )

    state, report = federation.run_round(federation.initial_state())

    assert 0.0 <= report.metrics["backdoor_asr"] <= 1.0
    assert federation.scorer.backdoor_asr(state.global_vector) == report.metrics["backdoor_asr"]


def test_a_model_whose_outputs_overflow_stops_the_run_naming_the_round(medmnist_root):
    """FedAvg under an update scaled 1e30 keeps finite weights whose outputs overflow, as
    FedAvg under opt-IPM did with the small CNN on BreastMNIST; the run once ended in
    scikit-learn's "Input contains NaN"."""
    federation = make_federation(
        medmnist_root, malicious=frozenset({0}), model_attack=build_attack("scaling", factor=1e30)
    )

    with pytest.raises(ModelDiverged, match=r"^round 1: the model's outputs are NaN or infin"):
        federation.run_round(federation.initial_state())


@pytest.mark.parametrize("bound", [1, 0.3])
def test_a_round_leaving_out_more_than_the_bound_halts_the_run_unaggregated(medmnist_root, bound):
    federation = make_federation(  # Multi-Krum keeps 3 of the 5 clients: 2 left out a round
        medmnist_root,
        num_clients=5,
        rule=build_aggregator("multi_krum", f=1, m=3),
        config=FederationConfig(rounds=2, max_excluded=bound),
    )
    start = federation.initial_state()

    state, _ = federation.run_round(start)

    assert state.halted.startswith("round 1: 2 of 5 clients left out, more than")
    assert "train.max_excluded" in state.halted
    assert torch.equal(state.global_vector, start.global_vector)
    assert len(state.trail) == 5 and sum(r.get("selected") is False for r in state.trail) == 2
    assert ServerState.from_dict(state.to_dict()).halted == state.halted


def test_a_round_within_the_bound_is_aggregated(medmnist_root):
    federation = make_federation(
        medmnist_root,
        num_clients=5,
        rule=build_aggregator("multi_krum", f=1, m=3),
        config=FederationConfig(rounds=2, max_excluded=2),
    )
    start = federation.initial_state()

    state, _ = federation.run_round(start)

    assert state.halted is None and not torch.equal(state.global_vector, start.global_vector)


@pytest.mark.parametrize("bad", [-1, 1.0, 1.5, True])
def test_the_bound_is_a_count_or_a_share(bad):
    with pytest.raises(
        ValueError,
        match=r"^max_excluded must be an integer >= 0 or a number in \[0, 1\) or None, got ",
    ):
        FederationConfig(rounds=1, max_excluded=bad)


def _with_sites(medmnist_root, rounds, **config):
    """A federation whose four clients each hold out a quarter of their data as a site's
    local test split (as ``partition.local_test`` does)."""
    federation = make_federation(medmnist_root, rounds=rounds)
    kept, sites = [], []
    for client in federation.clients:
        held = len(client) // 4
        sites.append((client.images[:held], client.targets[:held]))
        kept.append(ClientData(client.client_id, client.images[held:], client.targets[held:]))
    return make_federation(
        medmnist_root, rounds=rounds, clients=kept, sites=sites,
        config=FederationConfig(rounds=rounds, seed=0, **config),
    )  # fmt: skip


def test_every_site_is_scored_every_site_every_rounds_and_in_the_last(medmnist_root):
    federation = _with_sites(medmnist_root, 3, site_every=2, target_acc=0.7)
    state = run(federation, 3)

    assert [(row["round"], row["site"]) for row in state.sites] == [
        (r, s) for r in (2, 3) for s in range(4)
    ]
    last = [row for row in state.sites if row["round"] == 3]
    model = federation.global_model(state)
    for row in last:  # each row is the model's own score on that site's split
        images, targets = federation.evaluation.sites[row["site"]]
        assert row["n"] == len(targets)
        assert row["acc"] == pytest.approx(
            (model(images).argmax(1) == targets).float().mean().item()
        )
    metrics = state.history[-1]
    accs = [row["acc"] for row in last]
    assert metrics["site_acc_worst"] == min(accs) and metrics["site_acc_best"] == max(accs)
    assert last[metrics["site_worst"]]["acc"] == min(accs)
    assert metrics["sites_at_target"] == sum(a >= 0.7 for a in accs) / 4
    assert "site_acc_worst" not in state.history[0]  # round 1 was not a scoring round
    restored = ServerState.from_dict(torch.load(io.BytesIO(_saved(state)), weights_only=True))
    assert restored.sites == state.sites


def _held_out(federation, *shares):
    """Each client's data less a ``share`` of it per held-out split (as
    ``partition.local_test`` holds out a site's test split): the clients and the splits."""
    kept, splits = [], [[] for _ in shares]
    for client in federation.clients:
        start = 0
        for split, share in zip(splits, shares, strict=True):
            held = int(len(client) * share)
            split.append(
                (client.images[start : start + held], client.targets[start : start + held])
            )
            start += held
        kept.append(ClientData(client.client_id, client.images[start:], client.targets[start:]))
    return kept, splits


def test_scored_at_the_sites_a_rounds_scores_are_those_of_the_pooled_site_splits(medmnist_root):
    kept, (tests,) = _held_out(make_federation(medmnist_root), 0.25)
    federation = make_federation(medmnist_root, clients=kept, sites=tests, where="sites")

    state = run(federation, 2)

    model = federation.global_model(state)
    images = torch.cat([images for images, _ in tests])
    targets = torch.cat([targets for _, targets in tests])
    together = scores_of(model(images).detach(), targets, multi_label=False)
    last = state.history[-1]
    assert last["test_acc"] == pytest.approx(together["acc"])
    for name in ("loss", "ece", "brier"):
        assert last[f"test_{name}"] == pytest.approx(together[name], rel=1e-6, abs=1e-6)
    assert last["test_auc"] == pytest.approx(together["auc"], abs=1e-3)
    assert not any(key.startswith("val_") for key in last)  # no site holds a validation split
    assert last["sites_scored"] == 4  # the pooled scores say whose splits they cover
    # every round, every site's own row, as a site scores its split
    assert [(row["round"], row["site"], row["n"]) for row in state.sites] == [
        (r, s, len(tests[s][1])) for r in (1, 2) for s in range(4)
    ]


def test_best_val_at_the_sites_picks_the_round_of_the_best_pooled_validation_auc(medmnist_root):
    kept, (tests, vals) = _held_out(make_federation(medmnist_root), 0.2, 0.2)
    config = FederationConfig(rounds=3, seed=0, select="best_val")
    federation = make_federation(
        medmnist_root, clients=kept, sites=tests, site_vals=vals, where="sites", config=config
    )

    state = run(federation, 3)

    aucs = [row["val_auc"] for row in state.history]
    assert state.best_round == 1 + aucs.index(max(aucs))
    selected = federation.scorer.evaluate(state.selected_vector, "val")
    assert selected["auc"] == pytest.approx(max(aucs))


def test_scored_at_the_sites_what_needs_data_at_the_server_is_refused(medmnist_root):
    kept, (tests,) = _held_out(make_federation(medmnist_root), 0.25)
    data = load_medmnist("breastmnist", medmnist_root)
    with pytest.raises(ValueError, match="no test= or val= here"):
        EvaluationSets(where="sites", sites=tuple(tests), test=to_tensors(data.test, data.info))
    with pytest.raises(ValueError, match="needs the sites"):
        EvaluationSets(where="sites")
    with pytest.raises(ValueError, match="needs the sites' validation splits"):
        make_federation(
            medmnist_root, clients=kept, sites=tests, where="sites",
            config=FederationConfig(rounds=1, select="best_val"),
        )  # fmt: skip


def test_scored_at_the_sites_the_non_iid_check_judges_the_clients_own_losses(medmnist_root):
    # EMA's check needs no data at the server: where the model is scored changes nothing
    kept, (tests,) = _held_out(make_federation(medmnist_root), 0.25)
    check = NonIIDCheck(every=1, exclude=True, z=1.0)
    at_sites, at_hub = (
        run(make_federation(medmnist_root, clients=kept, sites=tests, noniid=check, **where), 2)
        for where in ({"where": "sites"}, {})
    )

    assert [row["noniid_cv"] for row in at_sites.history] == [
        row["noniid_cv"] for row in at_hub.history
    ]
    assert [(r["round"], r["client"], r["reason"]) for r in at_sites.trail] == [
        (r["round"], r["client"], r["reason"]) for r in at_hub.trail
    ]
    assert torch.equal(at_sites.global_vector, at_hub.global_vector)


def test_sites_must_match_the_clients(medmnist_root):
    federation = make_federation(medmnist_root)
    with pytest.raises(ValueError, match="one local test split per client"):
        make_federation(medmnist_root, sites=[federation.evaluation.test])


def _privacy(clients=4, per_round=4, **settings):
    return ClientPrivacy(
        population=clients, per_round=per_round, **{"clip": 1.0, "noise_multiplier": 1.0} | settings
    )


def test_central_dp_releases_the_clipped_mean_over_the_sampled_count(medmnist_root):
    # a clip far below the updates' norms and almost no noise: the global model moves by
    # the mean of the clipped updates, whose norm is at most the clip
    plain = make_federation(medmnist_root, rounds=1)
    start = plain.initial_state().global_vector
    updates = run(plain, 1).global_vector - start
    assert updates.norm() > 0.1
    private = make_federation(
        medmnist_root, rounds=1, privacy=_privacy(clip=0.01, noise_multiplier=1e-9)
    )
    moved = run(private, 1).global_vector - start
    assert 0.005 < moved.norm() <= 0.01 + 1e-6


def test_noise_has_the_accounted_scale_and_is_seeded(medmnist_root):
    # tiny clip: the released update is (almost) pure noise of std z*C/m per coordinate
    privacy = _privacy(clip=1e-6, noise_multiplier=2.0)
    federation = make_federation(medmnist_root, rounds=1, privacy=privacy)
    start = federation.initial_state().global_vector
    state = run(federation, 1)
    moved = state.global_vector - start
    assert moved.std().item() == pytest.approx(2.0 * 1e-6 / 4, rel=0.05)
    again = run(make_federation(medmnist_root, rounds=1, privacy=privacy), 1)
    assert torch.equal(again.global_vector, state.global_vector)
    assert state.history[0]["privacy_epsilon"] == pytest.approx(privacy.epsilon(1))


def test_local_dp_noises_every_client_before_the_server_sees_it(medmnist_root):
    privacy = _privacy(clip=1e-6, noise_multiplier=2.0, mode="local")
    federation = make_federation(medmnist_root, rounds=1, privacy=privacy)
    start = federation.initial_state().global_vector
    moved = run(federation, 1).global_vector - start
    # four clients' noises of std z*C summed, over m = 4: std z*C/2
    assert moved.std().item() == pytest.approx(2.0 * 1e-6 / 2, rel=0.05)


def test_the_budget_stops_before_the_round_that_would_pass_the_target(medmnist_root):
    privacy = _privacy(noise_multiplier=5.0, target_epsilon=1.2)  # admits 2 rounds
    federation = make_federation(medmnist_root, rounds=4, privacy=privacy)
    state = federation.initial_state()
    while state.round < 4 and not federation.budget_spent(state):
        state, _ = federation.run_round(state)
    assert state.round == 2
    assert [row["privacy_epsilon"] for row in state.history] == [
        pytest.approx(privacy.epsilon(1)),
        pytest.approx(privacy.epsilon(2)),
    ]
    reason = federation.budget_spent(state)
    assert "round 3 would take ε to 1.446" in reason and "round 2's model" in reason


def test_the_accounted_sampling_must_be_the_federations(medmnist_root):
    with pytest.raises(ValueError, match="accounted for 2 of 4 clients"):
        make_federation(
            medmnist_root, privacy=_privacy(per_round=2),
            config=FederationConfig(rounds=1, client_fraction=1.0),
        )  # fmt: skip


def test_accuracy_round_scores_skip_the_auc_until_the_last_round(medmnist_root):
    """A cross-device run's rounds score loss and ACC only (the same numbers as a full
    score); the last round is scored fully, so the run's final AUC is there."""
    data = load_medmnist("breastmnist", medmnist_root)
    val = to_tensors(data.val, data.info)
    full = run(make_federation(medmnist_root, rounds=3, val=val), 3)
    light = run(
        make_federation(
            medmnist_root, val=val, config=FederationConfig(rounds=3, round_scores="accuracy")
        ),
        3,
    )

    for split in ("test", "val"):
        assert [r[f"{split}_acc"] for r in light.history] == [
            r[f"{split}_acc"] for r in full.history
        ]
        assert [r[f"{split}_loss"] for r in light.history] == [
            r[f"{split}_loss"] for r in full.history
        ]
    assert all("test_auc" not in r and "test_ece" not in r for r in light.history[:2])
    assert light.history[-1] == full.history[-1]
    with pytest.raises(ValueError, match="needs round_scores='full'"):
        FederationConfig(rounds=1, select="best_val", round_scores="accuracy")


def test_local_dp_accounts_each_client_for_the_rounds_it_sent_an_update_in(medmnist_root):
    """Half the clients a round: each trail row carries the client's own ε against the
    server, Opacus's for the rounds it took part in so far (no sampling amplification)."""
    privacy = _privacy(clip=1.0, noise_multiplier=2.0, mode="local", per_round=2)
    config = FederationConfig(rounds=4, client_fraction=0.5)
    state = run(make_federation(medmnist_root, privacy=privacy, config=config), 4)
    seen: dict[int, int] = {}
    for row in state.trail:
        seen[row["client"]] = seen.get(row["client"], 0) + 1
        assert row["privacy_epsilon"] == privacy.site_epsilon(seen[row["client"]])
    assert len(state.trail) == 8 and max(seen.values()) > 1
    assert privacy.site_epsilon(1) > privacy.epsilon(1)  # the server knows who was sampled


class PrivatisingSites:
    """Sites elsewhere that clip and noise their own updates (as fedsieve's ClientApp
    does under local DP); what each sent, by client id."""

    def __init__(self, federation: Federation, privacy: ClientPrivacy) -> None:
        self.trained, self.privacy, self.sent = federation.executor, privacy, {}

    def train(self, global_vector, round_number, client_ids, on_result=None):
        results = []
        for result in self.trained.train(global_vector, round_number, client_ids):
            noised = self.privacy.privatised_by_site(result.update.delta)
            self.sent[result.client_id] = noised
            results.append(replace(result, update=replace(result.update, delta=noised)))
        return results


def test_updates_noised_at_the_sites_are_averaged_as_they_came_not_noised_again(
    medmnist_root,
):
    privacy = _privacy(clip=0.5, noise_multiplier=1.0, mode="local")
    simulated = make_federation(medmnist_root, rounds=1, privacy=privacy)
    sites = PrivatisingSites(simulated, privacy)
    federation = Federation(
        model=simulated.model, clients=[RegisteredClient(c.client_id, len(c)) for c in simulated.clients],
        local=simulated.local, config=simulated.config, defence=simulated.defence,
        evaluation=simulated.evaluation, execution=Execution(executor=sites),
    )  # fmt: skip
    start = federation.initial_state()
    state, _ = federation.run_round(start)
    released = torch.stack(list(sites.sent.values())).sum(dim=0) / 4
    assert torch.allclose(state.global_vector - start.global_vector, released, atol=1e-6)
    assert [row["privacy_epsilon"] for row in state.trail] == [privacy.site_epsilon(1)] * 4


def test_the_non_iid_check_of_sites_elsewhere_needs_a_site_scorer(medmnist_root):
    """Clients that hold no data here: their losses for EMA's check come from the sites
    (a site scorer); without one the federation is refused before any round."""
    simulated = make_federation(medmnist_root, rounds=1)
    check = NonIIDCheck(every=1, loss="mse", threshold=0.25, exclude=False, z=2.0)
    with pytest.raises(ValueError, match="the non-IID check needs their losses from a site"):
        Federation(
            model=simulated.model,
            clients=[RegisteredClient(c.client_id, len(c)) for c in simulated.clients],
            local=simulated.local, config=simulated.config,
            defence=replace(simulated.defence, noniid=check),
            evaluation=simulated.evaluation, execution=Execution(executor=simulated.executor),
        )  # fmt: skip


def test_a_round_that_released_no_model_spends_no_epsilon(medmnist_root):
    # four clients, at least five needed: every round is skipped and releases nothing
    privacy = _privacy(noise_multiplier=5.0, target_epsilon=1.2)  # admits 2 released rounds
    config = FederationConfig(rounds=3, seed=0, min_clients=5)
    federation = make_federation(medmnist_root, privacy=privacy, config=config)
    state = run(federation, 3)
    assert [row["round_skipped"] for row in state.history] == [1.0, 1.0, 1.0]
    assert [row["privacy_epsilon"] for row in state.history] == [0.0, 0.0, 0.0]
    assert federation.budget_spent(state) is None  # the budget still admits a round


def _flipped(clients):
    """Client 3 flips every label (BreastMNIST's two classes swapped)."""
    flipper = clients[3]
    clients[3] = ClientData(flipper.client_id, flipper.images, 1 - flipper.targets)


@pytest.mark.parametrize("backend", ["sequential", "batched"])
def test_validation_at_the_sites_takes_the_flipper_out_with_every_number_in_the_trail(
    medmnist_root, backend
):
    base = make_federation(medmnist_root, edit_clients=_flipped)
    kept, (vals,) = _held_out(base, 0.25)
    federation = make_federation(
        medmnist_root, clients=kept, site_vals=vals, sites=vals,
        filters=(build_filter("site_validation"),), rule=build_aggregator("median"),
        malicious=frozenset({3}), execution=Execution(backend=backend),
        local=LocalTraining(epochs=2, lr=0.05, momentum=0.9, batch_size=32),
    )  # fmt: skip

    state = run(federation, 2)

    first = [row for row in state.trail if row["round"] == 1]
    assert [row["excluded"] for row in first] == [False, False, False, True]
    assert first[3]["reason"] == "site_validation" and first[3]["votes"] >= 2
    for row in first:  # each site's count, its loss of the round's and of each candidate
        assert row["val_n"] == len(vals[row["client"]][1])
        assert {"val_loss", "voters", "contribution"} <= row.keys()
        assert all(f"val_loss_without_{i}" in row for i in range(4))
    assert first[3]["contribution"] < min(row["contribution"] for row in first[:3])
    assert state.history[0]["contribution_3"] == first[3]["contribution"]
    second = [row for row in state.trail if row["round"] == 2]
    assert second[3]["excluded"] and second[3]["banned"] == 1.0
    assert math.isnan(second[3]["votes"])  # banned: not judged again
    assert not any(row["excluded"] for row in second[:3])
