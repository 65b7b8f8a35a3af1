"""The distance CUSUM: clients excluded on evidence summed over rounds (a filter).

Not PID-MADE: no P, I or D term enters its decision. Per round and client id, the
distance ``D`` of the update from the round's centroid (as PID-MADE measures it,
:mod:`aggregation.filters.centroid_history`), its robust z-score over the round's scored
clients ``z = (D − median)/(1.4826·MAD)``, and Page's CUSUM

    S_t = max(0, S_{t−1} + min(z_t, drift + h) − drift);

a client is excluded once ``S_t > h`` (for good, with ``exclusion="permanent"``). Only
rounds more than ``drift`` robust deviations out add evidence and one round adds at most
``h``, so nobody is excluded on one round's evidence: small honest clients reach a z of
5–6 in some round with no attack at all (BreastMNIST, 20 clients), while flipped labels
sit far out round after round.

``drift=3`` and ``h=8`` were chosen on seeds 0–9 of ``benchmarks/papers/pid_made_ablation.py``
(the search: its ``--search``, its record
``benchmarks/results/pid-made-cusum-search.csv``); results are judged on seeds no choice
saw. ``round_cut`` (off by default) also leaves an update more than that many robust
deviations out of its round without banning it: with ``round_cut = drift + h = 11``
this filter is what ``pid_made`` ran by default before it became the paper's method.

Parameters: ``drift=3.0`` (≥ 0), ``h=8.0`` (> 0), ``round_cut=None``, ``centroid``,
``exclusion``, ``gm_max_iter``, ``gm_tol`` as for ``pid_made``. Columns: ``distance``,
``z``, ``cusum``, ``banned``; the score is the CUSUM and the threshold ``h``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aggregation.filters.centroid_history import (
    CUSUM_H,
    DRIFT,
    CentroidHistoryFilter,
    Judgement,
    RoundRows,
    State,
    cusum_judgement,
)
from aggregation.registry import register_filter

__all__ = ["DistanceCUSUM"]


@register_filter("distance_cusum")
@dataclass(frozen=True, kw_only=True)
class DistanceCUSUM(CentroidHistoryFilter):
    """Page's CUSUM of each client's robust z of its distance; excluded above ``h``."""

    drift: float = field(default=3.0, metadata=DRIFT)
    h: float = field(default=8.0, metadata=CUSUM_H)

    name = "distance_cusum"

    def _judge(self, state: State, rows: RoundRows) -> Judgement:
        return cusum_judgement(
            state["history"], rows.ids, rows.z, rows.active, rows.pool,
            drift=self.drift, h=self.h, of="distance",
        )  # fmt: skip
