"""DP-FedAvg in the engine: clipping, the fixed-denominator noisy mean, ε from Opacus's
accountant every round, and the budget that ends a run cleanly."""

from __future__ import annotations

import pytest
import torch
from opacus.accountants import RDPAccountant

from config.params import ConfigError, params_warnings, validate_params
from federated.privacy import ClientPrivacy


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
