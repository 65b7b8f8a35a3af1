"""Euler–Maruyama for Itô SDEs with diagonal noise, kept apart from the networks.

Follows torchsde's convention (``sde.f(t, y)`` drift, ``sde.g(t, y)`` diffusion, diagonal
noise: ``g`` returns the same shape as ``y`` and multiplies the Brownian increment
elementwise). The solver owns no randomness: the standard Gaussian draws ``noise`` come in
from the caller, so one noise sample can be replayed exactly (the stochastic maximum
principle gradient in :mod:`federated.fedstnn.smp` needs the forward path of a given
sample).

For ``ts = (t_0, ..., t_N)`` and ``noise = (ω_0, ..., ω_{N-1})``::

    X_{n+1} = X_n + h_n f(t_n, X_n) + sqrt(h_n) g(t_n, X_n) ⊙ ω_n,   h_n = t_{n+1} - t_n

which is the FedStNN paper's Eq. (12)/(23) ("Euler-Maruyama scheme") for the SNN.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["Coefficient", "euler_maruyama", "standard_noise"]

Coefficient = Callable[[Tensor, Tensor], Tensor]


def standard_noise(
    n_steps: int,
    shape: tuple[int, ...],
    *,
    generator: torch.Generator | None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """Standard Gaussian draws ``(n_steps, *shape)`` for :func:`euler_maruyama`.

    ``generator`` must live on ``device`` (a CPU generator for CPU tensors).
    """
    return torch.randn((n_steps, *shape), generator=generator, dtype=dtype, device=device)


def euler_maruyama(f: Coefficient, g: Coefficient, x0: Tensor, ts: Tensor, noise: Tensor) -> Tensor:
    """Integrate ``dX = f(t, X) dt + g(t, X) dW`` (diagonal noise) on the grid ``ts``.

    Shapes: ``x0 (*S)``, ``ts (N+1,)``, ``noise (N, *S)`` standard Gaussian; returns the
    whole path ``(N+1, *S)`` with ``path[0] = x0``. Differentiable through ``f``, ``g`` and
    ``x0`` (autograd gives the pathwise gradient for this noise sample).
    """
    n_steps = ts.shape[0] - 1
    if noise.shape != (n_steps, *x0.shape):
        raise ValueError(
            f"noise must have shape {(n_steps, *x0.shape)} for {n_steps} steps and x0 of "
            f"shape {tuple(x0.shape)}, got {tuple(noise.shape)}"
        )
    dts = ts[1:] - ts[:-1]  # (N,)
    states = [x0]
    x = x0
    for n in range(n_steps):
        t, dt = ts[n], dts[n]
        x = x + dt * f(t, x) + torch.sqrt(dt) * g(t, x) * noise[n]
        states.append(x)
    return torch.stack(states)
