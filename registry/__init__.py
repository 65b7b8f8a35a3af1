"""One explicit registry per kind of component (aggregators, filters, models, ...).

A registry maps a snake_case name to a factory (usually a frozen dataclass whose fields
are the component's hyperparameters). ``build(name, **params)`` is the only look-up: an
unknown name or an unknown parameter raises :class:`RegistryError` listing what exists.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "RegistryError"]

T = TypeVar("T")
_SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


class RegistryError(ValueError):
    """A bad look-up: unknown name, unknown or invalid parameter."""


class Registry(Generic[T]):
    """Name -> factory map for one kind of component, filled by a decorator."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator registering ``factory`` under ``name``; a duplicate name raises."""
        if not _SNAKE.match(name):
            raise RegistryError(f"{self.kind} name {name!r} must be snake_case")

        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise RegistryError(f"{self.kind} {name!r} is already registered")
            self._factories[name] = factory
            return factory

        return decorator

    def names(self) -> list[str]:
        return sorted(self._factories)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def factory(self, name: str) -> Callable[..., T]:
        if name not in self._factories:
            raise RegistryError(
                f"unknown {self.kind} {name!r}; available: {', '.join(self.names())}"
            )
        return self._factories[name]

    def parameters(self, name: str) -> list[str]:
        """The keyword parameters the factory accepts (dataclass fields or signature)."""
        factory = self.factory(name)
        if dataclasses.is_dataclass(factory):
            return [f.name for f in dataclasses.fields(factory) if f.init]
        signature = inspect.signature(factory)
        return [
            p.name
            for p in signature.parameters.values()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]

    def build(self, name: str, **params: Any) -> T:
        """Instantiate ``name`` with ``params``; unknown names/parameters list what exists."""
        factory = self.factory(name)
        accepted = self.parameters(name)
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            allowed = ", ".join(accepted) if accepted else "none"
            raise RegistryError(
                f"{self.kind} {name!r} has no parameter {', '.join(unknown)}; accepted: {allowed}"
            )
        try:
            return factory(**params)
        except (TypeError, ValueError) as error:
            if isinstance(error, RegistryError):
                raise
            raise RegistryError(f"{self.kind} {name!r}: {error}") from error
