"""What every attack is, and the run's malicious set (the ground truth).

Three kinds of attack, told apart by ``kind``:

- ``"data"`` (:class:`DataAttack`): poisons a malicious client's local data once, before
  training. The data/partition side calls :meth:`DataAttack.poison` (images and labels) for
  each malicious client with that client's own seed (:func:`client_seed`);
  :meth:`DataAttack.poison_labels` stays for attacks that only touch labels (label_flip).
- ``"model"`` (:class:`ModelAttack`): rewrites the malicious clients' update rows after
  local training. The server calls :meth:`ModelAttack.step` once per round with all
  submitted updates ``(n, d)`` and the malicious mask ``(n,)``, keeping the attack's state
  (``init_state()``; empty for stateless attacks) in the open; :meth:`ModelAttack.apply` is
  a step from a fresh state. Omniscient attacks (ALIE, IPM, min-max, ...) read the benign
  rows of the same round; optimised ones (``requires_aggregate``) also need ``aggregate``,
  a closure running the server's defence on a candidate ``(n, d)`` tensor.
- ``"both"``: a data attack whose malicious clients also rewrite their updates (the
  backdoor with model replacement); it is a :class:`DataAttack` and a :class:`ModelAttack`.

``"none"`` is the no-attack entry (``attack: {name: none}``), which does nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "Aggregate",
    "Attack",
    "AttackKind",
    "AttackRound",
    "AttackState",
    "DataAttack",
    "ModelAttack",
    "choose_malicious",
    "client_seed",
    "malicious_mask",
]

AttackKind = Literal["data", "model", "both", "none"]
AttackState = dict[str, Any]
# The server's defence on a candidate round: stacked updates (n, d) -> aggregate (d,).
Aggregate = Callable[[Tensor], Tensor]


class Attack:
    """Base of every attack: a frozen dataclass of hyperparameters with a ``kind``."""

    kind: ClassVar[AttackKind] = "none"


class DataAttack(Attack):
    """An attack on a client's local data, applied once before training."""

    kind: ClassVar[AttackKind] = "data"

    def poison(
        self, images: Tensor, labels: Tensor | np.ndarray, *, num_classes: int, seed: int
    ) -> tuple[Tensor, Tensor | np.ndarray]:
        """Poisoned copies of a client's ``images`` ``(N, C, H, W)`` and ``labels``.

        Inputs are never modified in place; an attack that leaves the images alone returns
        them as they are. This default poisons the labels only (:meth:`poison_labels`).
        """
        return images, self.poison_labels(labels, num_classes=num_classes, seed=seed)

    def poison_labels(
        self, labels: Tensor | np.ndarray, *, num_classes: int, seed: int
    ) -> Tensor | np.ndarray:
        """Return a poisoned copy of ``labels`` (same type, shape and dtype)."""
        raise NotImplementedError(
            f"{type(self).__name__} poisons images as well as labels: call poison(images, labels, ...)"
        )


@dataclass(frozen=True)
class AttackRound:
    """One round as a model attack sees it.

    ``out``: a copy of the round's updates ``(n, d)`` whose malicious rows the attack
    overwrites in place; ``mask``: bool ``(n,)`` on ``out``'s device; ``generator``: the
    round's randomness; ``aggregate``: the server's defence, or None.
    """

    out: Tensor
    mask: Tensor
    generator: torch.Generator | None = None
    aggregate: Aggregate | None = None

    def benign(self, attack: str) -> Tensor:
        """The benign rows ``(m, d)``; a round without one is refused, naming ``attack``."""
        honest = self.out[~self.mask]
        if honest.shape[0] == 0:
            raise ValueError(
                f"{attack} needs at least one benign update in the round (all malicious)"
            )
        return honest


class ModelAttack(Attack):
    """An attack on the submitted updates, applied by the server every round."""

    kind: ClassVar[AttackKind] = "model"
    # True for attacks that optimise against the server's defence: ``step`` needs ``aggregate``.
    requires_aggregate: ClassVar[bool] = False

    def init_state(self) -> AttackState:
        """The attack's memory across rounds (tensors and plain values; empty if stateless)."""
        return {}

    def step(
        self,
        state: AttackState,
        updates: Tensor,
        malicious_mask: Tensor,
        generator: torch.Generator | None = None,
        *,
        aggregate: Aggregate | None = None,
    ) -> tuple[Tensor, AttackState, dict[str, float]]:
        """One round: ``(attacked updates (n, d), new state, diagnostics)``.

        ``updates``: ``(n, d)`` honest updates Δ of the round's clients; ``malicious_mask``:
        bool ``(n,)``; ``generator``: randomness for stochastic attacks; ``aggregate``: the
        server's defence (filters + rule) as a pure function of a stacked ``(n, d)`` tensor in
        this row order, returning ``(d,)`` and advancing no state. Benign rows are returned
        unchanged; neither ``updates`` nor ``state`` is modified in place. A round without a
        malicious row returns an equal copy and the state as it was.
        """
        _check_inputs(updates, malicious_mask)
        if self.requires_aggregate and aggregate is None:
            raise ValueError(
                f"{type(self).__name__} optimises against the server's defence: pass aggregate "
                "(a closure running the server's filters and rule on an (n, d) tensor); got None"
            )
        out = updates.clone()
        mask = malicious_mask.to(updates.device)
        if not bool(mask.any()):
            return out, state, {}
        new_state, diagnostics = self._attack_round(
            state, AttackRound(out, mask, generator, aggregate)
        )
        return out, new_state, diagnostics

    def apply(
        self,
        updates: Tensor,
        malicious_mask: Tensor,
        generator: torch.Generator | None = None,
        *,
        aggregate: Aggregate | None = None,
    ) -> Tensor:
        """Return a new ``(n, d)`` tensor whose malicious rows are attacked: a :meth:`step`
        from a fresh state (the same as every round for stateless attacks)."""
        out, _, _ = self.step(
            self.init_state(), updates, malicious_mask, generator, aggregate=aggregate
        )
        return out

    def _attack_round(
        self, state: AttackState, rnd: AttackRound
    ) -> tuple[AttackState, dict[str, float]]:
        """Overwrite ``rnd.out[rnd.mask]`` in place; return the new state and diagnostics.
        Stateless attacks implement :meth:`_attack` instead."""
        self._attack(rnd.out, rnd.mask, rnd.generator)
        return state, {}

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
