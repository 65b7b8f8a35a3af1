"""Filters: exclusion steps in front of any aggregator (keep-mask plus diagnostics)."""

from aggregation.filters import distance_cusum, pid_made, site_validation  # noqa: F401  (registers)
from aggregation.filters.distance_cusum import DistanceCUSUM
from aggregation.filters.pid_made import PIDMADE, chebyshev_k, gaussian_k
from aggregation.filters.site_validation import SiteValidation, validation_verdict

__all__ = [
    "PIDMADE",
    "DistanceCUSUM",
    "SiteValidation",
    "chebyshev_k",
    "gaussian_k",
    "validation_verdict",
]
