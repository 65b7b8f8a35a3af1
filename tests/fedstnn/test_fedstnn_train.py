"""Local training learns the noise level; federation keeps drift and diffusion apart."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import Tensor

from aggregation import AggregationRule, build_aggregator
from federated.fedstnn.train import (
    NETWORKS,
    LocalTrainConfig,
    SNNClientData,
    SNNFederationConfig,
    aggregate_networks,
    network_vector,
    run_federation,
    train_local,
)
from models.snn import SNN, SNNConfig

TINY = SNNConfig(state_dim=4, hidden_dim=8, n_blocks=3, n_paths=8)


def _noisy_constant(sigma: float, n: int = 128) -> SNNClientData:
    g = torch.Generator().manual_seed(3)
    x = torch.rand(n, 1, generator=g) * 2 - 1
    return SNNClientData(x=x, y=0.5 + sigma * torch.randn(n, 1, generator=g))


@pytest.mark.parametrize(("start", "truth"), [(0.05, 0.5), (1.0, 0.2)])
def test_trained_sigma_moves_toward_the_truth(start, truth):
    model = SNN(
        dataclasses.replace(TINY, diffusion_init=start), generator=torch.Generator().manual_seed(0)
    )
    data = _noisy_constant(truth)
    probe = torch.zeros(16, 1)
    before = float(
        model.predict(probe, n_paths=256, generator=torch.Generator().manual_seed(1)).std.mean()
    )

    train_local(
        model,
        data,
        LocalTrainConfig(epochs=150, lr=2e-2),
        generator=torch.Generator().manual_seed(2),
    )
    after = float(
        model.predict(probe, n_paths=256, generator=torch.Generator().manual_seed(1)).std.mean()
    )

    assert abs(after - truth) < 0.35 * abs(before - truth)


def test_networks_partition_the_state_dict():
    keys = list(SNN(TINY).state_dict())

    owned = {net: [k for k in keys if k.split(".")[0] in mods] for net, mods in NETWORKS.items()}

    assert sorted(owned["drift"] + owned["diffusion"]) == sorted(keys)
    assert all(k.startswith("diffusion.") for k in owned["diffusion"])
    assert not any(k.startswith("diffusion.") for k in owned["drift"])


class _TakeFirst(AggregationRule):
    """Test rule: the first client's update (to tell the two networks' rules apart)."""

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        return updates[0], {"picked": 0}


def _filled(value_drift: float, value_diffusion: float) -> SNN:
    model = SNN(TINY)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(value_diffusion if name.startswith("diffusion.") else value_drift)
    return model


def test_drift_and_diffusion_aggregate_separately_without_mixing():
    global_model = _filled(0.0, 0.0)
    clients = [_filled(1.0, 10.0), _filled(3.0, 30.0)]
    rules = {"drift": build_aggregator("fedavg"), "diffusion": _TakeFirst()}

    _, diagnostics = aggregate_networks(global_model, clients, torch.tensor([1.0, 3.0]), rules)

    for name, p in global_model.state_dict().items():
        expected = 10.0 if name.startswith("diffusion.") else (1.0 * 1 + 3.0 * 3) / 4
        assert torch.allclose(p, torch.full_like(p, expected)), name
    assert diagnostics["diffusion"] == {"picked": 0}


def test_fedavg_on_both_networks_is_the_weighted_average_of_models():
    g = torch.Generator()
    global_model = SNN(TINY, generator=g.manual_seed(0))
    clients = [SNN(TINY, generator=g.manual_seed(s)) for s in (1, 2, 3)]
    weights = torch.tensor([10.0, 30.0, 60.0])
    rules = SNNFederationConfig().rules()

    aggregate_networks(global_model, clients, weights, rules)

    for network in NETWORKS:
        expected = sum(
            w / 100 * network_vector(c, network) for w, c in zip(weights, clients, strict=True)
        )
        torch.testing.assert_close(network_vector(global_model, network), expected)


def test_federation_is_reproducible_and_samples_a_fraction():
    clients = [_noisy_constant(0.3, n=16) for _ in range(10)]
    config = SNNFederationConfig(rounds=2, fraction=0.3, local=LocalTrainConfig(epochs=2))

    runs = [
        run_federation(
            SNN(TINY, generator=torch.Generator().manual_seed(0)), clients, config, seed=7
        )
        for _ in range(2)
    ]

    assert [len(h["clients"]) for h in runs[0].history] == [3, 3]
    assert runs[0].history[0]["clients"] == runs[1].history[0]["clients"]
    for key, value in runs[0].model.state_dict().items():
        assert torch.equal(value, runs[1].model.state_dict()[key])


def test_federation_rejects_unknown_rule():
    with pytest.raises(ValueError, match="fedavg"):
        SNNFederationConfig(diffusion_rule="no_such_rule").rules()


def test_diffusion_lr_scale_applies_to_the_diffusion_only():
    model = SNN(TINY, generator=torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = LocalTrainConfig(epochs=3, diffusion_lr_scale=1e-12)

    train_local(
        model, _noisy_constant(0.3, n=16), config, generator=torch.Generator().manual_seed(1)
    )

    after = model.state_dict()
    for key in after:
        if key.startswith("diffusion."):
            assert float((after[key] - before[key]).abs().max()) < 1e-9, key
    assert float((after["readout.weight"] - before["readout.weight"]).abs().max()) > 1e-4


@pytest.mark.parametrize(
    ("field", "value"),
    [("optimizer", "lbfgs"), ("diffusion_lr_scale", 0.0), ("n_paths", 1), ("gradient", "adjoint")],
)
def test_local_config_validates_itself(field, value):
    with pytest.raises(ValueError, match=field):
        LocalTrainConfig(**{field: value})
