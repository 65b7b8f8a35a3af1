"""Pluggable aggregation rules and client filters, picked by name from params.yaml.

>>> from aggregation import build_aggregator
>>> agg = build_aggregator("fedavg")
>>> out = agg(updates, weights=None)  # (n_clients, n_params) -> (n_params,)
"""

from aggregation import (
    filters,  # noqa: F401  (registers the filters)
    mean,  # noqa: F401  (registers the rules)
)
from aggregation.base import AggregationRule, Filter, FilterDecision
from aggregation.registry import (
    build_aggregator,
    build_filter,
    list_aggregators,
    list_filters,
    register_aggregator,
    register_filter,
)

__all__ = [
    "AggregationRule",
    "Filter",
    "FilterDecision",
    "build_aggregator",
    "build_filter",
    "list_aggregators",
    "list_filters",
    "register_aggregator",
    "register_filter",
]
