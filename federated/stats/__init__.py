"""Statistics for EMA's assumptions: normality pre-testing and non-IID detection.

Pure functions over numpy/torch inputs; results are dataclasses the shell logs.
"""

from federated.stats.noniid import (
    NonIIDResult,
    client_losses,
    coefficient_of_variation,
    loss_zscores,
    noniid_exclusions,
    noniid_verdict,
)
from federated.stats.normality import (
    ANDERSON_SIGNIFICANCE,
    LayerPretest,
    NormalityTests,
    PretestResult,
    QQData,
    anderson_critical_values,
    anderson_darling,
    anderson_normal,
    anderson_pvalue_interpolated,
    anderson_pvalue_stephens,
    constant_mask,
    normality_tests,
    pretest_normality,
    qq_data,
    representative_coords,
    sample_coordinates,
    shapiro_wilk,
    shapiro_wilk_coefficients,
)

__all__ = [
    "ANDERSON_SIGNIFICANCE",
    "LayerPretest",
    "NonIIDResult",
    "NormalityTests",
    "PretestResult",
    "QQData",
    "anderson_critical_values",
    "anderson_darling",
    "anderson_normal",
    "anderson_pvalue_interpolated",
    "anderson_pvalue_stephens",
    "client_losses",
    "coefficient_of_variation",
    "constant_mask",
    "loss_zscores",
    "noniid_exclusions",
    "noniid_verdict",
    "normality_tests",
    "pretest_normality",
    "qq_data",
    "representative_coords",
    "sample_coordinates",
    "shapiro_wilk",
    "shapiro_wilk_coefficients",
]
