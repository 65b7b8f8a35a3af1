"""Stochastic neural network (SNN): a residual network read as a discretised SDE.

Tang, Bausback, Bao & Archibald 2025, "Federated Learning on Stochastic Neural Networks"
(https://arxiv.org/abs/2506.08169), Sec. 3, after Archibald et al. 2020,
"Uncertainty Quantification in Deep Learning through Stochastic Maximum Principle"
(https://arxiv.org/abs/2011.14145). The paper's formulas did not survive text extraction;
this is the standard construction its words describe.

Definition (the paper's Eq. 12, "a discrete stochastic differential equation, where the
function [f] defines the drift term and [g] defines the diffusion term")::

    X_0     = lift(x)                                              # (B, d)
    X_{n+1} = X_n + h f(X_n; θ_n) + sqrt(h) g(X_n; φ_n) ⊙ ω_n,    n = 0..N-1, ω_n ~ N(0, I)
    y       = readout(X_N)

with ``h = T / N``. ``f`` is the *drift network* and ``g`` the *diffusion network*, "two
internal networks within a single model" (Sec. 1); they are separate modules
(``model.drift``, ``model.diffusion``) so the federation can aggregate them separately
(the paper's Eq. 39). State-dict keys therefore start with ``lift.``, ``drift.``,
``diffusion.`` or ``readout.``.

Choices where the paper is silent:

- Time dependence: per-block parameters. "θ_n is the set of network parameters in the
  n-th layer", so block ``n`` has its own one-hidden-layer MLP for ``f`` and for ``g``
  (a ResNet, not a weight-shared neural ODE); ``f(t, x)`` picks block ``round(t / h)``.
- Diffusion: diagonal noise in the state, ``g(X_n; φ_n) = softplus(MLP_n(X_n))`` (state-
  dependent, so heteroscedastic noise is representable; positive so ``g`` reads as a
  noise level). The last layer starts near zero with a bias giving ``g = diffusion_init``.
- Lift and read-out are linear maps (the paper: "the initial state ... represents the
  input and [X_N] as the output"); the read-out is where the state's spread becomes the
  output's spread. Optionally the lift also sees fixed Fourier features of the input
  (``fourier_features``, off by default), for coordinate inputs like pixel positions.

Prediction draws K sample paths per input: their mean estimates the function, their
standard deviation the observation noise (Sec. 5: "a drift network to capture the exact
function value and a diffusion network to measure the noise"). Randomness only through an
explicit ``torch.Generator`` (or replayed ``noise``); the model does no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from models.sde_solver import euler_maruyama, standard_noise
from registry.constraints import POSITIVE, Interval, Options, allowed, check_fields

__all__ = [
    "ACTIVATIONS",
    "SNN",
    "DiffusionNet",
    "DriftNet",
    "Lift",
    "Prediction",
    "SNNConfig",
    "build_snn",
]


# hidden activations; tanh is the paper's family (smooth, bounded) but costs ~10x ReLU on
# CPU, which matters because every block runs on K x B rows
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "softsign": nn.Softsign,
}


_COUNT = allowed(Interval(int, 1))


@dataclass(frozen=True, kw_only=True)
class SNNConfig:
    """Architecture of an :class:`SNN`; the defaults suit 1-D regression."""

    # input features (1 for 1-D regression, 2 for a plane or an image)
    in_dim: int = field(default=1, metadata=_COUNT)
    out_dim: int = field(default=1, metadata=_COUNT)  # outputs
    # width d of the SDE state X_n ("neurons in the n-th layer")
    state_dim: int = field(default=16, metadata=_COUNT)
    # hidden width of each block's drift / diffusion MLP
    hidden_dim: int = field(default=32, metadata=_COUNT)
    n_blocks: int = field(default=10, metadata=_COUNT)  # N residual blocks = Euler–Maruyama steps
    horizon: float = field(default=1.0, metadata=allowed(POSITIVE))  # T; the step is h = T / N
    # K sample paths per input, in training and prediction
    n_paths: int = field(default=32, metadata=_COUNT)
    # initial g everywhere (the starting noise level)
    diffusion_init: float = field(default=0.3, metadata=allowed(POSITIVE))
    # hidden activation of f and g
    activation: str = field(default="tanh", metadata=allowed(Options(tuple(ACTIVATIONS))))
    # F > 0: lift sin/cos(2^j π u), j < F, of each input too
    fourier_features: int = field(default=0, metadata=allowed(Interval(int, 0)))

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def step(self) -> float:
        return self.horizon / self.n_blocks


def _mlp(state_dim: int, hidden_dim: int, activation: str) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(state_dim, hidden_dim),
        ACTIVATIONS[activation](),
        nn.Linear(hidden_dim, state_dim),
    )


class Lift(nn.Module):
    """Input -> initial state ``X_0``: a linear map of the input, optionally with its
    Fourier features ``sin(2^j π u), cos(2^j π u)``, ``j < F`` (Tancik et al. 2020,
    https://arxiv.org/abs/2006.10739): coordinate inputs such as pixel positions need
    them to resolve sharp edges in few steps. The frequencies are fixed, not parameters."""

    def __init__(self, in_dim: int, state_dim: int, fourier_features: int) -> None:
        super().__init__()
        self.fourier_features = fourier_features
        self.linear = nn.Linear(in_dim * (1 + 2 * fourier_features), state_dim)

    def forward(self, x: Tensor) -> Tensor:
        if self.fourier_features:
            scales = math.pi * 2.0 ** torch.arange(
                self.fourier_features, dtype=x.dtype, device=x.device
            )
            angles = (x.unsqueeze(-1) * scales).flatten(-2)  # (B, in * F)
            x = torch.cat([x, torch.sin(angles), torch.cos(angles)], dim=-1)  # (B, in (1 + 2F))
        return self.linear(x)


class _Blockwise(nn.Module):
    """N per-block MLPs; ``forward(t, x)`` evaluates block ``round(t / h)`` (torchsde's
    ``f(t, y)`` signature)."""

    def __init__(
        self, *, state_dim: int, hidden_dim: int, n_blocks: int, step: float, activation: str
    ) -> None:
        super().__init__()
        self.step = step
        self.blocks = nn.ModuleList(
            _mlp(state_dim, hidden_dim, activation) for _ in range(n_blocks)
        )

    def index(self, t: Tensor | float) -> int:
        n = round(float(t) / self.step)
        return min(max(n, 0), len(self.blocks) - 1)

    def raw(self, t: Tensor | float, x: Tensor) -> Tensor:
        return self.blocks[self.index(t)](x)


class DriftNet(_Blockwise):
    """The drift network ``f(X_n; θ_n)``."""

    def forward(self, t: Tensor | float, x: Tensor) -> Tensor:
        return self.raw(t, x)


class DiffusionNet(_Blockwise):
    """The diffusion network ``g(X_n; φ_n) = softplus(MLP_n(X_n))`` (diagonal noise)."""

    def __init__(self, *, init: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.init = init
        self.reset_output_()

    @torch.no_grad()
    def reset_output_(self) -> None:
        """Start at ``g = init`` everywhere: a tiny last layer and bias softplus^{-1}(init)."""
        bias = math.log(math.expm1(self.init))
        for block in self.blocks:
            block[-1].weight.mul_(0.01)
            block[-1].bias.fill_(bias)

    def forward(self, t: Tensor | float, x: Tensor) -> Tensor:
        return F.softplus(self.raw(t, x))


@dataclass(frozen=True)
class Prediction:
    """K sampled outputs ``(K, B, out)`` and their mean and standard deviation ``(B, out)``."""

    samples: Tensor
    mean: Tensor
    std: Tensor


class SNN(nn.Module):
    """Stochastic neural network; ``model(x)`` returns K sampled outputs ``(K, B, out)``.

    Also usable as a torchsde SDE object on the state (``f``, ``g``, ``noise_type``,
    ``sde_type``).
    """

    noise_type = "diagonal"
    sde_type = "ito"

    def __init__(
        self, config: SNNConfig | None = None, *, generator: torch.Generator | None = None
    ) -> None:
        """Initialise from ``generator`` (PyTorch's default ``nn.Linear`` scheme) when given,
        so a seed fixes the common initial model; else from torch's global RNG."""
        super().__init__()
        self.config = config = config or SNNConfig()
        blocks = {
            "state_dim": config.state_dim,
            "hidden_dim": config.hidden_dim,
            "n_blocks": config.n_blocks,
            "step": config.step,
            "activation": config.activation,
        }
        self.lift = Lift(config.in_dim, config.state_dim, config.fourier_features)
        self.drift = DriftNet(**blocks)
        self.diffusion = DiffusionNet(init=config.diffusion_init, **blocks)
        self.readout = nn.Linear(config.state_dim, config.out_dim)
        if generator is not None:
            self.reset_parameters_(generator)

    @torch.no_grad()
    def reset_parameters_(self, generator: torch.Generator) -> None:
        """Redraw every weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from
        ``generator`` (as ``nn.Linear`` does), then reset the diffusion's output layer."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                bound = 1 / math.sqrt(module.in_features)
                module.weight.uniform_(-bound, bound, generator=generator)
                module.bias.uniform_(-bound, bound, generator=generator)
        self.diffusion.reset_output_()

    # torchsde-style coefficients of the state SDE
    def f(self, t: Tensor | float, x: Tensor) -> Tensor:
        return self.drift(t, x)

    def g(self, t: Tensor | float, x: Tensor) -> Tensor:
        return self.diffusion(t, x)

    def times(
        self, *, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> Tensor:
        """The grid ``t_n = n h``, ``(N+1,)``, on the model's dtype and device by default."""
        ref = self.readout.weight
        return torch.linspace(
            0.0,
            self.config.horizon,
            self.config.n_blocks + 1,
            dtype=dtype or ref.dtype,
            device=device or ref.device,
        )

    def sample_noise(
        self, batch: int, n_paths: int | None = None, *, generator: torch.Generator | None
    ) -> Tensor:
        """Standard Gaussian draws ``(N, K, B, d)`` for :meth:`forward`."""
        ref = self.readout.weight
        k = n_paths or self.config.n_paths
        shape = (k, batch, self.config.state_dim)
        return standard_noise(
            self.config.n_blocks, shape, generator=generator, dtype=ref.dtype, device=ref.device
        )

    def paths(self, x: Tensor, noise: Tensor) -> Tensor:
        """State paths ``(N+1, K, B, d)`` for inputs ``x (B, in)`` and ``noise (N, K, B, d)``."""
        x0 = self.lift(x).unsqueeze(0).expand(noise.shape[1], -1, -1)  # (K, B, d)
        return euler_maruyama(self.f, self.g, x0, self.times(), noise)

    def forward(
        self,
        x: Tensor,
        *,
        n_paths: int | None = None,
        generator: torch.Generator | None = None,
        noise: Tensor | None = None,
    ) -> Tensor:
        """Sampled outputs ``(K, B, out)``; pass ``noise`` to replay a sample, else it is
        drawn from ``generator`` (K = ``n_paths`` or the config's)."""
        if noise is None:
            noise = self.sample_noise(x.shape[0], n_paths, generator=generator)
        return self.readout(self.paths(x, noise)[-1])

    @torch.no_grad()
    def predict(
        self, x: Tensor, *, n_paths: int | None = None, generator: torch.Generator | None = None
    ) -> Prediction:
        """Mean (function estimate) and standard deviation (noise estimate) over K paths."""
        samples = self(x, n_paths=n_paths, generator=generator)  # (K, B, out)
        std = samples.std(dim=0) if samples.shape[0] > 1 else torch.zeros_like(samples[0])
        return Prediction(samples=samples, mean=samples.mean(dim=0), std=std)


def build_snn(*, in_channels: int = 1, num_classes: int = 1, **architecture: Any) -> SNN:
    """Model-registry factory: ``in_channels`` are the input features, ``num_classes`` the
    outputs (1 for regression); ``architecture`` takes the other :class:`SNNConfig` fields
    (``state_dim``, ``n_blocks``, ...), with its defaults, and rejects unknown ones."""
    return SNN(SNNConfig(in_dim=in_channels, out_dim=num_classes, **architecture))
