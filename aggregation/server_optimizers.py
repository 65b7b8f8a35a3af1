"""Server optimizers: what the server does with a rule's aggregate. The aggregate
``delta`` (``(n_params,)``, whatever rule, filters and pre-aggregators made it) is the
round's pseudo-gradient, pointing from the global weights towards the clients' models, so
"FedAdam on the median" is the median's aggregate through :class:`ServerAdam`.

``step(weights, delta)`` returns the next global weights; the optimizer's memory is in
the open as torch optimizers keep it (``state_dict()`` / ``load_state_dict()``: the step
count and the moment tensors), so a checkpoint holds it and a resume is exact.

- ``sgd``: ``x + lr·Δ`` (``lr = 1``: FedAvg, McMahan et al. 2017).
- ``momentum``: FedAvgM (Hsu, Qi and Brown 2019, arXiv:1909.06335), server momentum
  ``u_t = β·u_{t-1} + Δ_t`` (``u_{-1} = 0``), ``x + lr·u_t``.
- ``adagrad``, ``yogi``, ``adam``: FedAdagrad, FedYogi, FedAdam as Reddi et al. 2021,
  Adaptive Federated Optimization (ICLR, arXiv:2003.00295), Algorithm 2 writes them:
  ``m_t = β₁·m_{t-1} + (1-β₁)·Δ_t`` (``m_{-1} = 0``) and
  ``x + η·m_t / (√v_t + τ)``, with ``v_{-1} = τ²`` (the algorithm's ``v_{-1} ≥ τ²`` at
  its least) and

  - adagrad: ``v_t = v_{t-1} + Δ_t²``
  - yogi: ``v_t = v_{t-1} - (1-β₂)·Δ_t²·sign(v_{t-1} - Δ_t²)``
  - adam: ``v_t = β₂·v_{t-1} + (1-β₂)·Δ_t²``

  β₁ = 0.9, β₂ = 0.99 and τ = 1e-3 as the paper's experiments set them; the paper tunes
  η per task and fixes none, so ``lr`` defaults to Flower's.
- ``flower_adagrad``, ``flower_yogi``, ``flower_adam``: Flower's FedAdagrad, FedYogi and
  FedAdam (``flwr.serverapp.strategy``, flwr 1.32), which depart from Algorithm 2:
  ``v_{-1} = 0``; FedAdagrad has no first moment (β₁ = 0); FedAdam scales η by
  ``√(1-β₂^(t+1)) / (1-β₁^(t+1))`` (``t`` the 1-based step: Flower's round). Their
  defaults are Flower's.

>>> opt = build_server_optimizer("adam", lr=0.01)
>>> weights = opt.step(weights, delta)  # (n_params,), (n_params,) -> (n_params,)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aggregation.base import ServerOptimizer
from aggregation.registry import register_server_optimizer
from registry.constraints import POSITIVE, Interval, allowed

__all__ = [
    "FlowerAdagrad",
    "FlowerAdam",
    "FlowerYogi",
    "ServerAdagrad",
    "ServerAdam",
    "ServerMomentum",
    "ServerSGD",
    "ServerYogi",
]

DECAY = Interval(float, 0, 1, closed="left")  # β in [0, 1)


@register_server_optimizer("sgd")
@dataclass(kw_only=True)
class ServerSGD(ServerOptimizer):
    """``x + lr·Δ``; ``lr = 1`` is FedAvg."""

    lr: float = field(default=1.0, metadata=allowed(POSITIVE))

    def _update(
        self, weights: Tensor, delta: Tensor, state: dict[str, Any]
    ) -> tuple[Tensor, dict[str, Any]]:
        return weights + self.lr * delta, {"step": state["step"] + 1}


@register_server_optimizer("momentum")
@dataclass(kw_only=True)
class ServerMomentum(ServerOptimizer):
    """FedAvgM (Hsu et al. 2019): ``u_t = momentum·u_{t-1} + Δ_t``, ``x + lr·u_t``."""

    lr: float = field(default=1.0, metadata=allowed(POSITIVE))
    momentum: float = field(default=0.9, metadata=allowed(DECAY))

    def _update(
        self, weights: Tensor, delta: Tensor, state: dict[str, Any]
    ) -> tuple[Tensor, dict[str, Any]]:
        velocity = state.get("velocity")
        velocity = delta.clone() if velocity is None else self.momentum * velocity + delta
        return weights + self.lr * velocity, {"step": state["step"] + 1, "velocity": velocity}


@dataclass(kw_only=True)
class _Adaptive(ServerOptimizer):
    """Algorithm 2's shared steps: the first moment, the second (by the subclass), the
    step ``x + η_t·m_t / (√v_t + τ)``."""

    lr: float = field(default=0.1, metadata=allowed(POSITIVE))
    beta1: float = field(default=0.9, metadata=allowed(DECAY))
    beta2: float = field(default=0.99, metadata=allowed(DECAY))
    tau: float = field(default=1e-3, metadata=allowed(POSITIVE))

    initial_v_is_tau_squared = True  # Algorithm 2's v_{-1} = τ²; Flower's start at 0

    def _update(
        self, weights: Tensor, delta: Tensor, state: dict[str, Any]
    ) -> tuple[Tensor, dict[str, Any]]:
        first, second = state.get("m"), state.get("v")
        if first is None or second is None:
            first = torch.zeros_like(delta)
            second = torch.full_like(delta, self.tau**2 if self.initial_v_is_tau_squared else 0.0)
        step = state["step"] + 1
        first = self.beta1 * first + (1 - self.beta1) * delta
        second = self._second_moment(second, delta)
        new_weights = weights + self._eta(step) * first / (second.sqrt() + self.tau)
        return new_weights, {"step": step, "m": first, "v": second}

    def _second_moment(self, second: Tensor, delta: Tensor) -> Tensor:
        raise NotImplementedError

    def _eta(self, step: int) -> float:
        return self.lr


@register_server_optimizer("adagrad")
@dataclass(kw_only=True)
class ServerAdagrad(_Adaptive):
    """FedAdagrad (Reddi et al. 2021, Algorithm 2): ``v_t = v_{t-1} + Δ_t²``."""

    def _second_moment(self, second: Tensor, delta: Tensor) -> Tensor:
        return second + delta**2


@register_server_optimizer("yogi")
@dataclass(kw_only=True)
class ServerYogi(_Adaptive):
    """FedYogi (Reddi et al. 2021, Algorithm 2):
    ``v_t = v_{t-1} - (1-β₂)·Δ_t²·sign(v_{t-1} - Δ_t²)``."""

    lr: float = field(default=0.01, metadata=allowed(POSITIVE))

    def _second_moment(self, second: Tensor, delta: Tensor) -> Tensor:
        squared = delta**2
        return second - (1 - self.beta2) * squared * torch.sign(second - squared)


@register_server_optimizer("adam")
@dataclass(kw_only=True)
class ServerAdam(_Adaptive):
    """FedAdam (Reddi et al. 2021, Algorithm 2): ``v_t = β₂·v_{t-1} + (1-β₂)·Δ_t²``,
    no bias correction."""

    def _second_moment(self, second: Tensor, delta: Tensor) -> Tensor:
        return self.beta2 * second + (1 - self.beta2) * delta**2


@register_server_optimizer("flower_adagrad")
@dataclass(kw_only=True)
class FlowerAdagrad(ServerAdagrad):
    """Flower's FedAdagrad: β₁ = 0 (no first moment) and ``v_{-1} = 0``."""

    beta1: float = field(default=0.0, init=False)
    beta2: float = field(default=0.0, init=False)  # unused by Adagrad's second moment
    initial_v_is_tau_squared = False


@register_server_optimizer("flower_yogi")
@dataclass(kw_only=True)
class FlowerYogi(ServerYogi):
    """Flower's FedYogi: ``v_{-1} = 0``."""

    initial_v_is_tau_squared = False


@register_server_optimizer("flower_adam")
@dataclass(kw_only=True)
class FlowerAdam(ServerAdam):
    """Flower's FedAdam: ``v_{-1} = 0`` and η scaled by ``√(1-β₂^(t+1)) / (1-β₁^(t+1))``."""

    initial_v_is_tau_squared = False

    def _eta(self, step: int) -> float:
        return self.lr * math.sqrt(1 - self.beta2 ** (step + 1)) / (1 - self.beta1 ** (step + 1))
