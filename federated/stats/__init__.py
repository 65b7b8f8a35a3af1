"""Statistics for EMA's assumptions: normality pre-testing and non-IID detection.

Pure functions over numpy/torch inputs; results are dataclasses the shell logs.
"""

from federated.stats import noniid, normality
from federated.stats.noniid import *  # noqa: F403  (the names its __all__ lists)
from federated.stats.normality import *  # noqa: F403  (the names its __all__ lists)

# each module's own list, kept in one place (as asyncio's package does)
__all__ = [*noniid.__all__, *normality.__all__]
