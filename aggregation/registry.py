"""The aggregator and filter registries; ``build_*``/``list_*`` are the only look-ups."""

from __future__ import annotations

from typing import Any

from aggregation.base import AggregationRule, Filter
from federated.registry import Registry

__all__ = [
    "AGGREGATORS",
    "FILTERS",
    "build_aggregator",
    "build_filter",
    "list_aggregators",
    "list_filters",
    "register_aggregator",
    "register_filter",
]

AGGREGATORS: Registry[AggregationRule] = Registry("aggregator")
FILTERS: Registry[Filter] = Registry("filter")

register_aggregator = AGGREGATORS.register
register_filter = FILTERS.register


def build_aggregator(name: str, **params: Any) -> AggregationRule:
    """Build the rule registered as ``name``; unknown names/parameters list what exists."""
    return AGGREGATORS.build(name, **params)


def list_aggregators() -> list[str]:
    return AGGREGATORS.names()


def build_filter(name: str, **params: Any) -> Filter:
    return FILTERS.build(name, **params)


def list_filters() -> list[str]:
    return FILTERS.names()
