"""DP-FedAvg in the engine: clipping, the fixed-denominator noisy mean, ε from Opacus's
accountant every round, and the budget that ends a run cleanly."""

from __future__ import annotations

import pytest
import torch
from opacus.accountants import RDPAccountant

from config.params import ConfigError, params_warnings, validate_params
from federated.privacy import ClientPrivacy, site_privacy


def _privacy(clients=4, per_round=4, **settings):
    return ClientPrivacy(
        population=clients, per_round=per_round, **{"clip": 1.0, "noise_multiplier": 1.0} | settings
    )


def test_clipping_bounds_every_update_and_leaves_short_ones_alone():
    updates = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    clipped = _privacy(clip=1.0).clipped(updates)
    assert torch.allclose(clipped, torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]]))


def test_epsilon_is_the_rdp_accountants_for_the_rate_the_federation_samples():
    privacy = _privacy(clients=50, per_round=5, noise_multiplier=1.1, delta=1e-6)
    accountant = RDPAccountant()
    for _ in range(30):
        accountant.step(noise_multiplier=1.1, sample_rate=0.1)
    assert privacy.epsilon(30) == pytest.approx(accountant.get_epsilon(1e-6))
    assert privacy.epsilon(0) == 0 and privacy.epsilon(10) < privacy.epsilon(30)


def test_rules_the_accountant_does_not_cover_are_refused_or_warned_about():
    with pytest.raises(ConfigError, match="not with aggregate median; filters pid_made"):
        validate_params(
            {"privacy": {"mode": "central"}, "aggregate": {"name": "median"},
             "filters": [{"name": "pid_made"}]}, "params.yaml",
        )  # fmt: skip
    warned = validate_params(
        {"privacy": {"mode": "central", "unaccounted": "warn"}, "aggregate": {"name": "median"}},
        "params.yaml",
    )
    assert any("ε does not hold with aggregate median" in w for w in params_warnings(warned))
    fine = validate_params({"privacy": {"mode": "local"}}, "params.yaml")
    assert not any("privacy" in w for w in params_warnings(fine))


def test_a_target_spent_before_the_first_round_is_refused_and_a_short_budget_said():
    with pytest.raises(
        ConfigError,
        match=r"target_epsilon = 0.5 is spent before round 1 \(ε after one round = 4.729\)",
    ):
        validate_params({"privacy": {"mode": "central", "target_epsilon": 0.5}}, "params.yaml")
    short = validate_params(
        {"privacy": {"mode": "central", "noise_multiplier": 5.0, "target_epsilon": 1.2},
         "train": {"rounds": 5}}, "params.yaml",
    )  # fmt: skip
    assert "admits 2 of the 5 rounds" in " ".join(params_warnings(short))


def test_a_sites_own_epsilon_is_the_accountants_without_sampling_amplification():
    privacy = site_privacy(clip=1.0, noise_multiplier=1.3, delta=1e-5, target_epsilon=6.0)
    accountant = RDPAccountant()
    for _ in range(3):
        accountant.step(noise_multiplier=1.3, sample_rate=1.0)
    assert privacy.site_epsilon(3) == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-3)
    # the simulation's local mode, sampling half its clients, accounts a client the same
    sampled = _privacy(clients=4, per_round=2, noise_multiplier=1.3, mode="local")
    assert sampled.site_epsilon(3) == privacy.site_epsilon(3) > sampled.epsilon(3)
    assert privacy.site_admits(2) and not privacy.site_admits(3)


def test_a_site_clips_its_update_and_adds_noise_of_its_own_of_the_planned_std():
    update = torch.full((20_000,), 0.1)  # L2 norm 14.1
    privacy = site_privacy(clip=2.0, noise_multiplier=0.5, delta=1e-5, target_epsilon=None)
    clipped = privacy.clipped(update[None])[0]
    assert torch.linalg.vector_norm(clipped).item() == pytest.approx(2.0, rel=1e-5)
    torch.manual_seed(0)
    first = privacy.privatised_by_site(update)
    torch.manual_seed(0)  # the process's seed does not decide the site's noise
    second = privacy.privatised_by_site(update)
    noise = first - clipped
    assert noise.std().item() == pytest.approx(0.5 * 2.0, rel=0.03)
    assert abs(noise.mean().item()) < 0.04  # 5 standard errors
    assert not torch.equal(first, second)
    quiet = site_privacy(clip=2.0, noise_multiplier=1e-9, delta=1e-5, target_epsilon=None)
    assert torch.linalg.vector_norm(quiet.privatised_by_site(update)).item() <= 2.0 + 1e-5
