import re
from pathlib import Path

import pytest

from config.params import (
    ConfigError,
    eval_batch_size,
    load_params,
    params_hash,
    population,
    privacy_budget,
    validate_params,
)

REPO = Path(__file__).resolve().parents[2]
PARAMS = REPO / "params.yaml"


def test_the_default_params_are_valid_and_hash_stably():
    params = load_params(PARAMS)

    assert params.data.dataset == "breastmnist"
    assert params.aggregate.name == "fedavg" and params.filters == []
    assert params_hash(params) == params_hash(load_params(PARAMS))
    assert params_hash(params) != params_hash(load_params(PARAMS, ["train.rounds=3"]))


def test_overrides_are_parsed_as_yaml_and_validated():
    params = load_params(
        PARAMS,
        ["train.rounds=3", "aggregate={name: fedavg}", "partition.scheme=dirichlet",
         "partition.alpha=0.1"],
    )  # fmt: skip

    assert params.train.rounds == 3 and params.partition.alpha == 0.1


BAD = [
    ("data.dataset=cifar10", "data.dataset", "allowed: adrenalmnist3d, bloodmnist"),
    # a 3-D set with the default 2-D model: the models that take volumes
    ("data.dataset=organmnist3d", "model.name = small_cnn", "allowed: resnet18_3d, resnet50_3d"),
    ("model.name=small_cnn3d", "model.name = small_cnn3d", "allowed: logreg, resnet18,"),
    ("model.name=vgg16", "model.name", "allowed: logreg, resnet18"),
    ("aggregate.name=average", "aggregate", "available: "),
    ("aggregate.f=2", "aggregate", "no parameter f"),
    ("partition.scheme=pathological", "partition.scheme", "allowed: dirichlet, iid"),
    ("train.rounds=-1", "train.rounds", "must be an integer >= 1"),
    ("train.rounds=2.5", "train.rounds", "integer"),
    ("train.client_fraction=0", "train.client_fraction", "must be a number in (0, 1]"),
    ("train.client_fraction=1.5", "train.client_fraction", "must be a number in (0, 1]"),
    ("partition.sigma=0", "partition.sigma", "must be a finite number > 0"),
    ("partition.num_clients=0", "partition.num_clients", "greater than or equal to 1"),
    ("train.lr=fast", "train.lr", "valid number"),
    (
        "train.momentum=1.5",
        "train.momentum",
        "must be a number in [0, 1)",
    ),  # SGD's momentum is in [0, 1)
    ("train.device=tpu", "train.device", "'auto', 'cpu' or 'cuda'"),
    ("train.backend=threads", "train.backend", "'sequential', 'batched' or 'auto'"),
    ("compare.dispatch=ray", "compare.dispatch", "'local' or 'deployment'"),
    ("train.max_parallel=0", "train.max_parallel", "must be an integer >= 1 or null"),
    ("train.roundz=3", "train.roundz", "keys allowed in train: rounds"),
    ("filters=[{name: nonexistent}]", "filters.0", "unknown filter"),
    ("compare.methods={fedavg: {}", "compare.methods", "not valid YAML"),  # unclosed
    ("eval.round_scores=auc", "eval.round_scores", "'full' or 'accuracy'"),
    ("train.server_optimizer={name: nadam}", "train.server_optimizer", "available: adagrad, adam"),
    ("train.server_optimizer={name: adam, beta2: 1}", "train.server_optimizer", "beta2 must be"),
    ("train.server_optimizer={name: momentum, eps: 1}", "train.server_optimizer", "accepted: lr"),
    ("train.server_lr=0", "train.server_lr", "must be a finite number > 0"),
    ("train.local_work={epochs: [0, 2]}", "train.local_work.epochs", "1 <= low <= high"),
    ("train.local_work={epochs: [3, 2]}", "train.local_work.epochs", "1 <= low <= high"),
    (
        "train.local_work={steps: [1, 2]}",
        "train.local_work.steps",
        "keys allowed in train.local_work: epochs",
    ),
]


@pytest.mark.parametrize(("override", "key", "allowed"), BAD)
def test_each_bad_value_is_one_line_naming_key_and_what_is_allowed(override, key, allowed):
    with pytest.raises(ConfigError) as error:
        load_params(PARAMS, [override])

    message = str(error.value)
    assert "\n" not in message
    assert key in message and allowed in message


def test_the_server_optimizer_is_one_line_of_params_and_server_lr_its_sgd_shorthand():
    adam = load_params(PARAMS, ["train.server_optimizer={name: adam, lr: 0.01}"])
    default = load_params(PARAMS)

    assert adam.train.server_step() == ("adam", {"lr": 0.01})
    assert load_params(PARAMS, ["train.server_lr=0.5"]).train.server_step() == ("sgd", {"lr": 0.5})
    assert params_hash(adam) != params_hash(default)  # unset, the hash is as it was before
    assert params_hash(load_params(PARAMS, ["train.server_optimizer=null"])) == params_hash(default)
    for overrides, says in [
        (["train.server_lr=0.5", "train.server_optimizer={name: adam}"], "both set"),
        (
            [
                "attack={name: backdoor, model_replacement: true}",
                "train.server_optimizer={name: yogi}",
            ],
            "which train.server_optimizer yogi does not take; use sgd",
        ),
    ]:
        with pytest.raises(ConfigError, match=says) as error:
            load_params(PARAMS, overrides)
        assert "\n" not in str(error.value)


def test_fednova_and_local_work_are_params_and_what_cannot_work_is_refused():
    params = load_params(PARAMS, ["aggregate={name: fednova}", "train.local_work={epochs: [1, 4]}"])
    default = load_params(PARAMS)

    assert params.train.local_work.epochs == (1, 4) and params.aggregate.name == "fednova"
    assert params_hash(load_params(PARAMS, ["train.local_work=null"])) == params_hash(default)
    for rule in ("fednova", "afl"):
        with pytest.raises(ConfigError, match="preaggregators, which remake the rows") as error:
            load_params(PARAMS, [f"aggregate={{name: {rule}}}", "preaggregators=[{name: clip}]"])
        assert "\n" not in str(error.value)
    assert load_params(PARAMS, ["aggregate={name: afl, step_size: 0.05}"]).aggregate.name == "afl"
    with pytest.raises(ConfigError, match="afl step_size must be a finite number >= 0, got -1"):
        load_params(PARAMS, ["aggregate={name: afl, step_size: -1}"])
    with pytest.raises(ConfigError, match="aggregate afl is simulated only"):
        validate_params(at_sites(aggregate={"name": "afl"}), "p.yaml")
    with pytest.raises(ConfigError, match=r"train\.local_work must be null: each site trains"):
        validate_params(at_sites(train={"local_work": {"epochs": [1, 2]}}), "p.yaml")


def test_scaffold_is_one_line_of_params_and_what_it_cannot_run_with_is_refused():
    plain_sgd = ["train.scaffold=true", "train.momentum=0"]

    assert load_params(PARAMS, plain_sgd).train.scaffold
    assert load_params(PARAMS, [*plain_sgd, "train.backend=batched"]).train.scaffold
    assert params_hash(load_params(PARAMS, ["train.scaffold=false"])) == params_hash(
        load_params(PARAMS)
    )
    for overrides, says in [
        (["train.scaffold=true"], "train.momentum = 0.9: SCAFFOLD's option II assumes plain"),
        ([*plain_sgd, "train.prox_mu=0.1"], "set train.prox_mu: 0"),
        ([*plain_sgd, "privacy.mode=central"], "train.scaffold (its control deltas"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(says)) as error:
            load_params(PARAMS, overrides)
        assert "\n" not in str(error.value)
    # at real sites each keeps its own c_i; not with local DP, which would not cover Δc_i
    assert validate_params(at_sites(train={"scaffold": True, "momentum": 0}), "p.yaml")
    local_dp = {"mode": "local", "clip": 1.0, "noise_multiplier": 1.0}
    with pytest.raises(ConfigError, match="control deltas would leave them neither clipped"):
        validate_params(
            at_sites(train={"scaffold": True, "momentum": 0}, privacy=local_dp), "p.yaml"
        )


def test_a_compared_methods_train_settings_are_refused_as_its_cells_would_refuse_them():
    for methods, says in [
        (
            "{s: {train: {scaffold: true}}}",
            "compare.methods.s.train: train.scaffold with train.momentum",
        ),
        ("{s: {train: {lrr: 1}}}", "unknown train key 'lrr'; keys allowed: rounds"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(says)) as error:
            load_params(PARAMS, [f"compare.methods={methods}"])
        assert "\n" not in str(error.value)


def test_a_bad_value_is_named_where_it_was_given(tmp_path):
    # a value --set gave is --set's; one the file holds is the file's, --set or not
    (tmp_path / "params.yaml").write_text("train:\n  rounds: 0\n")
    with pytest.raises(ConfigError) as given:
        load_params(PARAMS, ["train={rounds: 0}"])
    with pytest.raises(ConfigError) as held:
        load_params(tmp_path / "params.yaml", ["train.lr=0.1"])

    assert str(given.value) == "--set: train.rounds = 0: must be an integer >= 1"
    assert (
        str(held.value) == f"{tmp_path / 'params.yaml'}: train.rounds = 0: must be an integer >= 1"
    )


def test_a_value_that_is_not_yaml_is_named_with_where_the_parser_stopped():
    with pytest.raises(ConfigError) as given:
        load_params(PARAMS, ["compare.methods={fedavg: {}"], option="-S")

    assert str(given.value).startswith(
        "-S compare.methods: the value '{fedavg: {}' is not valid YAML (line 1, column 12: "
        "expected ',' or '}', but got '<stream end>'); quote the whole option"
    )


def test_unreadable_params_files_are_clear(tmp_path):
    (tmp_path / "bad.yaml").write_text("train: [rounds\n")
    (tmp_path / "list.yaml").write_text("- 1\n")

    with pytest.raises(ConfigError, match=r"not valid YAML \(line 2, column 1: expected"):
        load_params(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="mapping"):
        load_params(tmp_path / "list.yaml")
    with pytest.raises(ConfigError, match="file not found"):
        load_params(tmp_path / "missing.yaml")


IGNORED = [
    (["privacy.noise_multiplier=1.0"], "privacy.noise_multiplier", "privacy.mode is off"),
    (["privacy.target_epsilon=5"], "privacy.target_epsilon", "privacy.mode is off"),
    (["partition.alpha=0.1"], "partition.alpha", "partition.scheme iid does not take it"),
    (["partition.scheme=shards", "partition.sigma=2"], "partition.sigma", "shards"),
    (["attack.fraction=0.3"], "attack.fraction", "attack.name is none"),
    (["attack.name=label_flip", "attack.ids=[1]", "attack.fraction=0.3"], "attack.fraction",
     "attack.ids names"),
    (["noniid.z=3"], "noniid.z", "noniid.exclude is false"),
    (["train.backend=sequential", "train.max_parallel=4"], "train.max_parallel", "sequential"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "key", "why"), IGNORED)
def test_a_setting_nothing_would_read_is_refused_in_one_line(overrides, key, why):
    with pytest.raises(ConfigError) as error:
        load_params(PARAMS, overrides)

    message = str(error.value)
    assert "\n" not in message
    assert f"{key} is set but" in message and why in message and "ignored" in message


def test_the_same_settings_are_taken_where_they_are_read():
    params = load_params(
        PARAMS,
        ["privacy.mode=central", "privacy.noise_multiplier=1.5", "partition.scheme=dirichlet",
         "partition.alpha=0.1", "attack.name=label_flip", "attack.fraction=0.3",
         "privacy.unaccounted=warn", "noniid.exclude=true", "noniid.z=3"],
    )  # fmt: skip

    assert params.privacy.noise_multiplier == 1.5 and params.partition.alpha == 0.1
    assert params.attack.fraction == 0.3 and params.noniid.z == 3


def test_best_val_selection_refuses_rounds_scored_without_the_auc():
    with pytest.raises(ConfigError) as error:
        load_params(PARAMS, ["eval.select=best_val", "eval.round_scores=accuracy"])

    message = str(error.value)
    assert "\n" not in message and "it needs round_scores: full" in message


AT_SITES = ["eval.where=sites", "noniid.every=0", "noniid.final=false"]
HUB_DATA = [
    (["aggregate.name=zeno", "aggregate.b=1"], "aggregate zeno"),
    (["aggregate.name=fltrust", "partition.root_size=50"], "aggregate fltrust"),
    (["partition.root_size=50"], "partition.root_size must be 0"),
    (["attack.name=backdoor"], "attack.name backdoor"),
    (["partition.local_test=0"], "partition.local_test must be > 0"),
    (["eval.select=best_val"], "eval.select best_val"),
]


@pytest.mark.parametrize(("overrides", "what"), HUB_DATA)
def test_scored_at_the_sites_what_needs_images_at_the_hub_is_refused_in_one_line(overrides, what):
    with pytest.raises(ConfigError) as error:
        load_params(PARAMS, AT_SITES + overrides)

    message = str(error.value)
    assert "\n" not in message and f"eval.where = sites: {what}" in message


def test_the_non_iid_check_runs_where_the_data_is_at_real_sites_and_scored_at_sites():
    # the sites compute their losses of the model on their own data (one number each)
    checked = {"every": 1, "final": True, "exclude": True}
    params = validate_params(at_sites(noniid=checked, eval={"where": "sites"}), "params")

    assert params.noniid.exclude and params.eval.where == "sites"
    assert load_params(PARAMS, ["eval.where=sites"]).noniid.every == 1


def test_scoring_at_the_hub_hashes_as_before_eval_where_and_at_the_sites_differently():
    default = load_params(PARAMS)

    assert load_params(PARAMS, AT_SITES).eval.where == "sites"
    assert params_hash(load_params(PARAMS, ["eval.where=hub"])) == params_hash(default)
    sites, off = load_params(PARAMS, AT_SITES), load_params(PARAMS, AT_SITES[1:])
    assert params_hash(sites) != params_hash(off)


SITES = [{"name": f"site-{k}", "node_id": k + 1, "samples": 100} for k in range(3)]


def at_sites(**sections: object) -> dict[str, object]:
    """Params of a federation of the three sites in SITES, with ``sections`` added."""
    federation = {"runtime": "flower", "sites": SITES}
    noniid = {"every": 0, "final": False}
    return {"data": {"dataset": "digits"}, "noniid": noniid, "federation": federation, **sections}


def test_at_real_sites_the_population_is_the_registered_sites() -> None:
    privacy = {"mode": "central", "noise_multiplier": 1.0, "target_epsilon": 50.0}
    params = validate_params(at_sites(privacy=privacy), "params")

    assert population(params) == 3 != params.partition.num_clients
    assert privacy_budget(params).population == 3
    assert privacy_budget(params).per_round == 3
    assert population(validate_params({}, "params")) == params.partition.num_clients


def test_a_partition_that_is_not_the_sites_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as error:
        validate_params(at_sites(partition={"num_clients": 5}), "params.yaml")

    assert str(error.value) == (
        "params.yaml: federation.runtime = flower: partition.num_clients = 5 but "
        "federation.sites names 3 sites: the sites are the clients; leave "
        "partition.num_clients out or make it 3"
    )
    assert validate_params(at_sites(partition={"num_clients": 3}), "params").partition


def test_a_misspelt_key_in_a_site_entry_is_named_not_the_key_it_left_missing() -> None:
    sites = [{"name": "a", "node-id": 1, "samples": 100}, *SITES[1:]]
    with pytest.raises(ConfigError) as error:
        validate_params(at_sites() | {"federation": {"runtime": "flower", "sites": sites}}, "p")

    message = str(error.value)
    assert "unknown key 'federation.sites.0.node-id'" in message, message
    assert "name, node_id, samples" in message and "\n" not in message


VOLUMES = ["data.dataset=adrenalmnist3d", "data.size=64", "model.name=small_cnn3d"]


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["data.size=128"], "data.size = 128: adrenalmnist3d is a 3-D set; allowed: 28, 64"),
        (["model.name=resnet18"], "model.name = resnet18 does not take adrenalmnist3d"),
    ],
)
def test_what_cannot_take_volumes_is_refused_in_one_line(overrides, says):
    with pytest.raises(ConfigError) as error:
        load_params(PARAMS, [*VOLUMES, *overrides])

    assert says in str(error.value) and "\n" not in str(error.value)


def test_a_volume_run_validates_and_scores_in_batches_sized_by_its_voxels():
    sizes = {
        size: load_params(PARAMS, [*VOLUMES, f"data.size={size}", "tracking.register_model=false"])
        for size in (28, 64)
    }

    assert all(params.volumes for params in sizes.values())
    assert {s: eval_batch_size(p) for s, p in sizes.items()} == {28: 18, 64: 8}
    assert not load_params(PARAMS).volumes


@pytest.mark.parametrize(
    ("overrides", "what"),
    [
        (["partition.local_test=0"], "set partition.local_test > 0"),
        (["privacy.mode=central", "privacy.unaccounted=warn"], "privacy.mode = central"),
    ],
)
def test_validation_at_the_sites_needs_held_out_splits_and_no_central_dp(overrides, what):
    with pytest.raises(ConfigError) as error:
        load_params(PARAMS, ["filters=[{name: site_validation}]", *overrides])

    message = str(error.value)
    assert "\n" not in message and "filters site_validation" in message and what in message


def test_validation_at_the_sites_is_in_the_plan_the_sites_approve():
    from federated.data import dataset_info
    from flowerapp.hub import site_task

    plain = load_params(PARAMS)
    validated = load_params(PARAMS, ["filters=[{name: site_validation}]"])

    assert site_task(plain, dataset_info("breastmnist")).plan()["validation"] is False
    assert site_task(validated, dataset_info("breastmnist")).plan()["validation"] is True
