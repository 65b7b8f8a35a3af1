"""Pluggable aggregation rules, pre-aggregators, client filters and server optimizers,
picked by name from params.yaml.

>>> from aggregation import build_aggregator
>>> agg = build_aggregator("fedavg")
>>> out = agg(updates, weights=None)  # (n_clients, n_params) -> (n_params,)
>>> weights = build_server_optimizer("adam").step(weights, out)  # FedAdam on the rule
"""

from aggregation import (  # noqa: F401  (importing a module registers its rules/filters)
    afl,
    bulyan,
    centered_clipping,
    dnc,
    ema,
    fedlag,
    fednova,
    filters,
    fltrust,
    foolsgold,
    geometric_median,
    krum,
    mda,
    meamed,
    mean,
    median,
    monna,
    norm_bounded_mean,
    preaggregators,
    server_optimizers,
    trimmed_mean,
    weighted_median,
    weighted_trimmed_mean,
    zeno,
)
from aggregation.base import (
    AggregationRule,
    Filter,
    FilterDecision,
    PreAggregation,
    PreAggregator,
    RoundInputs,
    ServerOptimizer,
    drop_non_finite,
)
from aggregation.preaggregators import Chain, client_columns, preaggregate
from aggregation.registry import (
    build_aggregator,
    build_filter,
    build_preaggregator,
    build_server_optimizer,
    list_aggregators,
    list_filters,
    list_preaggregators,
    list_server_optimizers,
    register_aggregator,
    register_filter,
    register_preaggregator,
    register_server_optimizer,
)

__all__ = [
    "AggregationRule",
    "Chain",
    "Filter",
    "FilterDecision",
    "PreAggregation",
    "PreAggregator",
    "RoundInputs",
    "ServerOptimizer",
    "build_aggregator",
    "build_filter",
    "build_preaggregator",
    "build_server_optimizer",
    "client_columns",
    "drop_non_finite",
    "list_aggregators",
    "list_filters",
    "list_preaggregators",
    "list_server_optimizers",
    "preaggregate",
    "register_aggregator",
    "register_filter",
    "register_preaggregator",
    "register_server_optimizer",
]
