"""The aggregator, pre-aggregator, filter and server-optimizer registries; ``build_*``/``list_*`` are the only
look-ups."""

from __future__ import annotations

from typing import Any

from aggregation.base import AggregationRule, Filter, PreAggregator, ServerOptimizer
from registry import Registry

__all__ = [
    "AGGREGATORS",
    "FILTERS",
    "PREAGGREGATORS",
    "SERVER_OPTIMIZERS",
    "build_aggregator",
    "build_filter",
    "build_preaggregator",
    "build_server_optimizer",
    "list_aggregators",
    "list_filters",
    "list_preaggregators",
    "list_server_optimizers",
    "preaggregator_name",
    "register_aggregator",
    "register_filter",
    "register_preaggregator",
    "register_server_optimizer",
]

AGGREGATORS: Registry[AggregationRule] = Registry("aggregator")
FILTERS: Registry[Filter] = Registry("filter")
PREAGGREGATORS: Registry[PreAggregator] = Registry("pre-aggregator")
SERVER_OPTIMIZERS: Registry[ServerOptimizer] = Registry("server optimizer")

register_aggregator = AGGREGATORS.register
register_filter = FILTERS.register
register_preaggregator = PREAGGREGATORS.register
register_server_optimizer = SERVER_OPTIMIZERS.register


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


def build_server_optimizer(name: str, **params: Any) -> ServerOptimizer:
    """Build the server optimizer registered as ``name`` (``step(weights, delta)``
    returns the next global weights); unknown names/parameters list what exists."""
    return SERVER_OPTIMIZERS.build(name, **params)


def list_server_optimizers() -> list[str]:
    return SERVER_OPTIMIZERS.names()
