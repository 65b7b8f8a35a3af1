"""The no-attack entry, so that ``attack: {name: none}`` builds like any other attack."""

from __future__ import annotations

from dataclasses import dataclass

from federated.attacks.base import Attack
from federated.attacks.registry import register_attack

__all__ = ["NoAttack"]


@register_attack("none")
@dataclass(frozen=True, kw_only=True)
class NoAttack(Attack):
    """Does nothing; ``kind == "none"`` so neither the data nor the server side acts."""
