"""What values a setting allows, declared once beside the setting.

scikit-learn's ``_parameter_constraints`` is the model: a setting lists the kinds of value
it allows (an :class:`Interval` of integers or numbers, :class:`Options`, ``None``) and one
check reads that list. The engine's frozen parts declare theirs on the field
(``field(default=0.9, metadata=allowed(Interval(float, 0, 1, closed="left")))``) and check
them in ``__post_init__`` with :func:`check_fields`; the params layer reads the same
declarations (:func:`declared`), so a bound is written once and both say the same one line:
``momentum must be a number in [0, 1), got 1.5``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from numpy import bool_ as numpy_bool

__all__ = [
    "POSITIVE",
    "Constraint",
    "Interval",
    "Options",
    "allowed",
    "check",
    "check_fields",
    "declared",
    "describe",
    "is_allowed",
]

_KEY = "allowed"


@dataclass(frozen=True)
class Interval:
    """Integers (``int``; never a bool) or finite real numbers (``float``; an int counts),
    numpy's scalars included, between ``low`` and ``high`` (None: unbounded), each end
    included as ``closed`` says."""

    kind: type[int] | type[float]
    low: float | None = None
    high: float | None = None
    closed: Literal["both", "left", "right", "neither"] = "both"

    def __contains__(self, value: object) -> bool:
        kind = numbers.Integral if self.kind is int else numbers.Real  # numpy's scalars too
        if isinstance(value, bool | numpy_bool) or not isinstance(value, kind):
            return False
        if not math.isfinite(value):
            return False
        low_in = self.closed in ("both", "left")
        high_in = self.closed in ("both", "right")
        above = self.low is None or value > self.low or (low_in and value == self.low)
        below = self.high is None or value < self.high or (high_in and value == self.high)
        return above and below

    def __str__(self) -> str:
        bounded = self.low is not None and self.high is not None
        what = "an integer" if self.kind is int else "a number" if bounded else "a finite number"
        low_in = self.closed in ("both", "left")
        high_in = self.closed in ("both", "right")
        if bounded:
            return f"{what} in {'[' if low_in else '('}{self.low}, {self.high}{']' if high_in else ')'}"
        if self.low is not None:
            return f"{what} {'>=' if low_in else '>'} {self.low}"
        if self.high is not None:
            return f"{what} {'<=' if high_in else '<'} {self.high}"
        return what


@dataclass(frozen=True)
class Options:
    """One of a fixed set of values (names, usually)."""

    values: tuple[Any, ...]

    @classmethod
    def of(cls, literal: Any) -> Options:
        """The values of a ``Literal[...]`` type, so the type and the check stay one list."""
        return cls(get_args(literal))

    def __contains__(self, value: object) -> bool:
        return not isinstance(value, bool) and value in self.values

    def __str__(self) -> str:
        return "one of " + ", ".join(repr(value) for value in self.values)


Constraint = Interval | Options | None  # None: the value None (null in params.yaml)
POSITIVE = Interval(float, 0, closed="neither")  # a finite number > 0: rates, scales, radii


def is_allowed(value: Any, constraints: Sequence[Constraint]) -> bool:
    """Whether ``value`` meets one of ``constraints``."""
    return any(
        value is None if constraint is None else value in constraint for constraint in constraints
    )


def describe(constraints: Sequence[Constraint], none: str = "None") -> str:
    """What ``constraints`` allow, in words (``none`` names the value None)."""
    return " or ".join(none if c is None else str(c) for c in constraints)


def check(name: str, value: Any, constraints: Sequence[Constraint]) -> None:
    """Raise a one-line ValueError naming ``name``, what is allowed and ``value``, unless
    ``value`` meets one of ``constraints``."""
    if not is_allowed(value, constraints):
        raise ValueError(f"{name} must be {describe(constraints)}, got {value!r}")


def allowed(*constraints: Constraint) -> Mapping[str, tuple[Constraint, ...]]:
    """A dataclass field's metadata declaring what it allows (read by :func:`check_fields`
    and :func:`declared`)."""
    return {_KEY: constraints}


def check_fields(instance: Any, owner: str = "") -> None:
    """Check every field of a dataclass instance that declares what it allows (``owner``,
    e.g. a filter's registered name, starts each message)."""
    for field in dataclasses.fields(instance):
        if _KEY in field.metadata:
            name = f"{owner} {field.name}" if owner else field.name
            check(name, getattr(instance, field.name), field.metadata[_KEY])


def declared(owner: type, name: str) -> tuple[Constraint, ...]:
    """What field ``name`` of dataclass ``owner`` allows, as it declares it."""
    for field in dataclasses.fields(owner):
        if field.name == name and _KEY in field.metadata:
            return field.metadata[_KEY]
    raise KeyError(f"{owner.__name__}.{name} declares no constraints")
