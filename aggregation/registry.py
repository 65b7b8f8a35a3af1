"""The aggregator, pre-aggregator and filter registries; ``build_*``/``list_*`` are the only
look-ups."""

from __future__ import annotations

from typing import Any

from aggregation.base import AggregationRule, Filter, PreAggregator
from registry import Registry

__all__ = [
    "AGGREGATORS",
    "FILTERS",
    "PREAGGREGATORS",
    "build_aggregator",
    "build_filter",
    "build_preaggregator",
    "list_aggregators",
    "list_filters",
    "list_preaggregators",
    "preaggregator_name",
    "register_aggregator",
    "register_filter",
    "register_preaggregator",
]

AGGREGATORS: Registry[AggregationRule] = Registry("aggregator")
FILTERS: Registry[Filter] = Registry("filter")
PREAGGREGATORS: Registry[PreAggregator] = Registry("pre-aggregator")

register_aggregator = AGGREGATORS.register
register_filter = FILTERS.register
register_preaggregator = PREAGGREGATORS.register


def build_aggregator(name: str, **params: Any) -> AggregationRule:
    """Build the rule registered as ``name``; unknown names/parameters list what exists."""
    return AGGREGATORS.build(name, **params)


def list_aggregators() -> list[str]:
    return AGGREGATORS.names()


def build_filter(name: str, **params: Any) -> Filter:
    return FILTERS.build(name, **params)


def list_filters() -> list[str]:
    return FILTERS.names()


def build_preaggregator(name: str, **params: Any) -> PreAggregator:
    """Build the pre-aggregator registered as ``name`` (unknown names/parameters list
    what exists)."""
    return PREAGGREGATORS.build(name, **params)


def list_preaggregators() -> list[str]:
    return PREAGGREGATORS.names()


def preaggregator_name(preaggregator: PreAggregator) -> str:
    """The name ``preaggregator``'s class is registered under."""
    for name in PREAGGREGATORS.names():
        if PREAGGREGATORS.factory(name) is type(preaggregator):
            return name
    raise ValueError(f"{type(preaggregator).__name__} is not a registered pre-aggregator")
