"""Non-IID detection from the spread of client losses (EMA, Algorithms 3–4).

Wu et al., "Enabling quartile-based estimated-mean gradient aggregation as baseline for
federated image classifications" (Section 2.3): evaluate the current global model on each
client's local data (Algorithm 3, MSE between the model output and the target), then call
the federation non-IID when the coefficient of variation of those losses exceeds a
threshold d (Algorithm 4; the paper uses d = 0.25):

    μ = (1/n) Σ L_i,   σ = sqrt((1/n) Σ (L_i - μ)²)   (population σ),   CV = σ / μ.

The paper also lets the server leave out clients whose loss stands out; here a client is
excluded when its loss z-score ``(L_i - μ)/σ`` (same population σ) exceeds ``z``. Only
high losses are excluded: a client the model fits unusually well is not suspicious here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "NonIIDResult",
    "client_losses",
    "coefficient_of_variation",
    "loss_zscores",
    "noniid_exclusions",
    "noniid_verdict",
]

LossName = Literal["mse", "cross_entropy"]


def _client_loss(
    model: nn.Module, x: Tensor, y: Tensor, loss: LossName, batch_size: int, device: torch.device
) -> float:
    total, count = 0.0, 0
    for start in range(0, x.shape[0], batch_size):
        xb = x[start : start + batch_size].to(device)  # (B, C, H, W)
        yb = y[start : start + batch_size].to(device)  # (B,)
        logits = model(xb)  # (B, K)
        if loss == "mse":
            # Algorithm 3's MSELoss on the softmax output against the one-hot target.
            target = F.one_hot(yb, num_classes=logits.shape[1]).to(logits.dtype)
            err = F.mse_loss(logits.softmax(dim=1), target, reduction="sum")
            count += target.numel()
        else:
            err = F.cross_entropy(logits, yb, reduction="sum")
            count += yb.numel()
        total += float(err.double())
    return total / count


def client_losses(
    model: nn.Module,
    client_datasets: Sequence[tuple[Tensor, Tensor]],
    *,
    loss: LossName = "mse",
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> np.ndarray:
    """Loss of one model on each client's local data (Algorithm 3), shape ``(n_clients,)``.

    ``client_datasets``: ``(x, y)`` pairs, ``x`` float ``(N, C, H, W)``, ``y`` int64 ``(N,)``
    (``(N, 1)`` is flattened). ``loss='mse'``: mean over samples *and* classes of
    ``(softmax(logits) - one_hot(y))²``, i.e. ``torch.nn.MSELoss()`` as in the paper;
    ``'cross_entropy'``: mean cross-entropy per sample. Batching does not change the value.
    The model must already be on ``device``; it is evaluated in eval mode under no_grad and
    its training flag is restored afterwards.
    """
    if loss not in ("mse", "cross_entropy"):
        raise ValueError(f"loss must be 'mse' or 'cross_entropy'; got {loss!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    device = torch.device(device)
    param = next(model.parameters(), None)
    if param is not None and (
        param.device.type != device.type
        or (device.index is not None and param.device.index != device.index)
    ):
        raise ValueError(f"model is on {param.device} but device={device}; move the model first")
    was_training = model.training
    model.eval()
    out = np.empty(len(client_datasets))
    try:
        with torch.no_grad():
            for i, (x, y) in enumerate(client_datasets):
                if y.ndim == 2 and y.shape[1] == 1:
                    y = y.reshape(-1)
                if y.ndim != 1 or x.shape[0] != y.shape[0]:
                    raise ValueError(
                        f"client {i}: expected x (N, ...) and y (N,); got {tuple(x.shape)} "
                        f"and {tuple(y.shape)}"
                    )
                if x.shape[0] == 0:
                    raise ValueError(f"client {i} has no samples; its loss is undefined")
                out[i] = _client_loss(model, x, y.long(), loss, batch_size, device)
    finally:
        model.train(was_training)
    return out


def _losses(losses: Sequence[float] | np.ndarray | Tensor) -> np.ndarray:
    if isinstance(losses, Tensor):
        losses = losses.detach().cpu().double().numpy()
    arr = np.asarray(losses, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ValueError("losses is empty; need one loss per client")
    if not np.isfinite(arr).all():
        raise ValueError(f"losses must be finite; got {arr.tolist()}")
    if (arr < 0).any():
        raise ValueError(f"losses must be >= 0 for a coefficient of variation; got {arr.tolist()}")
    return arr


def coefficient_of_variation(losses: Sequence[float] | np.ndarray | Tensor) -> float:
    """``σ/μ`` with population σ (Algorithm 4). 0 when all losses are equal (even all 0)."""
    arr = _losses(losses)
    sigma = float(arr.std())
    if sigma == 0.0:
        return 0.0
    return sigma / float(arr.mean())


def loss_zscores(losses: Sequence[float] | np.ndarray | Tensor) -> np.ndarray:
    """``(L_i - μ)/σ`` with population σ; all zeros when σ = 0."""
    arr = _losses(losses)
    sigma = arr.std()
    if sigma == 0.0:
        return np.zeros_like(arr)
    return (arr - arr.mean()) / sigma


@dataclass(frozen=True)
class NonIIDResult:
    """Algorithm 4's verdict with the numbers behind it."""

    cv: float
    threshold: float
    verdict: Literal["non_iid", "iid"]
    losses: np.ndarray  # (n_clients,)
    zscores: np.ndarray  # (n_clients,)
    mean: float
    std: float  # population
    client_ids: tuple[int, ...] = ()  # whose losses, in order, where the caller knows

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: scalars and per-client lists."""
        return {
            "cv": self.cv,
            "threshold": self.threshold,
            "verdict": self.verdict,
            "mean": self.mean,
            "std": self.std,
            "losses": self.losses.tolist(),
            "zscores": self.zscores.tolist(),
        }

    def trained_report(self, loss: str) -> dict[str, Any]:
        """The trained model's check as reports/noniid.json keeps it: the CV, the verdict,
        the loss and each client's loss by id (``client_ids``)."""
        losses = dict(zip(map(str, self.client_ids), self.losses.tolist(), strict=True))
        return {"cv": self.cv, "verdict": self.verdict, "loss": loss, "client_losses": losses}


def noniid_verdict(
    losses: Sequence[float] | np.ndarray | Tensor, threshold: float = 0.25
) -> NonIIDResult:
    """``'non_iid'`` when CV > threshold (strictly, as Algorithm 4), else ``'iid'``."""
    if not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"threshold must be a finite number >= 0; got {threshold}")
    arr = _losses(losses)
    cv = coefficient_of_variation(arr)
    return NonIIDResult(
        cv=cv,
        threshold=threshold,
        verdict="non_iid" if cv > threshold else "iid",
        losses=arr,
        zscores=loss_zscores(arr),
        mean=float(arr.mean()),
        std=float(arr.std()),
    )


def noniid_exclusions(losses: Sequence[float] | np.ndarray | Tensor, z: float) -> np.ndarray:
    """Keep-mask ``(n_clients,)``: False for clients whose loss z-score exceeds ``z``.

    z-scores use the population σ; when σ = 0 every client is kept.
    """
    if math.isnan(z):
        raise ValueError("z must be a number; got nan")
    return loss_zscores(losses) <= z
