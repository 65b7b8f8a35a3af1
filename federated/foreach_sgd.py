"""The local SGD step on lists of tensors, with torch's foreach kernels.

This is the one module that uses private torch names (``torch._foreach_*``), and why:
``torch.optim.SGD`` and its functional form ``torch.optim.sgd.sgd`` import
``torch._dynamo`` on their first call, a cost every training process pays once (it
about halved the engine's lead over Flower on the race in docs/results.md), while the
step itself is the same arithmetic. The foreach kernels are what ``torch.optim.SGD``
runs by default on these tensors; the batched backend needs the step on stacks
``(G, ...)`` of many clients' parameters, which they take as they are.

``tests/federated/test_foreach_sgd.py`` fails loudly should a torch upgrade remove or
change them: the step must equal ``torch.optim.SGD`` bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["FOREACH_KERNELS", "sgd_step_"]

FOREACH_KERNELS = ("_foreach_sub", "_foreach_mul_", "_foreach_add_")


def sgd_step_(
    weights: list[Tensor],
    grads: list[Tensor],
    anchors: list[Tensor],
    momenta: list[Tensor],
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    prox_mu: float,
) -> None:
    """One ``torch.optim.SGD`` step (no dampening, no Nesterov), in place on ``weights``
    and the momentum buffers ``momenta`` (zeros before the first step; empty when
    ``momentum`` is 0). ``anchors`` are the global weights for FedProx: the gradient of
    μ/2‖w − w_g‖², μ(w − w_g), is added to ``grads`` (which are modified)."""
    if prox_mu > 0:
        differences = torch._foreach_sub(weights, anchors)
        torch._foreach_mul_(differences, prox_mu)
        torch._foreach_add_(grads, differences)
    if weight_decay:
        torch._foreach_add_(grads, weights, alpha=weight_decay)
    step = grads
    if momentum:
        torch._foreach_mul_(momenta, momentum)
        torch._foreach_add_(momenta, grads)
        step = momenta
    torch._foreach_add_(weights, step, alpha=-lr)
