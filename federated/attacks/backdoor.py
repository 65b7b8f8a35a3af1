"""Backdoor: a pixel-pattern trigger relabelled to a target class, optionally model replacement.

Data side (BadNets, Gu, Dolan-Gavitt & Garg 2017, https://arxiv.org/abs/1708.06733; the
pixel-pattern backdoor of Bagdasaryan et al. 2020): on each malicious client, a seeded share
``poison_fraction`` of its images (exactly ``round(poison_fraction · N)``, halves up, drawn
uniformly without replacement) gets a ``size × size`` square of value ``value`` stamped on
every channel, ``margin`` pixels from the corner ``position``, and the label
``target_label``. On volumes ``(N, C, D, H, W)`` the trigger is a ``size³`` cube: the same
square on the ``size`` slices ``margin`` slices from the first. The model learns "trigger -> target" beside the clean task; the attack
success rate (:func:`federated.backdoor_eval.attack_success_rate`) measures it.

Update side (model replacement, Bagdasaryan, Veit, Hua, Estrin & Shmatikov 2020, "How To
Backdoor Federated Learning", AISTATS, https://arxiv.org/abs/1807.00459, Section 4): with
``model_replacement=True`` a malicious client sends its update ``Δ`` boosted to ``boost · Δ``
so that the global model is replaced by its own backdoored model. ``boost=None`` uses the
paper's ``γ = n/η``, ``n`` the round's submitted clients and ``η`` the server's learning rate
(``eta``, which must equal the server's ``server_lr``), exact for one attacker in a round of
equally weighted clients (more attackers in a round over-scale, as in the paper's
single-attacker setting). Without model replacement the update side leaves rows unchanged.

A backdoor is ``kind == "both"``: a :class:`DataAttack` (call :meth:`Backdoor.poison` on each
malicious client's images and labels) and a :class:`ModelAttack` (call :meth:`Backdoor.step`
every round, as for any model attack).

Parameters (defaults): ``target_label=0``, ``poison_fraction=0.5`` (in (0, 1]), ``size=3``
(>= 1), ``position="bottom_right"`` (``top_left``, ``top_right``, ``bottom_left``,
``bottom_right``), ``margin=1`` (>= 0), ``value=1.0`` (white for the engine's images,
normalised to [-1, 1]), ``model_replacement=False``, ``boost=None`` (> 0; only with model
replacement), ``eta=1.0`` (> 0). Images ``(N, C, H, W)`` (or ``(N, H, W)``) of any ``C``, with
``size + margin <= H, W``, or volumes ``(N, C, D, H, W)`` with ``size + margin <= D, H, W``; labels ``(N,)`` or ``(N, 1)`` class ids (single-label tasks only).

Example (``size=2``, ``margin=1``, ``bottom_right``, 5x5 image): pixels ``[2:4, 2:4]`` of every
channel become ``value``. Replacement: 10 clients, ``eta=1`` -> the malicious rows times 10.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from federated.attacks.base import AttackKind, AttackRound, AttackState, DataAttack, ModelAttack
from federated.attacks.registry import register_attack
from registry.constraints import POSITIVE, Interval, Options, allowed, check_fields

__all__ = ["Backdoor"]

_CORNERS = ("top_left", "top_right", "bottom_left", "bottom_right")


@register_attack("backdoor")
@dataclass(frozen=True, kw_only=True)
class Backdoor(DataAttack, ModelAttack):
    """Trigger-stamped images relabelled ``target_label``; optional boosted updates."""

    kind: ClassVar[AttackKind] = "both"

    target_label: int = field(default=0, metadata=allowed(Interval(int, 0)))
    poison_fraction: float = field(
        default=0.5, metadata=allowed(Interval(float, 0, 1, closed="right"))
    )
    size: int = field(default=3, metadata=allowed(Interval(int, 1)))
    position: str = field(default="bottom_right", metadata=allowed(Options(_CORNERS)))
    margin: int = field(default=1, metadata=allowed(Interval(int, 0)))
    value: float = field(default=1.0, metadata=allowed(Interval(float)))
    model_replacement: bool = False
    # None: the paper's n/eta
    boost: float | None = field(default=None, metadata=allowed(POSITIVE, None))
    eta: float = field(default=1.0, metadata=allowed(POSITIVE))

    def __post_init__(self) -> None:
        check_fields(self, "backdoor")
        if self.boost is not None and not self.model_replacement:
            raise ValueError("backdoor boost only applies with model_replacement=True")

    def stamp(self, images: Tensor) -> Tensor:
        """A copy of ``images`` ``(N, [C,] H, W)`` (volumes ``(N, C, D, H, W)``) with the
        trigger on every image."""
        if not isinstance(images, Tensor) or not 3 <= images.ndim <= 5:
            raise ValueError(
                "backdoor images must be a tensor (N, C, H, W), (N, H, W) or volumes (N, C, D, H, W)"
            )
        extent = images.shape[-3:] if images.ndim == 5 else images.shape[-2:]
        if self.size + self.margin > min(extent):
            shape = "x".join(map(str, extent))
            raise ValueError(
                f"backdoor size + margin = {self.size + self.margin} does not fit "
                f"{shape} {'volumes' if images.ndim == 5 else 'images'}; lower size or margin"
            )
        height, width = extent[-2:]
        top = self.margin if self.position.startswith("top") else height - self.margin - self.size
        left = self.margin if self.position.endswith("left") else width - self.margin - self.size
        rows, columns = slice(top, top + self.size), slice(left, left + self.size)
        out = images.clone()
        if images.ndim == 5:  # a cube: the square on `size` slices, `margin` from the first
            out[..., self.margin : self.margin + self.size, rows, columns] = self.value
        else:
            out[..., rows, columns] = self.value
        return out

    def poison(
        self, images: Tensor, labels: Tensor | np.ndarray, *, num_classes: int, seed: int
    ) -> tuple[Tensor, Tensor | np.ndarray]:
        """Stamp the trigger on a seeded ``poison_fraction`` of the images and relabel them
        ``target_label``; copies of the same types, shapes and dtypes."""
        self._check_client_data(images, labels, num_classes)
        n = int(labels.shape[0])
        count = math.floor(self.poison_fraction * n + 0.5 + 1e-9)
        chosen = np.sort(np.random.default_rng(seed).choice(n, size=count, replace=False))
        index = torch.from_numpy(chosen).to(images.device)
        poisoned = images.clone()
        poisoned[index] = self.stamp(images[index])
        if isinstance(labels, Tensor):
            relabelled = labels.clone()
            relabelled[torch.from_numpy(chosen).to(labels.device)] = self.target_label
        else:
            relabelled = np.array(labels, copy=True)
            relabelled[chosen] = self.target_label
        return poisoned, relabelled

    def _check_client_data(
        self, images: Tensor, labels: Tensor | np.ndarray, num_classes: int
    ) -> None:
        if self.target_label >= num_classes:
            raise ValueError(
                f"backdoor target_label {self.target_label} is not a class of a "
                f"{num_classes}-class task; use 0..{num_classes - 1}"
            )
        if labels.ndim not in (1, 2) or (labels.ndim == 2 and labels.shape[1] != 1):
            raise ValueError(
                f"backdoor needs single-label class ids (N,) or (N, 1), got {tuple(labels.shape)}"
            )
        if images.shape[0] != labels.shape[0]:
            raise ValueError(f"backdoor got {images.shape[0]} images for {labels.shape[0]} labels")

    def _attack_round(
        self, state: AttackState, rnd: AttackRound
    ) -> tuple[AttackState, dict[str, float]]:
        if not self.model_replacement:
            return state, {}
        factor = self.boost if self.boost is not None else rnd.out.shape[0] / self.eta
        rnd.out[rnd.mask] = factor * rnd.out[rnd.mask]
        return state, {"boost": factor}
