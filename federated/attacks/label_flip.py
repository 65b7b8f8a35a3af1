"""Label flipping: data poisoning of a malicious client's local labels.

The untargeted data-poisoning attack of the PID-MADE paper's evaluation (all labels
flipped, "poisoning rate 100%"); see also Tolpegin et al. 2020, "Data Poisoning Attacks
Against Federated Learning Systems" (https://arxiv.org/abs/2007.08432).

Parameters (defaults): ``rate=1.0``, the share of the client's labels that are flipped —
exactly ``round(rate * N)`` labels (halves up), chosen uniformly without replacement;
``mapping="reverse"``: ``y -> C - 1 - y`` (with an odd ``C`` the middle class maps to
itself, so fewer labels may change), or ``"random"``: ``y -> `` a different class drawn
uniformly from the other ``C - 1``.

Example (``C = 3``, ``rate = 1``, reverse): ``[0, 1, 2, 2] -> [2, 1, 0, 0]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from federated.attacks.base import DataAttack
from federated.attacks.registry import register_attack
from registry.constraints import Interval, Options, allowed, check_fields

__all__ = ["LabelFlip", "flip_labels"]

_MAPPINGS = ("reverse", "random")


@register_attack("label_flip")
@dataclass(frozen=True, kw_only=True)
class LabelFlip(DataAttack):
    """Flip ``rate`` of a client's labels with ``mapping`` (``reverse`` or ``random``)."""

    rate: float = field(default=1.0, metadata=allowed(Interval(float, 0, 1)))
    mapping: str = field(default="reverse", metadata=allowed(Options(_MAPPINGS)))

    def __post_init__(self) -> None:
        check_fields(self, "label_flip")

    def poison_labels(
        self, labels: Tensor | np.ndarray, *, num_classes: int, seed: int
    ) -> Tensor | np.ndarray:
        return flip_labels(
            labels, num_classes=num_classes, rate=self.rate, mapping=self.mapping, seed=seed
        )


def flip_labels(
    labels: Tensor | np.ndarray,
    *,
    num_classes: int,
    rate: float = 1.0,
    mapping: str = "reverse",
    seed: int,
) -> Tensor | np.ndarray:
    """A flipped copy of ``labels`` (any shape, e.g. MedMNIST's ``(N, 1)``), same type and
    dtype; the input is not modified. Pure: same seed, same result."""
    if num_classes < 2:
        raise ValueError(f"label flipping needs num_classes >= 2, got {num_classes}")
    if mapping not in _MAPPINGS:
        raise ValueError(f"mapping must be one of {', '.join(_MAPPINGS)}, got {mapping!r}")
    is_tensor = isinstance(labels, Tensor)
    flat = (labels.detach().cpu().numpy() if is_tensor else np.asarray(labels)).reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got [{flat.min()}, {flat.max()}]")
    rng = np.random.default_rng(seed)
    count = math.floor(rate * flat.size + 0.5 + 1e-9)
    idx = rng.choice(flat.size, size=count, replace=False)
    out = flat.copy()
    if mapping == "reverse":
        out[idx] = num_classes - 1 - flat[idx]
    else:
        shift = rng.integers(1, num_classes, size=count)
        out[idx] = (flat[idx] + shift) % num_classes
    out = out.reshape(np.shape(labels))
    if is_tensor:
        return torch.from_numpy(out).to(device=labels.device, dtype=labels.dtype)
    return out.astype(np.asarray(labels).dtype, copy=False)
