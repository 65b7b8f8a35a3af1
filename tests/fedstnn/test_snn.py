"""The SNN and its Euler–Maruyama solver: shapes, determinism, zero-diffusion limit."""

from __future__ import annotations

import pytest
import torch

from models.sde_solver import euler_maruyama
from models.snn import SNN, SNNConfig, build_snn


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_shapes():
    model = SNN(SNNConfig(in_dim=2, out_dim=3, state_dim=5, n_blocks=4), generator=_gen(0))
    x = torch.randn(7, 2)

    samples = model(x, n_paths=6, generator=_gen(1))
    noise = model.sample_noise(7, 6, generator=_gen(1))
    paths = model.paths(x, noise)
    prediction = model.predict(x, n_paths=6, generator=_gen(1))

    assert samples.shape == (6, 7, 3)  # (K, B, out)
    assert noise.shape == (4, 6, 7, 5)  # (N, K, B, d)
    assert paths.shape == (5, 6, 7, 5)  # (N+1, K, B, d)
    assert prediction.mean.shape == prediction.std.shape == (7, 3)


@pytest.mark.parametrize("fourier_features", [0, 3])
def test_state_dict_keys_name_the_four_parts(fourier_features):
    model = SNN(SNNConfig(in_dim=2, fourier_features=fourier_features))

    prefixes = {key.split(".")[0] for key in model.state_dict()}

    assert prefixes == {"lift", "drift", "diffusion", "readout"}


def test_same_seed_same_model_and_samples():
    config = SNNConfig(n_blocks=3)
    a, b = SNN(config, generator=_gen(0)), SNN(config, generator=_gen(0))
    x = torch.linspace(-1, 1, 9)[:, None]

    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key])
    assert torch.equal(a(x, generator=_gen(5)), b(x, generator=_gen(5)))
    assert not torch.equal(a(x, generator=_gen(5)), a(x, generator=_gen(6)))


def test_paths_differ_and_initial_noise_level():
    model = SNN(SNNConfig(diffusion_init=0.3), generator=_gen(0))

    samples = model(torch.zeros(4, 1), n_paths=64, generator=_gen(1))
    g = model.g(0.0, torch.zeros(3, model.config.state_dim))

    assert samples.std(dim=0).min() > 0
    assert torch.allclose(g, torch.full_like(g, 0.3), atol=0.02)


def test_zero_diffusion_makes_the_snn_deterministic():
    model = SNN(SNNConfig(n_blocks=4), generator=_gen(0))
    with torch.no_grad():
        for block in model.diffusion.blocks:
            block[-1].weight.zero_()
            block[-1].bias.fill_(-80.0)  # softplus(-80) ~ 1e-35
    x = torch.linspace(-1, 1, 5)[:, None]

    samples = model(x, n_paths=8, generator=_gen(1))
    # the deterministic residual network X_{n+1} = X_n + h f(X_n)
    state, h = model.lift(x), model.config.step
    for n in range(model.config.n_blocks):
        state = state + h * model.drift(n * h, state)
    expected = model.readout(state)

    assert torch.allclose(samples, expected.expand_as(samples), atol=1e-6)
    assert model.predict(x, n_paths=8, generator=_gen(2)).std.max() < 1e-6


def test_euler_maruyama_hand_computed_step():
    ts = torch.tensor([0.0, 0.25])
    x0 = torch.tensor([2.0])
    noise = torch.tensor([[1.0]])

    path = euler_maruyama(lambda t, x: -x, lambda t, x: torch.full_like(x, 3.0), x0, ts, noise)

    # 2 + 0.25 * (-2) + sqrt(0.25) * 3 * 1 = 3.0
    assert torch.allclose(path, torch.tensor([[2.0], [3.0]]))


def test_euler_maruyama_rejects_wrong_noise_shape():
    with pytest.raises(ValueError, match="noise must have shape"):
        euler_maruyama(
            lambda t, x: x,
            lambda t, x: x,
            torch.zeros(3),
            torch.linspace(0, 1, 5),
            torch.zeros(3, 3),
        )


def test_float64_and_registry_factory():
    model = build_snn(in_channels=2, num_classes=1, n_blocks=2).double()

    out = model(torch.zeros(3, 2, dtype=torch.float64), generator=_gen(0))

    assert out.dtype == torch.float64
    assert model.config.in_dim == 2


def test_config_validates_itself():
    with pytest.raises(ValueError, match="n_blocks"):
        SNNConfig(n_blocks=0)
    with pytest.raises(ValueError, match="activation"):
        SNNConfig(activation="sine")


def test_fourier_lift_features():
    model = SNN(SNNConfig(in_dim=2, state_dim=3, fourier_features=4))

    out = model(torch.zeros(5, 2), n_paths=2, generator=_gen(0))

    assert model.lift.linear.in_features == 2 * (1 + 2 * 4)
    assert out.shape == (2, 5, 1)
