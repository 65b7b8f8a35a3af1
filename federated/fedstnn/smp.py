"""Sample-wise stochastic-maximum-principle (SMP) gradient of the SNN.

The FedStNN paper, Sec. 3.2–3.3 (Eqs. 16–17 and 32–36), after Archibald et al. 2024,
"Numerical Analysis for Convergence of a Sample-Wise Backpropagation Method for Training
Stochastic Neural Networks" (https://doi.org/10.1137/23M1548177). The paper trains the SNN
as a stochastic optimal control problem: the gradient of the cost with respect to the
control (the block parameters) is the derivative of the Hamiltonian
``H(x, θ, Y, Z) = <Y, f(x; θ)> + <Z, g(x; θ)>`` along the adjoint BSDE pair ``(Y, Z)``.
Its sample-wise scheme replaces the conditional expectations by "a single realization of
samples", one noise sample ω per iteration. For the Euler–Maruyama SNN with diagonal noise
and step ``h``, that is, for ``n = N-1, ..., 0``:

- Eq. 32 (forward SDE, one noise sample):
  ``X_{n+1} = X_n + h f(X_n; θ_n) + sqrt(h) g(X_n; θ_n) ⊙ ω_n``
- terminal condition: ``Y_N = ∂Φ/∂X_N`` with ``Φ`` the loss of ``readout(X_N)``
- Eq. 34 (martingale part, sample-wise): ``Z_n = Y_{n+1} ⊙ ω_n / sqrt(h)``
  (``E[Y_{n+1} ΔW_n] / h`` evaluated at the one sample, ``ΔW_n = sqrt(h) ω_n``)
- Eq. 33 (adjoint): ``Y_n = Y_{n+1} + h (f_x^T Y_{n+1} + g_x^T Z_n) = Y_{n+1} + ∂_x H_n``
- Eq. 35 (gradient): ``∇_θ J = Σ_n h (f_θ^T Y_{n+1} + g_θ^T Z_n) = Σ_n ∂_θ H_n``

with the discrete Hamiltonian ``H_n = h <Y_{n+1}, f(X_n)> + h <Z_n, g(X_n)>`` (``Y_{n+1}``,
``Z_n`` held fixed). Eq. 36 is the plain gradient step; here the gradient feeds any torch
optimiser. This recursion is exactly the discrete adjoint of the Euler–Maruyama map for
that noise sample, so it equals autograd's pathwise gradient up to rounding (tested in
float64). Each block's derivatives are taken by a local autograd call on that block alone,
so only the state path ``(N+1, K, B, d)`` is kept, not the whole graph.

The K paths of one iteration are K noise samples processed together; the loss (a scoring
rule over the K outputs, :mod:`federated.fedstnn.losses`) couples them only through the
terminal condition ``Y_N``. The lift and the read-out are not part of the SDE; their
gradients come from the initial adjoint ``Y_0`` and the terminal cost respectively.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from models.sde_solver import euler_maruyama
from models.snn import SNN

__all__ = ["pathwise_gradients", "smp_gradients"]

LossFn = Callable[[Tensor, Tensor], Tensor]


def smp_gradients(
    model: SNN, x: Tensor, y: Tensor, loss_fn: LossFn, noise: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss and ``{parameter name: gradient}`` by the sample-wise SMP (Eqs. 32–35).

    Shapes: ``x (B, in)``, ``y (B, out)``, ``noise (N, K, B, d)``. Parameters that do not
    affect the loss get zero gradients.
    """
    ts = model.times()
    dts = ts[1:] - ts[:-1]  # (N,)
    k = noise.shape[1]
    sde_params = [*model.drift.parameters(), *model.diffusion.parameters()]
    sde_grads = [torch.zeros_like(p) for p in sde_params]

    # Eq. 32: the forward SDE for this noise sample, no graph kept
    with torch.no_grad():
        x0 = model.lift(x).unsqueeze(0).expand(k, -1, -1)  # (K, B, d)
        path = euler_maruyama(model.f, model.g, x0, ts, noise)  # (N+1, K, B, d)

    # terminal condition Y_N = ∂Φ/∂X_N; read-out gradients from the terminal cost
    x_final = path[-1].detach().requires_grad_(True)
    with torch.enable_grad():
        loss = loss_fn(model.readout(x_final), y)
        readout_params = list(model.readout.parameters())
        adjoint, *readout_grads = torch.autograd.grad(loss, [x_final, *readout_params])

    for n in reversed(range(ts.shape[0] - 1)):
        h = dts[n]
        x_n = path[n].detach().requires_grad_(True)
        z = adjoint * noise[n] / torch.sqrt(h)  # Eq. 34, sample-wise
        with torch.enable_grad():
            hamiltonian = h * (
                (adjoint * model.f(ts[n], x_n)).sum() + (z * model.g(ts[n], x_n)).sum()
            )
            dx, *dtheta = torch.autograd.grad(hamiltonian, [x_n, *sde_params], allow_unused=True)
        adjoint = adjoint + dx  # Eq. 33
        for acc, grad in zip(sde_grads, dtheta, strict=True):  # Eq. 35
            if grad is not None:
                acc.add_(grad)

    # X_0 = lift(x), shared by the K paths: the lift sees the adjoint summed over paths
    lift_params = list(model.lift.parameters())
    with torch.enable_grad():
        lifted = model.lift(x)  # (B, d)
        lift_grads = torch.autograd.grad(lifted, lift_params, grad_outputs=adjoint.sum(0))

    by_param = {
        id(p): g
        for p, g in zip(
            [*lift_params, *sde_params, *readout_params],
            [*lift_grads, *sde_grads, *readout_grads],
            strict=True,
        )
    }
    grads = {name: by_param[id(p)] for name, p in model.named_parameters()}
    return loss.detach(), grads


def pathwise_gradients(
    model: SNN, x: Tensor, y: Tensor, loss_fn: LossFn, noise: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """The same quantity by autograd through the whole unrolled forward pass (reference)."""
    params = dict(model.named_parameters())
    with torch.enable_grad():
        loss = loss_fn(model(x, noise=noise), y)
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    out = {
        name: torch.zeros_like(p) if g is None else g
        for (name, p), g in zip(params.items(), grads, strict=True)
    }
    return loss.detach(), out
