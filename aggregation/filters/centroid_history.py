"""What the history-aware filters share (PID-MADE, the distance CUSUM): each round's
distance of every client's update from the round's centroid, a history per client id,
permanent or per-round exclusion, and the optional per-round cut.

Per round, for the submitted rows: ``D^i = ‖Δ^i − μ‖`` with ``μ`` the mean (or geometric
median) of the round's **pool**: the finite rows, banned clients' included or not as the
subclass says (:meth:`counts_banned`). A subclass turns the distances and the
clients' histories into scores, a threshold and the ids to exclude (:meth:`_judge`); this
base records the distances in each id's history, bans the excluded for good when
``exclusion="permanent"`` (Algorithm 1 of PID-MADE: ``Q ← Q \\ A``) and applies the
**round cut** when ``round_cut`` is set: a row whose distance is more than ``round_cut``
robust deviations above the round's median distance (``z = (D − median)/(1.4826·MAD)``)
is left out of its round but not banned. The round cut is a screen of its own name, off
by default: it is not part of the paper's method.

Choices where the paper is silent (all per client id, never per row):

- History lives in the state keyed by client id: the sum of the client's past ``D``
  (integral), its last observed ``D``, how many rounds it was observed and its CUSUM
  statistic. A client not sampled in a round keeps its history untouched.
- An excluded client's ``D`` still enters its history (the history records behaviour,
  not admission).
- Rows with a non-finite entry are never kept, not scored (``nan``) and leave the
  centroid, the threshold statistics and their history untouched (the server's own
  non-finite guard normally drops them earlier, with its own reason). A finite row whose
  distance overflows (``inf``) is treated the same way, though it did enter the centroid
  (distances that overflow in float32 are first recomputed in float64).
- Banned clients that submit anyway are never kept; the ``banned`` column marks them.
  Whether their updates count in the round's statistics is the subclass's choice
  (:meth:`counts_banned`): counted, they are in the pool (the centroid, the robust
  z-scores and the threshold's statistics, as the finite rows of anybody else); left
  out (this base's default, the distance CUSUM's), they are scored against the centroid
  of the others, for the trail, and take no part in any of those statistics.
- Client ``weights`` (sample counts) are ignored: the centroid is unweighted, which also
  denies a client any leverage from claiming a large sample count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aggregation.base import Filter, FilterDecision, check_updates
from registry.constraints import POSITIVE, Interval, Options, allowed, check_fields

State = dict[str, Any]

MAD_TO_STD = 1.4826  # 1 / Φ⁻¹(3/4): the MAD of normal data times this is its std
TIE_RTOL = 1e-12  # u > τ with this relative tolerance: identical scores never split
_CENTROIDS = ("mean", "geometric_median")
_EXCLUSIONS = ("permanent", "round")
_BLOCK_ELEMENTS = 1 << 20  # row blocks of <= 1M entries (4 MB fp32): O(d) extra memory


@dataclass
class Judgement:
    """A subclass's verdict on a round: the score compared with ``threshold``, the rows to
    exclude (banned for good when exclusion is permanent), the note for the trail, the
    per-client columns, and each row's CUSUM statistic to keep (None: keep the old)."""

    scores: Tensor
    threshold: float | None
    exclude: Tensor
    note: str
    columns: dict[str, Tensor] = field(default_factory=dict)
    cusum: Tensor | None = None


@dataclass(frozen=True, eq=False)
class RoundRows:
    """The round's rows as a subclass judges them: each row's client id, its distance from
    the centroid and its robust ``z`` over the ``pool`` rows (those the round's statistics
    are over), and the ``active`` rows (those that may be kept)."""

    ids: list[int]
    distance: Tensor
    z: Tensor
    active: Tensor
    pool: Tensor


@dataclass(frozen=True, kw_only=True)
class CentroidHistoryFilter(Filter):
    """Distances from the round's centroid, a history per client id, exclusion."""

    # an update more than this many robust deviations out is cut that round (None: off)
    round_cut: float | None = field(default=None, metadata=allowed(POSITIVE, None))
    centroid: str = field(default="mean", metadata=allowed(Options(_CENTROIDS)))
    exclusion: str = field(default="permanent", metadata=allowed(Options(_EXCLUSIONS)))
    gm_max_iter: int = field(default=100, metadata=allowed(Interval(int, 1)))
    gm_tol: float = field(default=1e-6, metadata=allowed(POSITIVE))

    name = "filter"  # the registered name: error messages and the trail's reason

    def __post_init__(self) -> None:
        check_fields(self, self.name)

    def init_state(self) -> State:
        """``round``: rounds seen; ``history``: ``{id: {"integral", "last", "rounds",
        "cusum"}}``; ``banned``: sorted ids excluded for good. Plain values only
        (checkpointable)."""
        return {"round": 0, "history": {}, "banned": []}

    @staticmethod
    def banned_ids(state: State) -> frozenset[int]:
        """Ids excluded permanently so far (the server may stop sampling them)."""
        return frozenset(state["banned"])

    def counts_banned(self) -> bool:
        """Whether a banned client's update counts in the round's pool (the centroid, the
        robust z-scores and the threshold's statistics); here never."""
        return False

    def step(
        self,
        state: State,
        updates: Tensor,
        client_ids: Sequence[int],
        weights: Tensor | None = None,
    ) -> tuple[FilterDecision, State]:
        check_updates(updates, weights)
        ids = _distinct_ids(client_ids, updates.shape[0])
        banned_ids = set(state["banned"])
        banned = torch.tensor([i in banned_ids for i in ids], dtype=torch.bool)
        outside = torch.zeros_like(banned) if self.counts_banned() else banned
        distance, finite = self._distances(updates, outside)
        active = finite & ~banned  # the rows that may be kept
        pool = finite & ~outside  # the rows the round's statistics are over
        z = robust_z(distance, pool)
        verdict = self._judge(state, RoundRows(ids, distance, z, active, pool))
        exclude = active & verdict.exclude
        note = verdict.note
        if self.round_cut is not None:  # too far out for one round: left out, not banned
            exclude = exclude | (active & (z > self.round_cut))
            note += (
                f"; round cut: a distance more than {self.round_cut:g} robust deviations "
                "above the median is left out of its round (not banned)"
            )
        decision = FilterDecision(
            keep=(active & ~exclude).to(updates.device),
            reason=self.name,
            scores=verdict.scores,
            threshold=verdict.threshold,
            note=note,
            columns={"distance": distance, **verdict.columns, "z": z, "banned": banned},
        )
        ban = active & verdict.exclude
        return decision, self._next_state(state, ids, distance, finite, ban, verdict.cusum)

    def _judge(self, state: State, rows: RoundRows) -> Judgement:
        """The verdict on the ``active`` rows (those that may be kept), with statistics
        over the ``pool`` rows (``z`` is already over them)."""
        raise NotImplementedError

    def _distances(self, updates: Tensor, outside: Tensor) -> tuple[Tensor, Tensor]:
        """``D`` per row (float64 on the CPU, ``nan`` where not finite) from the centroid of
        the finite rows not ``outside``, and which rows are finite (bool ``(n,)``)."""
        n = updates.shape[0]
        finite, mean_all = _finite_rows(updates)
        pool = finite & ~outside
        distance = torch.full((n,), math.nan, dtype=torch.float64)
        if not bool(pool.any()):
            return distance, finite
        center = self._centroid(updates, pool, mean_all if bool(pool.all()) else None)
        distance = _row_distances(updates, center).to("cpu", torch.float64)
        if not bool(torch.isfinite(distance[finite]).all()):  # overflow in low precision
            distance = _row_distances(updates, center, acc_dtype=torch.float64).to("cpu")
        # a finite row whose distance still overflows is treated as non-finite
        finite &= torch.isfinite(distance)
        distance[~finite] = math.nan
        return distance, finite

    def _next_state(
        self,
        state: State,
        ids: list[int],
        distance: Tensor,
        finite: Tensor,
        ban: Tensor,
        cusum: Tensor | None,
    ) -> State:
        """The state after this round: the finite rows' distances join their ids' history
        (excluded or not); ``ban`` ids are banned when exclusion is permanent."""
        history: dict[int, dict[str, Any]] = state["history"]
        new_history = dict(history)
        for row, i in enumerate(ids):
            if bool(finite[row]):
                old = history.get(i, {"integral": 0.0, "rounds": 0, "cusum": 0.0})
                d = float(distance[row])
                new_history[i] = {
                    "integral": float(old["integral"]) + d,
                    "last": d,
                    "rounds": int(old["rounds"]) + 1,
                    "cusum": float(old.get("cusum", 0.0) if cusum is None else cusum[row]),
                }
        banned = set(state["banned"])
        if self.exclusion == "permanent":
            banned.update(i for i, x in zip(ids, ban.tolist(), strict=True) if x)
        return {"round": int(state["round"]) + 1, "history": new_history, "banned": sorted(banned)}

    def _centroid(self, updates: Tensor, pool: Tensor, mean: Tensor | None) -> Tensor:
        """Centroid of the ``pool`` rows; ``mean`` is given when every row is in it."""
        rows = updates if mean is not None else updates[pool.to(updates.device)]
        if mean is None:
            mean = _mean_rows(rows)
        if self.centroid == "mean":
            return mean
        return _weiszfeld(rows, max_iter=self.gm_max_iter, tol=self.gm_tol, init=mean)


def above(scores: Tensor, threshold: float, active: Tensor) -> Tensor:
    """The active rows whose score exceeds ``threshold`` (with :data:`TIE_RTOL`)."""
    return active & (scores > threshold + TIE_RTOL * abs(threshold))


def cusum_update(
    history: dict[int, dict[str, Any]], ids: list[int], z: Tensor, drift: float, h: float
) -> Tensor:
    """Each id's CUSUM after this round: ``max(0, S + min(z, drift + h) − drift)`` (Page's
    CUSUM: only a ``z`` above ``drift`` adds evidence, one round at most ``h``; ``nan``
    where the row is not scored, whose history keeps the old value)."""
    previous = torch.tensor(
        [float(history[i].get("cusum", 0.0)) if i in history else 0.0 for i in ids],
        dtype=torch.float64,
    )
    step = z.clamp(max=drift + h) - drift
    return (previous + step).clamp(min=0.0)


def cusum_judgement(
    history: dict[int, dict[str, Any]],
    ids: list[int],
    z: Tensor,
    active: Tensor,
    pool: Tensor,
    *,
    drift: float,
    h: float,
    of: str,
) -> Judgement:
    """Page's CUSUM of ``z`` (the robust z-score ``of`` something, over the ``pool`` rows)
    as a verdict on the ``active`` rows: excluded once a client's statistic exceeds ``h``."""
    cusum = cusum_update(history, ids, z, drift, h)
    note = (
        f"cusum of the robust z of the {of} (drift {drift:g}, h {h:g}, m = "
        f"{int(pool.sum())}): excluded once the evidence summed over rounds exceeds h "
        "(one round adds at most h)"
    )
    return Judgement(
        scores=cusum,
        threshold=h,
        exclude=above(cusum, h, active),
        note=note,
        columns={"cusum": cusum},
        cusum=cusum,
    )


# Page's CUSUM: the drift each round's score is lowered by, and the threshold h
DRIFT = allowed(Interval(float, 0))
CUSUM_H = allowed(POSITIVE)


def robust_z(values: Tensor, pool: Tensor) -> Tensor:
    """``(values − median)/(1.4826·MAD)`` with the median and MAD over the ``pool`` rows
    (their mean absolute deviation when over half are equal; 0 when all are); ``nan``
    where a value is not finite."""
    z = torch.full_like(values, math.nan)
    if not bool(pool.any()):
        return z
    scored = values[pool]
    median = scored.median()
    scale = MAD_TO_STD * float((scored - median).abs().median())
    if scale == 0.0:
        scale = float((scored - median).abs().mean())
    finite = torch.isfinite(values)
    z[finite] = (values[finite] - median) / scale if scale > 0 else 0.0
    return z


def _distinct_ids(client_ids: Sequence[int], n: int) -> list[int]:
    """``client_ids`` as ints, checked: one per update row, no duplicates."""
    ids = [int(i) for i in client_ids]
    if len(ids) != n:
        raise ValueError(f"client_ids has {len(ids)} ids for {n} update rows")
    if len(set(ids)) != n:
        raise ValueError(f"client_ids must be distinct, got {ids}")
    return ids


def _finite_rows(updates: Tensor) -> tuple[Tensor, Tensor | None]:
    """Bool ``(n,)`` on the CPU: rows without ``nan``/``inf``; and the mean of the rows when
    all are finite. A non-finite entry anywhere makes the column mean non-finite: one O(d)
    check on the mean spares the O(n·d) row scan in the common, all-finite case."""
    mean_all = _mean_rows(updates)
    if bool(torch.isfinite(mean_all).all()):
        return torch.ones(updates.shape[0], dtype=torch.bool), mean_all
    return _row_finite(updates).cpu(), None


def _mean_rows(points: Tensor) -> Tensor:
    """Mean of the rows as one matrix-vector product (a single pass over the rows, much
    faster on CPU than the strided ``points.mean(dim=0)``)."""
    n = points.shape[0]
    return torch.full((n,), 1.0 / n, device=points.device, dtype=points.dtype) @ points


def _row_distances(
    points: Tensor, center: Tensor, *, acc_dtype: torch.dtype | None = None
) -> Tensor:
    """``‖points[i] − center‖`` for every row, through one reused block buffer (no
    ``(n, d)`` temporary), accumulated in ``acc_dtype`` (default: the points' dtype).
    A row with ``nan``/``inf`` gets a non-finite distance."""
    n, d = points.shape
    block = min(n, max(1, _BLOCK_ELEMENTS // max(d, 1)))
    out = torch.empty(n, device=points.device, dtype=acc_dtype or points.dtype)
    buffer = torch.empty((block, d), device=points.device, dtype=points.dtype)
    for start in range(0, n, block):
        stop = min(start + block, n)
        diff = buffer[: stop - start]
        torch.sub(points[start:stop], center, out=diff)
        out[start:stop] = torch.linalg.vector_norm(diff, dim=1, dtype=acc_dtype)
    return out


def _row_finite(points: Tensor) -> Tensor:
    """Bool ``(n,)``: rows without ``nan``/``inf``, in row blocks (no ``(n, d)`` temporary)."""
    n, d = points.shape
    block = max(1, _BLOCK_ELEMENTS // max(d, 1))
    out = torch.empty(n, device=points.device, dtype=torch.bool)
    for start in range(0, n, block):
        out[start : start + block] = torch.isfinite(points[start : start + block]).all(dim=1)
    return out


def _weiszfeld(points: Tensor, *, max_iter: int, tol: float, init: Tensor | None = None) -> Tensor:
    """Geometric median ``argmin_y Σ ‖x_i − y‖`` by smoothed Weiszfeld iterations (as in
    RFA, Pillutla et al. 2022), from the mean, until the objective improves by less than
    ``tol`` relative. O(n·d) per iteration."""
    center = _mean_rows(points) if init is None else init
    dist = _row_distances(points, center)
    objective = float(dist.sum())
    for _ in range(max_iter):
        nu = 1e-12 + 1e-9 * objective / points.shape[0]
        w = 1.0 / dist.clamp_min(nu)
        center = (w / w.sum()) @ points
        dist = _row_distances(points, center)
        new_objective = float(dist.sum())
        done = objective - new_objective <= tol * new_objective
        objective = new_objective
        if done:
            break
    return center
