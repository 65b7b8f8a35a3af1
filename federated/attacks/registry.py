"""The attack registry; ``build_attack``/``list_attacks`` are the only look-ups."""

from __future__ import annotations

from typing import Any

from federated.attacks.base import Attack
from registry import Registry

__all__ = ["ATTACKS", "build_attack", "list_attacks", "register_attack"]

ATTACKS: Registry[Attack] = Registry("attack")
register_attack = ATTACKS.register


def build_attack(name: str, **params: Any) -> Attack:
    """Build the attack registered as ``name``; unknown names/parameters list what exists.

    The malicious set (``fraction``/``ids``) is not an attack parameter: it goes to
    :func:`federated.attacks.choose_malicious`.
    """
    return ATTACKS.build(name, **params)


def list_attacks() -> list[str]:
    return ATTACKS.names()
