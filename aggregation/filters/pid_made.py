"""PID-MADE: history-aware anomaly detection and exclusion of clients (a filter).

"Boosting Federated Model Convergence with Anomaly Detection and Exclusion" (PID-MADE),
anonymous ICLR 2026 submission (../shared/papers/pid-made.txt), Sec. 4 and Algorithm 1.
With its defaults this filter is the paper's Algorithm 1; every departure is an option
with a name of its own, off by default.

Definition, per round ``t`` and submitted client ``i`` (rows of ``updates``):

- ``D_t^i = ‖Δ_t^i − μ_t‖``, with ``μ_t`` the mean (or geometric median) of the round's
  submitted rows (with ``banned_updates="left_out"``: of those not banned). The paper
  measures models ``w_t^i``; all clients start from the same global model, so
  ``w_t^i − w_t^j = Δ_t^i − Δ_t^j`` and distances on updates are equal.
- ``u_t^i = Kp·D_t^i + Ki·Σ_{x<t} D_x^i + Kd·(D_t^i − D_{t−1}^i)`` (P, I and D terms).
- The paper's threshold: ``τ_t = mean(u_t) + k·std(u_t)`` over the round's scored clients
  (population std, the paper's ``σ_t``; the banned among them as ``banned_updates``
  says); ``k`` from the alarm rate α: the Gaussian
  quantile ``k = z_{1−α}`` (``threshold="gaussian"``, Theorem 6, **the default**) or
  Chebyshev's one-sided bound ``k = √(1/α − 1)`` (``"chebyshev"``, Theorem 5), or given
  (``threshold="k"``). Client ``i`` is excluded when ``u_t^i > τ_t``.
- ``exclusion="permanent"`` (the default, Algorithm 1's ``Q ← Q \\ A``): an excluded id
  joins the banned set and is excluded in every later round. ``"round"`` is a variant:
  excluded for this round only.
- ``banned_updates``: what a banned client's update, still submitted in a later round, is
  to the round's statistics. It is never kept (it stays out of the aggregation) and it is
  always scored, for the trail (its history grows as anybody's).

  - ``"counted"`` (**the default**, the paper's reading): it counts as one of the round's
    models in the centroid and in the threshold's statistics (``ū_t`` and ``σ_t``; with
    our thresholds, the median and MAD of the scores, the robust z-scores of the CUSUM
    and of the round cut). The paper computes "the centroid μ_t of all submitted
    models", ``μ_t = (1/N) Σ_{i=0}^N w_t^(i)``, and ``ū_t = (1/N) Σ_{i=0}^N u_i``;
    Algorithm 1 computes ``μ_t, u_t^(i), ū_t, σ_t`` right after "receive w_t^i from local
    clients", before its loop over ``Q`` removes anybody.
  - ``"left_out"`` (a variant; this filter's only behaviour before the option, and the
    reading of the committed benchmark records that name it): it is scored against the
    centroid of the others and takes no part in the centroid or in any of the threshold's
    statistics.

Why the Gaussian threshold is the default: Sec. 4.1 applies ``ū + kσ`` and reports it
"effective even when Δ_t are not Gaussian", the Gaussian case's caveat; and Chebyshev's
k at α = 0.05 (√19 ≈ 4.36) cannot exclude anybody among 20 clients or fewer (no z-score
exceeds √(m − 1), Samuelson), the size of the consortia this tool is for. A
``UserWarning`` says so whenever a threshold can exclude nobody.

Thresholds of ours, options of the PID score (the gains Kp, Ki and Kd enter them):

- ``threshold="robust"``: ``τ_t = median(u_t) + k_t·1.4826·MAD(u_t)``. The attackers
  inflate the mean and std they are measured against: with a share ``p`` of identical
  attackers no attacker's z-score exceeds ``√((1−p)/p)`` (2 at p = 0.2, 1.22 at p = 0.4),
  so the paper's thresholds miss them; the median and MAD ignore up to half of the
  scores. ``k_t`` keeps the chance that any honest client is ever excluded near α for
  normal scores: α is split over the ``m`` scored clients (Bonferroni) and, when
  exclusion is permanent, over rounds (``α_t = 6α/(π²t²)``, which sums to α); the
  quantile is Student's t with ``0.45·m`` degrees of freedom (:func:`robust_k`).
  ``spending="none"`` keeps α/m in every round instead (a fixed per-round ``k``).
- ``threshold="cusum"``: Page's CUSUM of each client's robust z-score of its PID score,
  ``S_t = max(0, S_{t−1} + min(z_t, drift + h) − drift)``, excluded once ``S_t > h``:
  only rounds more than ``drift`` robust deviations out add evidence and one round adds
  at most ``h``, so nobody is excluded on one round's evidence. ``drift=3`` and ``h=8``
  were chosen for the CUSUM of the distance alone (``distance_cusum``, on seeds 0–9 of
  ``benchmarks/papers/pid_made_ablation.py``) and are not re-tuned for the PID score.

The CUSUM of the distance without the PID score is a filter of its own,
``distance_cusum`` (aggregation/filters/distance_cusum.py), never shown as PID-MADE. The
per-round cut (``round_cut``, :mod:`aggregation.filters.centroid_history`) is a screen of
its own name, off by default. Every decision carries a ``note`` naming the rule applied
and why, written into the trail beside each exclusion.

Choices where the paper is silent, beside those of
:mod:`aggregation.filters.centroid_history`: a client's first observed round has integral
0 (the empty sum) and ``D_{t−1} := D_t`` (derivative 0), so the first round's score is
``Kp·D``; a client that comes back after rounds unsampled resumes from its own last
observed ``D``, its integral summing the rounds it took part in; ``u > τ`` is compared
with a relative tolerance of 1e-12 so that identical scores are never split by rounding.

Parameters (defaults, the paper's expert values and Theorem 6): ``kp=1.0``, ``ki=0.5``,
``kd=0.05`` (all ≥ 0), ``alpha=0.05`` in (0, 1), ``threshold="gaussian"`` (``gaussian`` |
``chebyshev`` | ``k`` | ``robust`` | ``cusum``), ``k=None`` (required, ≥ 0, exactly when
``threshold="k"``), ``spending="rounds"`` (``rounds`` | ``none``; robust only), ``drift=3.0``
(≥ 0) and ``h=8.0`` (> 0) for ``cusum``, ``round_cut=None`` (> 0: the round cut's z),
``centroid="mean"`` (``mean`` | ``geometric_median``), ``exclusion="permanent"``
(``permanent`` | ``round``), ``banned_updates="counted"`` (``counted`` | ``left_out``),
``gm_max_iter=100`` and ``gm_tol=1e-6`` (Weiszfeld iterations and
relative objective tolerance for the geometric median).

Shapes: ``updates (n, d)``, ``client_ids`` n distinct ints -> ``keep`` bool ``(n,)`` on the
updates' device; ``scores`` and ``columns`` (``distance``, ``p_term``, ``i_term``,
``d_term``, ``z`` (of the distance) float64, ``banned`` bool; with ``cusum`` also
``score_z`` and ``cusum``) ``(n,)`` on the CPU; ``threshold`` = τ. Cost O(n·d) per round
(O(T·n·d) with the geometric median); memory O(d) beyond the input, plus a copy of the
scored rows in rounds where some rows are banned or non-finite.

Example (``threshold="k", k=1``, default gains, 4 clients, 1-D updates):

- round 1, Δ = [0, 0, 0, 4]: μ = 1, D = [1, 1, 1, 3], u = D (first round),
  τ = 1.5 + 0.8660 = 2.3660 -> client 3 excluded;
- round 2, Δ = [0, 0, 2, 2]: μ = 1, D = [1, 1, 1, 1], I = 0.5·[1, 1, 1, 3],
  D-term = 0.05·[0, 0, 0, −2], u = [1.5, 1.5, 1.5, 2.4], τ = 1.725 + 0.3897 = 2.1147
  -> client 3 still excluded, by its history alone;
- round 3, Δ = [4, 0, 0, 0]: μ = 1, D = [3, 1, 1, 1], I = 0.5·[2, 2, 2, 4],
  D-term = 0.05·[2, 0, 0, 0], u = [4.1, 2, 2, 3], τ = 2.775 + 0.8671 = 3.6421
  -> client 0 excluded (a sudden jump), client 3 kept.

Note: :func:`~aggregation.filters.centroid_history._weiszfeld` duplicates
``aggregation/geometric_median.py`` (written at the same time); fold it into that module
once both have landed.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import torch
from torch import Tensor

from aggregation.filters.centroid_history import (
    CUSUM_H,
    DRIFT,
    MAD_TO_STD,
    CentroidHistoryFilter,
    Judgement,
    RoundRows,
    State,
    above,
    cusum_judgement,
    robust_z,
)
from aggregation.registry import register_filter
from registry.constraints import Interval, Options, allowed

__all__ = ["PIDMADE", "chebyshev_k", "gaussian_k"]

_THRESHOLDS = ("gaussian", "chebyshev", "k", "robust", "cusum")
_SPENDING = ("rounds", "none")
_BANNED_UPDATES = ("counted", "left_out")
MAD_T_DOF_PER_SCORE = 0.45  # see robust_k


def chebyshev_k(alpha: float) -> float:
    """One-sided Chebyshev (Cantelli) multiplier: ``P(U − ū ≥ kσ) ≤ α`` for ``k = √(1/α − 1)``."""
    return math.sqrt(1.0 / alpha - 1.0)


def gaussian_k(alpha: float) -> float:
    """Gaussian multiplier ``z_{1−α}``: ``P(U − ū > kσ) = α`` for normal scores."""
    return NormalDist().inv_cdf(1.0 - alpha)


def robust_k(alpha: float, m: int) -> float:
    """Multiplier of ``1.4826·MAD`` that a normal score exceeds with chance ``α`` when the
    median and MAD come from ``m`` scores: Student's t quantile ``t_{ν, 1−α}`` with ``ν =
    0.45·m``, fitted by simulation to the quantiles of ``(x − median)/(1.4826·MAD)`` for
    normal samples of 5 to 200 (fitted ν 2.2, 5, 9, 22, 85 at m = 5, 10, 20, 50, 200).
    The Gaussian quantile ignores how noisy a MAD of a few scores is and flags honest
    clients far too often."""
    from scipy.stats import t as student_t

    return float(student_t.ppf(1.0 - alpha, df=max(MAD_T_DOF_PER_SCORE * m, 1.0)))


@register_filter("pid_made")
@dataclass(frozen=True, kw_only=True)
class PIDMADE(CentroidHistoryFilter):
    """PID score per client id, excluded above ``mean + z(1−α)·std`` of the round's scores
    (the paper's Algorithm 1 with Theorem 6's threshold)."""

    kp: float = field(default=1.0, metadata=allowed(Interval(float, 0)))
    ki: float = field(default=0.5, metadata=allowed(Interval(float, 0)))
    kd: float = field(default=0.05, metadata=allowed(Interval(float, 0)))
    alpha: float = field(default=0.05, metadata=allowed(Interval(float, 0, 1, closed="neither")))
    threshold: str = field(default="gaussian", metadata=allowed(Options(_THRESHOLDS)))
    k: float | None = field(default=None, metadata=allowed(Interval(float, 0), None))
    spending: str = field(default="rounds", metadata=allowed(Options(_SPENDING)))
    drift: float = field(default=3.0, metadata=DRIFT)
    h: float = field(default=8.0, metadata=CUSUM_H)
    # a banned client's update: in the round's centroid and statistics (the paper's "all
    # submitted models") or left out of them; never kept either way
    banned_updates: str = field(default="counted", metadata=allowed(Options(_BANNED_UPDATES)))

    name = "pid_made"

    def __post_init__(self) -> None:
        super().__post_init__()  # every declared field, this class's too
        if self.spending != "rounds" and self.threshold != "robust":
            raise ValueError(
                f"pid_made spending={self.spending!r} is only used with threshold='robust' "
                f"(threshold={self.threshold!r})"
            )
        if self.threshold == "k" and self.k is None:
            raise ValueError("pid_made threshold='k' needs k (a finite number >= 0)")
        if self.threshold != "k" and self.k is not None:
            raise ValueError(
                f"pid_made k={self.k} is only used with threshold='k' "
                f"(threshold={self.threshold!r} derives k from alpha)"
            )

    def counts_banned(self) -> bool:
        """Whether a banned client's update counts in the round's centroid and statistics
        (``banned_updates="counted"``, the paper's "all submitted models")."""
        return self.banned_updates == "counted"

    def cannot_exclude(self, clients: int) -> str | None:
        """The mean-and-std thresholds exclude nobody when ``k`` is at least the largest
        z-score ``clients`` scores can reach, ``√(m − 1)`` (Samuelson)."""
        if self.threshold not in ("gaussian", "chebyshev", "k") or clients < 2:
            return None
        k, bound = self.k_value, math.sqrt(clients - 1)
        if bound > k:
            return None
        return (
            f"pid_made (threshold {self.threshold}) can exclude nobody among {clients} "
            f"clients a round: no score exceeds mean + {k:.4g}·std when the largest z-score "
            f"is √{clients - 1} = {bound:.4g}; docs/configuration.md says what to use at this size"
        )

    def k_value_for(self, m: int, round_number: int = 1) -> float:
        """The multiplier ``k`` in use with ``m`` scored clients in round ``round_number``
        (1-based; only the robust rule with permanent exclusion depends on it)."""
        if self.threshold == "robust":
            return robust_k(self.round_alpha(round_number) / max(m, 1), m)
        return self.k_value

    def round_alpha(self, round_number: int) -> float:
        """The robust rule's share of α in round ``t``: all of it when an exclusion lasts
        one round or ``spending="none"``; ``6α/(π²t²)`` when it is permanent, so that the
        shares over every round sum to α and one honest outlier round cannot cost a
        client the training."""
        if self.exclusion == "round" or self.spending == "none":
            return self.alpha
        return 6.0 * self.alpha / (math.pi**2 * round_number**2)

    @property
    def k_value(self) -> float:
        """The multiplier ``k`` of the paper's ``τ = mean + k·std`` (``robust``: the
        multiplier for one client, ``z_{1−α}``)."""
        if self.threshold in ("gaussian", "robust", "cusum"):
            return gaussian_k(self.alpha)
        if self.threshold == "chebyshev":
            return chebyshev_k(self.alpha)
        assert self.k is not None
        return float(self.k)

    def _judge(self, state: State, rows: RoundRows) -> Judgement:
        history: dict[int, dict[str, Any]] = state["history"]
        ids, active, pool = rows.ids, rows.active, rows.pool
        p_term, i_term, d_term = self._pid_terms(history, ids, rows.distance)
        u = p_term + i_term + d_term
        columns = {"p_term": p_term, "i_term": i_term, "d_term": d_term}
        none = torch.zeros(len(ids), dtype=torch.bool)
        if self.threshold == "cusum":
            score_z = robust_z(u, pool)
            verdict = cusum_judgement(
                history, ids, score_z, active, pool, drift=self.drift, h=self.h, of="PID score"
            )
            verdict.columns = {**columns, "score_z": score_z, **verdict.columns}
            return verdict
        if not bool(active.any()):
            return Judgement(scores=u, threshold=None, exclude=none, note="", columns=columns)
        tau, note = self._threshold(u[pool], int(state["round"]) + 1)
        return Judgement(
            scores=u, threshold=tau, exclude=above(u, tau, active), note=note, columns=columns
        )

    def _pid_terms(
        self, history: dict[int, dict[str, Any]], ids: list[int], distance: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The P, I and D terms per row: this round's ``distance`` against each id's
        history (a first observation has integral 0 and ``D_{t-1} := D_t``)."""
        seen = torch.tensor([i in history for i in ids], dtype=torch.bool)
        integral = torch.tensor(
            [history[i]["integral"] if i in history else 0.0 for i in ids], dtype=torch.float64
        )
        last = torch.tensor(
            [history[i]["last"] if i in history else math.nan for i in ids], dtype=torch.float64
        )
        last = torch.where(seen, last, distance)  # first observation: D_{t-1} := D_t
        return self.kp * distance, self.ki * integral, self.kd * (distance - last)

    def _threshold(self, u: Tensor, round_number: int) -> tuple[float, str]:
        """τ over the round's scores ``u`` and a note naming the rule and why."""
        m = len(u)
        k = self.k_value_for(m, round_number)
        if self.threshold == "robust":
            median = u.median()
            scale = MAD_TO_STD * float((u - median).abs().median())
            if scale == 0.0:  # over half the scores equal: their mean deviation instead
                scale = float((u - median).abs().mean())
            tau = float(median) + k * scale
            return tau, (
                f"robust threshold median + {k:.3g}·1.4826·MAD (k = z(1 − α_t/m), α_t = "
                f"{self.round_alpha(round_number):.3g} of α = {self.alpha:g} in round "
                f"{round_number}, m = {m}): attackers cannot inflate it as they inflate "
                "mean and std"
            )
        tau = float(u.mean() + k * u.std(correction=0))
        note = f"{self.threshold} threshold mean + {k:.3g}·std (α = {self.alpha:g}, m = {m})"
        if m >= 2 and math.sqrt(m - 1) <= k:
            warnings.warn(
                f"pid_made: with {m} scored clients no score can exceed mean + {k:.4g}·std "
                f"(max z-score is √{m - 1} = {math.sqrt(m - 1):.4g}); nobody will be "
                "excluded. Use threshold='robust', a larger alpha or threshold='k'.",
                UserWarning,
                stacklevel=4,
            )
            note += f": it can exclude nobody among {m} clients (√(m − 1) ≤ k)"
        return tau, note
