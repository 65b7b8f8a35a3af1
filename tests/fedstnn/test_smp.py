"""The sample-wise SMP gradient (Eqs. 32–36) equals autograd's pathwise gradient."""

from __future__ import annotations

import pytest
import torch

from federated.fedstnn.losses import build_loss
from federated.fedstnn.smp import pathwise_gradients, smp_gradients
from federated.fedstnn.train import LocalTrainConfig, SNNClientData, train_local
from models.snn import SNN, SNNConfig


@pytest.mark.parametrize("loss_name", ["energy_score", "gaussian_nll", "squared_error"])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_smp_equals_autograd_in_float64(loss_name, activation):
    config = SNNConfig(
        in_dim=2,
        out_dim=2,
        state_dim=4,
        hidden_dim=6,
        n_blocks=5,
        activation=activation,
        fourier_features=2,
    )
    model = SNN(config, generator=torch.Generator().manual_seed(0)).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 2, generator=g, dtype=torch.float64)
    y = torch.randn(7, 2, generator=g, dtype=torch.float64)
    noise = model.sample_noise(7, 5, generator=g)
    loss_fn = build_loss(loss_name)

    loss_smp, grads_smp = smp_gradients(model, x, y, loss_fn, noise)
    loss_ad, grads_ad = pathwise_gradients(model, x, y, loss_fn, noise)

    assert loss_smp == pytest.approx(float(loss_ad), rel=1e-12)
    assert grads_smp.keys() == grads_ad.keys() == dict(model.named_parameters()).keys()
    for name, grad in grads_ad.items():
        torch.testing.assert_close(grads_smp[name], grad, rtol=1e-9, atol=1e-12, msg=name)
    assert any(float(g.abs().max()) > 1e-3 for g in grads_ad.values())


def test_trainer_option_smp_follows_the_same_trajectory():
    config = SNNConfig(state_dim=4, hidden_dim=8, n_blocks=3, n_paths=4)
    g = torch.Generator().manual_seed(0)
    data = SNNClientData(
        x=torch.rand(20, 1, generator=g).double(), y=torch.rand(20, 1, generator=g).double()
    )
    models = {}
    for gradient in ("autograd", "smp"):
        model = SNN(config, generator=torch.Generator().manual_seed(1)).double()
        local = LocalTrainConfig(epochs=3, batch_size=10, gradient=gradient)
        train_local(model, data, local, generator=torch.Generator().manual_seed(2))
        models[gradient] = model

    for key, value in models["autograd"].state_dict().items():
        torch.testing.assert_close(models["smp"].state_dict()[key], value, rtol=1e-9, atol=1e-12)
