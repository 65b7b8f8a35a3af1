"""Filters: exclusion steps in front of any aggregator (keep-mask plus diagnostics)."""

from aggregation.filters import distance_cusum, pid_made  # noqa: F401  (registers the filters)
from aggregation.filters.distance_cusum import DistanceCUSUM
from aggregation.filters.pid_made import PIDMADE, chebyshev_k, gaussian_k

__all__ = ["PIDMADE", "DistanceCUSUM", "chebyshev_k", "gaussian_k"]
