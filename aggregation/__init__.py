"""Pluggable aggregation rules and client filters, picked by name from params.yaml.

>>> from aggregation import build_aggregator
>>> agg = build_aggregator("fedavg")
>>> out = agg(updates, weights=None)  # (n_clients, n_params) -> (n_params,)
"""

from aggregation import (  # noqa: F401  (importing a module registers its rules/filters)
    bulyan,
    centered_clipping,
    ema,
    fedlag,
    filters,
    geometric_median,
    krum,
    mean,
    median,
    trimmed_mean,
    zeno,
)
from aggregation.base import AggregationRule, Filter, FilterDecision, drop_non_finite
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
    "drop_non_finite",
    "list_aggregators",
    "list_filters",
    "register_aggregator",
    "register_filter",
]
