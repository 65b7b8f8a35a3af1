"""The named filter configurations the robustness grids and the PID-MADE ablation share
(benchmarks/papers/pid_made_ablation.py, benchmarks/robustness/small_consortium.py, and
through it the real-site pilot): here, so that a benchmark of one folder never reads
another's experiment to know what a defence's name means."""

from __future__ import annotations

from typing import Any

__all__ = ["VARIANTS"]

# banned_updates: left_out, the reading these records were made with (pid_made's default
# is now the paper's, counted: see aggregation/filters/pid_made.py)
_PID = {"name": "pid_made", "kp": 1.0, "ki": 0.5, "kd": 0.05, "alpha": 0.05,
        "centroid": "mean", "exclusion": "permanent", "banned_updates": "left_out"}  # fmt: skip
_CUSUM = {"drift": 3.0, "h": 8.0}
VARIANTS: dict[str, dict[str, Any]] = {
    "paper_gaussian": _PID | {"threshold": "gaussian"},
    "paper_chebyshev": _PID | {"threshold": "chebyshev"},
    "pid_robust_spent": _PID | {"threshold": "robust", "spending": "rounds"},
    "pid_robust_fixed": _PID | {"threshold": "robust", "spending": "none"},
    "pid_cusum": _PID | {"threshold": "cusum"} | _CUSUM,
    "distance_cusum": {"name": "distance_cusum", "exclusion": "permanent"} | _CUSUM,
    "distance_cusum_cut": {"name": "distance_cusum", "exclusion": "permanent", "round_cut": 11.0}
    | _CUSUM,
    # what the recorded search's stated rule picks on seeds 0-9 (see cusum_search_block)
    "distance_cusum_drift4": {
        "name": "distance_cusum",
        "exclusion": "permanent",
        "drift": 4.0,
        "h": 8.0,
    },
}
