"""Pre-aggregators: transforms of the stacked updates in front of any rule (ByzFL's sense),
chained in any number and order, every effect traced to the clients by a mixing matrix."""

from aggregation.preaggregators import arc, bucketing, clip, nnm  # noqa: F401  (registers them)
from aggregation.preaggregators.arc import ARC
from aggregation.preaggregators.bucketing import Bucketing
from aggregation.preaggregators.chain import Chain, client_columns, preaggregate, through
from aggregation.preaggregators.clip import StaticClipping
from aggregation.preaggregators.nnm import NNM

__all__ = [
    "ARC",
    "NNM",
    "Bucketing",
    "Chain",
    "StaticClipping",
    "client_columns",
    "preaggregate",
    "through",
]
