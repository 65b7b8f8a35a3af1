"""What every attack is, and the run's malicious set (the ground truth).

Two kinds of attack, told apart by ``kind``:

- ``"data"`` (:class:`DataAttack`): poisons a malicious client's local labels once, before
  training. The data/partition side calls :meth:`DataAttack.poison_labels` for each
  malicious client with that client's own seed (:func:`client_seed`).
- ``"model"`` (:class:`ModelAttack`): rewrites the malicious clients' update rows after
  local training. The server calls :meth:`ModelAttack.apply` once per round with all
  submitted updates ``(n, d)`` and the malicious mask ``(n,)``; omniscient attacks (ALIE,
  IPM) read the benign rows of the same round.

``"none"`` is the no-attack entry (``attack: {name: none}``), which does nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import ClassVar, Literal

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "Attack",
    "AttackKind",
    "DataAttack",
    "ModelAttack",
    "choose_malicious",
    "client_seed",
    "malicious_mask",
]

AttackKind = Literal["data", "model", "none"]


class Attack:
    """Base of every attack: a frozen dataclass of hyperparameters with a ``kind``."""

    kind: ClassVar[AttackKind] = "none"


class DataAttack(Attack):
    """An attack on a client's local data, applied once before training."""

    kind: ClassVar[AttackKind] = "data"

    def poison_labels(
        self, labels: Tensor | np.ndarray, *, num_classes: int, seed: int
    ) -> Tensor | np.ndarray:
        """Return a poisoned copy of ``labels`` (same type, shape and dtype)."""
        raise NotImplementedError


class ModelAttack(Attack):
    """An attack on the submitted updates, applied by the server every round."""

    kind: ClassVar[AttackKind] = "model"

    def apply(
        self,
        updates: Tensor,
        malicious_mask: Tensor,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Return a new ``(n, d)`` tensor whose malicious rows are attacked.

        ``updates``: ``(n, d)`` honest updates Δ of the round's clients; ``malicious_mask``:
        bool ``(n,)``; ``generator``: randomness for stochastic attacks. Benign rows are
        returned unchanged; ``updates`` is never modified in place.
        """
        _check_inputs(updates, malicious_mask)
        out = updates.clone()
        if bool(malicious_mask.any()):
            self._attack(out, malicious_mask.to(updates.device), generator)
        return out

    def _attack(self, out: Tensor, mask: Tensor, generator: torch.Generator | None) -> None:
        """Overwrite ``out[mask]`` in place (``out`` is already a copy)."""
        raise NotImplementedError


def _check_inputs(updates: Tensor, mask: Tensor) -> None:
    if updates.ndim != 2:
        raise ValueError(f"updates must be 2-D (n_clients, n_params), got {tuple(updates.shape)}")
    if mask.dtype != torch.bool or mask.shape != (updates.shape[0],):
        raise ValueError(
            f"malicious_mask must be a bool tensor of shape ({updates.shape[0]},), "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )


def choose_malicious(
    num_clients: int,
    *,
    fraction: float | None = None,
    ids: Iterable[int] | None = None,
    seed: int,
) -> frozenset[int]:
    """The run's malicious client ids: fixed for the run, the ground truth of the trail.

    Exactly one of ``fraction`` (share of ``num_clients``, rounded to the nearest integer,
    halves up, drawn uniformly without replacement with ``seed``) or ``ids`` (explicit
    ids in ``[0, num_clients)``; ``seed`` unused) must be given.

    >>> sorted(choose_malicious(10, ids=[3, 7], seed=0))
    [3, 7]
    """
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if (fraction is None) == (ids is None):
        raise ValueError("give exactly one of fraction (a share of clients) or ids (explicit ids)")
    if ids is not None:
        chosen = [int(i) for i in ids]
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"malicious ids contain duplicates: {sorted(chosen)}")
        bad = [i for i in chosen if not 0 <= i < num_clients]
        if bad:
            raise ValueError(f"malicious ids {bad} are outside [0, {num_clients})")
        return frozenset(chosen)
    assert fraction is not None
    if not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
        raise ValueError(f"attack fraction must be in [0, 1], got {fraction}")
    count = math.floor(fraction * num_clients + 0.5 + 1e-9)
    rng = np.random.default_rng(seed)
    picked = rng.choice(num_clients, size=count, replace=False)
    return frozenset(int(i) for i in picked)


def client_seed(seed: int, client_id: int) -> int:
    """A per-client seed derived from the run seed (independent streams per client)."""
    state = np.random.SeedSequence([int(seed), int(client_id)]).generate_state(1)
    return int(state[0])


def malicious_mask(
    client_ids: Sequence[int], malicious: Iterable[int], *, device: torch.device | str = "cpu"
) -> Tensor:
    """Bool ``(len(client_ids),)``: which rows of a round belong to malicious clients."""
    bad = set(malicious)
    return torch.tensor([int(i) in bad for i in client_ids], dtype=torch.bool, device=device)
