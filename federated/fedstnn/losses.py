"""Training losses for the SNN: proper scoring rules over K sampled outputs.

The SNN's output for one input is a distribution, represented by K sample paths. The
loss must reward the *right* spread, or the diffusion network learns nothing useful:

- Plain MSE of one sample is wrong. For a sample ``Ŷ = m + s ε`` and an observation
  ``y = f + σ ξ`` it has expectation ``(m - f)^2 + σ^2 + s^2``, minimised at ``s = 0``:
  the diffusion collapses and the band says nothing about the noise.
- A *proper scoring rule* is minimised in expectation exactly when the predicted
  distribution equals the data's, so the mean learns ``f`` and the spread learns ``σ``.

Two proper scoring rules are provided, and the paper's own cost (all registry entries,
``build_loss(name, **params)``):

``energy_score`` (default): the fair (unbiased-in-K) energy score of Gneiting & Raftery
2007, "Strictly Proper Scoring Rules, Prediction, and Estimation", Eq. 22
(https://doi.org/10.1198/016214506000001437)::

    ES = 1/K Σ_k ||Ŷ_k - y||^β - 1/(2K(K-1)) Σ_{j≠k} ||Ŷ_k - Ŷ_j||^β,   β ∈ (0, 2)

For one output and β = 1 it is the CRPS. The ``K - 1`` (not ``K``) in the second term
makes its expectation equal the score of the model's full distribution, so the optimum
does not shift with K (Ferro 2014, "Fair scores for ensemble forecasts").

``gaussian_nll``: the Gaussian negative log-likelihood of the observation under the sample
mean ``μ`` and unbiased sample variance ``s^2``, with variance ``s^2 (1 + 1/K)`` (the
predictive variance of a new observation around a K-sample mean, so its optimum is
``s = σ``, not ``σ sqrt(1 + 1/K)``). Assumes Gaussian noise; the energy score does not.

``squared_error``: ``1/K Σ_k ||Ŷ_k - y||²``, the FedStNN paper's cost (Eq. 15,
``J = E[Φ(X_T, Γ)]``, with ``Φ`` the squared error: the extracted text lost the symbols
and says only "a loss function ... depending on the context"; Eq. 41's image objective is
a squared difference). With one noise sample per iteration (``K = 1``) it is the paper's
sample-wise training. By the first bullet above its optimum is zero diffusion: trained
long enough, the band it predicts shrinks below the noise.

All losses map ``samples (K, B, out)`` and ``targets (B, out)`` to a scalar (mean over the
batch), differentiable pathwise in the samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from registry import Registry
from registry.constraints import POSITIVE, Interval, allowed, check_fields

__all__ = [
    "LOSSES",
    "EnergyScore",
    "GaussianNLL",
    "Loss",
    "SquaredError",
    "build_loss",
    "list_losses",
]

Loss = Callable[[Tensor, Tensor], Tensor]
LOSSES: Registry[Loss] = Registry("loss")


def _check(samples: Tensor, targets: Tensor, *, min_paths: int = 2) -> None:
    if samples.ndim != 3 or targets.shape != samples.shape[1:]:
        raise ValueError(
            f"samples must be (K, B, out) and targets (B, out); got {tuple(samples.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if samples.shape[0] < min_paths:
        raise ValueError(f"a scoring rule over samples needs K >= 2 paths, got {samples.shape[0]}")


@LOSSES.register("energy_score")
@dataclass(frozen=True, kw_only=True)
class EnergyScore:
    """Fair energy score (CRPS for one output); ``beta`` in (0, 2)."""

    # strictly proper for beta in (0, 2)
    beta: float = field(default=1.0, metadata=allowed(Interval(float, 0, 2, closed="neither")))

    def __post_init__(self) -> None:
        check_fields(self)

    def _norm(self, diff: Tensor) -> Tensor:
        if diff.shape[-1] == 1:
            dist = diff.squeeze(-1).abs()
        else:
            # clamp keeps the gradient finite where two paths coincide (zero diffusion)
            dist = diff.square().sum(-1).clamp_min(1e-30).sqrt()
        return dist if self.beta == 1.0 else dist.pow(self.beta)

    def __call__(self, samples: Tensor, targets: Tensor) -> Tensor:
        _check(samples, targets)
        k = samples.shape[0]
        accuracy = self._norm(samples - targets.unsqueeze(0)).mean(0)  # (B,)
        i, j = torch.triu_indices(k, k, offset=1, device=samples.device)
        # each unordered pair once: Σ_{j≠k} = 2 Σ_{j<k}
        spread = self._norm(samples[i] - samples[j]).sum(0) / (k * (k - 1))  # (B,)
        return (accuracy - spread).mean()


@LOSSES.register("gaussian_nll")
@dataclass(frozen=True, kw_only=True)
class GaussianNLL:
    """Gaussian NLL of the observation under the K-sample mean and variance."""

    # floor on the variance, for a finite loss at zero diffusion
    min_variance: float = field(default=1e-6, metadata=allowed(POSITIVE))

    def __post_init__(self) -> None:
        check_fields(self)

    def __call__(self, samples: Tensor, targets: Tensor) -> Tensor:
        _check(samples, targets)
        k = samples.shape[0]
        mean = samples.mean(0)  # (B, out)
        var = samples.var(0, unbiased=True) * (1 + 1 / k) + self.min_variance
        nll = 0.5 * (torch.log(2 * math.pi * var) + (targets - mean).square() / var)
        return nll.sum(-1).mean()


@LOSSES.register("squared_error")
@dataclass(frozen=True, kw_only=True)
class SquaredError:
    """The paper's cost: each sample's squared error, averaged (K >= 1 paths)."""

    min_paths = 1  # one path suffices (the scoring rules need two)

    def __call__(self, samples: Tensor, targets: Tensor) -> Tensor:
        _check(samples, targets, min_paths=1)
        return (samples - targets.unsqueeze(0)).square().sum(-1).mean()


def build_loss(name: str, **params: float) -> Loss:
    """Build the loss registered as ``name``; unknown names/parameters list what exists."""
    return LOSSES.build(name, **params)


def list_losses() -> list[str]:
    return LOSSES.names()
