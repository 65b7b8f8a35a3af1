"""Experiment data generators, metrics and tiny end-to-end runs of each experiment."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from federated.fedstnn.experiments import (
    EXPERIMENTS,
    ImageConfig,
    experiment_config,
    function_2d,
    partition_grouped,
    partition_iid,
    regression_metrics,
    render_letters,
    run_config,
    run_experiment,
    segmentation_metrics,
    top_k_binary,
)

FAST = {
    "federation": {"rounds": 1, "local": {"epochs": 2}},
    "model": {"n_paths": 4},
    "eval_paths": 8,
    "track_rounds": True,
}


def test_partition_iid_sizes():
    parts = partition_iid(1000, 5, 100, np.random.default_rng(0))

    assert [p.size for p in parts] == [100] * 5
    assert all(np.unique(p).size == 100 for p in parts)


def test_partition_grouped_is_mostly_own_group():
    point_groups = np.arange(1000) * 10 // 1000  # 10 consecutive intervals of 100
    parts, groups = partition_grouped(point_groups, 20, 50, 10, np.random.default_rng(0))

    assert groups.tolist() == [c // 2 for c in range(20)]  # clients 0-1 group 0, ...
    for idx, group in zip(parts, groups, strict=True):
        assert idx.size == 60
        assert np.sum(point_groups[idx] == group) == 50


def test_partition_grouped_rejects_too_many_points():
    with pytest.raises(ValueError, match="main_points"):
        partition_grouped(np.array([0, 0, 1, 1]), 2, 3, 0, np.random.default_rng(0))


def test_function_2d_jumps_across_the_axes():
    assert function_2d(np.array([0.5]), np.array([0.5]))[0] == pytest.approx(1.0)
    assert function_2d(np.array([-0.5]), np.array([0.5]))[0] == pytest.approx(0.5)
    assert function_2d(np.array([-0.5]), np.array([-0.5]))[0] == pytest.approx(-0.5)
    assert function_2d(np.array([0.5]), np.array([-0.5]))[0] == pytest.approx(-0.25)


def test_render_letters_one_letter_per_section():
    image = render_letters("FSU", 32, 96, 30)

    assert image.shape == (32, 96)
    assert set(np.unique(image)) == {0.0, 1.0}
    for s in range(3):
        section = image[:, 32 * s : 32 * (s + 1)]
        assert section.sum() > 40  # a visible letter
        assert section[:, [0, -1]].sum() == 0  # not crossing into the neighbours


def test_top_k_and_segmentation_hand_computed():
    binary = top_k_binary(np.array([0.1, 0.9, 0.5, 0.7]), 2)

    assert binary.tolist() == [0, 1, 0, 1]
    assert segmentation_metrics(binary, np.array([0, 1, 1, 0])) == {"accuracy": 0.5, "iou": 1 / 3}


def test_regression_metrics_of_a_perfect_model():
    rng = np.random.default_rng(0)
    truth = np.zeros(20000)
    observed = truth + 0.5 * rng.standard_normal(truth.size)

    m = regression_metrics(truth, np.full(truth.size, 0.5), truth, observed, 0.5)

    assert m["mse"] == 0 and m["sigma_rel_error"] == 0
    assert m["coverage_2sigma"] == pytest.approx(0.954, abs=0.01)


def test_presets_cover_the_issue():
    assert set(EXPERIMENTS) == {"1d_iid", "1d_noniid_110", "1d_noniid_60", "2d", "image"}


TINY_1D = {"n_points": 500, "n_clients": 10, "n_groups": 5, "main_points": 20, "other_points": 5}


def test_run_1d_noniid_tiny_returns_plain_arrays():
    result = run_experiment("1d_noniid_60", **TINY_1D, **FAST)

    assert result.name == "1d_noniid_60"
    assert {"mse", "sigma_rel_error", "coverage_2sigma", "local_mse"} <= result.metrics.keys()
    assert all(np.isfinite(v) for v in result.metrics.values())
    assert result.data.inputs.shape == (500, 1) and result.data.truth.shape == (500,)
    assert [idx.size for idx in result.data.indices] == [25] * 10
    assert list(result.predictions) == ["global", "client_0"]
    for prediction in result.predictions.values():
        assert isinstance(prediction.mean, np.ndarray) and prediction.mean.shape == (500,)
        assert prediction.std.shape == prediction.sample.shape == (500,)
    assert len(result.history) == 1 and "global_mse" in result.history[0]


def test_the_same_seed_gives_the_same_numbers():
    config = experiment_config("1d_noniid_60", **TINY_1D, **FAST)

    first, second = run_config(config, name="a"), run_config(config, name="b")

    assert first.metrics == second.metrics
    assert np.array_equal(first.predictions["global"].sample, second.predictions["global"].sample)


def test_the_engine_draws_no_figures():
    code = (
        "import sys; from federated.fedstnn.experiments import run_experiment; "
        "run_experiment('2d', grid=10, n_clients=4, main_points=5, other_points=2, "
        "federation={'rounds': 1, 'local': {'epochs': 1}}); "
        "assert 'matplotlib' not in sys.modules, 'matplotlib was imported'"
    )

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)

    assert done.returncode == 0, done.stderr[-2000:]


def test_run_2d_tiny():
    result = run_experiment("2d", grid=20, n_clients=4, main_points=20, other_points=6, **FAST)

    assert {"mse", "mse_quadrant_1", "local_mse_quadrant_4"} <= result.metrics.keys()
    assert result.data.inputs.shape == (400, 2)
    assert set(result.data.point_groups.tolist()) == {0, 1, 2, 3}  # the quadrants
    m = result.metrics
    near, away = m["mse_over_sigma2_near_jumps"], m["mse_over_sigma2_away_from_jumps"]
    share = 1 - 0.8**2  # the grid's share within 0.1 of an axis: 36 %
    whole = share * near + (1 - share) * away  # the two parts make up the whole
    assert whole == pytest.approx(m["mse_over_sigma2"], rel=0.1)


def test_run_image_tiny():
    result = run_experiment(
        "image",
        n_clients=3,
        main_points=30,
        other_points=6,
        height=16,
        width=48,
        font_size=14,
        **FAST,
    )

    assert {"global_iou", "group_0_F_iou", "group_2_U_accuracy"} <= result.metrics.keys()
    assert set(result.local_models) == {"group_0_F", "group_1_S", "group_2_U"}
    assert list(result.predictions) == ["global", "group_0_F", "group_1_S", "group_2_U"]
    assert result.data.truth.shape == (16 * 48,)


def test_image_config_validates_sections():
    with pytest.raises(ValueError, match="divisible"):
        ImageConfig(width=100)


@pytest.mark.parametrize("trainer", ["smp", "autograd"])
def test_each_trainer_reduces_the_loss_and_keeps_the_diffusion_positive(trainer):
    import torch

    from federated.fedstnn.losses import build_loss
    from federated.fedstnn.train import SNNClientData, train_local
    from models.snn import SNN

    config = experiment_config("1d_iid", trainer=trainer, federation={"local": {"epochs": 150}})
    g = torch.Generator().manual_seed(0)
    x = torch.rand(100, 1, generator=g) * 2 - 1
    data = SNNClientData(x, 0.8 * x + 0.2 * torch.randn(100, 1, generator=g))  # a line, σ = 0.2
    model = SNN(config.model, generator=torch.Generator().manual_seed(1))
    loss = build_loss(config.federation.local.loss)
    noise = model.sample_noise(100, 64, generator=torch.Generator().manual_seed(2))
    before = float(loss(model(x, noise=noise), data.y))

    train_local(model, data, config.federation.local, generator=torch.Generator().manual_seed(3))

    after = float(loss(model(x, noise=noise), data.y))
    sigma = model.predict(x, n_paths=64, generator=torch.Generator().manual_seed(4)).std
    assert after < 0.7 * before, (before, after)
    assert float(sigma.min()) > 0.01 and float(sigma.max()) < 1.0  # a band, not collapsed


def test_the_smp_trainer_is_the_papers_recipe_and_overrides_win():
    smp = experiment_config("2d", trainer="smp")
    tuned = experiment_config("2d", trainer="smp", federation={"local": {"lr": 0.01}})

    local = smp.federation.local
    assert (local.gradient, local.optimizer, local.momentum, smp.model.n_paths) == (
        "smp", "sgd", 0.0, 1,
    )  # fmt: skip
    assert (local.loss, smp.federation.lr_decay, local.diffusion_lr_scale) == (
        "squared_error", 1.0, 1.0,
    )  # fmt: skip
    assert experiment_config("2d").federation.local.gradient == "autograd"
    assert tuned.federation.local.lr == 0.01 and tuned.federation.local.optimizer == "sgd"
    assert tuned.federation.fraction == 0.25  # the preset's, under the recipe and override
    with pytest.raises(ValueError, match="unknown trainer 'adam'; available: autograd, smp"):
        experiment_config("2d", trainer="adam")


def test_settings_are_nested_as_the_engine_takes_them_and_unknown_ones_named():
    config = experiment_config("image", federation={"rounds": 3}, model={"hidden_dim": 16})

    assert config.federation.rounds == 3 and config.federation.fraction == 0.3
    assert (config.model.hidden_dim, config.model.fourier_features) == (16, 5)
    with pytest.raises(ValueError, match=r"^federation.local.epoch is not a setting here; "):
        experiment_config("2d", federation={"local": {"epoch": 3}})
    with pytest.raises(
        ValueError, match=r"model\.n_paths must be >= 2 for the loss .energy_score."
    ):
        experiment_config("1d_iid", model={"n_paths": 1})
    with pytest.raises(ValueError, match=r"model\.in_dim and model\.out_dim are the data.s"):
        experiment_config("1d_iid", model={"in_dim": 3})
    with pytest.raises(
        ValueError, match=r"^federation\.local: epochs must be an integer >= 0, got -1$"
    ):
        experiment_config("1d_iid", federation={"local": {"epochs": -1}})
    with pytest.raises(ValueError, match=r"^federation: unknown aggregator 'nope'; available: "):
        experiment_config("1d_iid", federation={"drift_rule": "nope"})
    with pytest.raises(ValueError, match=r"^model takes a mapping of its settings \(in_dim, "):
        experiment_config("1d_iid", model=3)


def test_a_rule_that_cannot_aggregate_a_rounds_clients_is_refused_before_the_run():
    too_many = {"drift_rule": "krum", "drift_rule_params": {"f": 40}}  # 10 clients a round

    with pytest.raises(ValueError, match=r"^federation: the drift network's rule cannot aggre"):
        experiment_config("1d_iid", federation=too_many)
    assert experiment_config("1d_iid", federation=too_many | {"drift_rule_params": {"f": 3}})
