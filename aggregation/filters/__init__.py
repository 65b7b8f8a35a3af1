"""Filters: exclusion steps in front of any aggregator (keep-mask plus diagnostics)."""

from aggregation.filters import pid_made  # noqa: F401  (registers the filters)
from aggregation.filters.pid_made import PIDMADE, chebyshev_k, gaussian_k

__all__ = ["PIDMADE", "chebyshev_k", "gaussian_k"]
