"""Contracts shared by every aggregation rule, pre-aggregator and filter.

An aggregation rule maps stacked client updates ``(n_clients, n_params)`` and optional
client weights ``(n_clients,)`` to one update ``(n_params,)``. Every rule exposes the
same calls, so the server loop never needs to know which kind it holds:

- ``init_state() -> dict``: the rule's memory (empty for stateless rules). Holds only
  tensors and plain Python values so it can be checkpointed with
  ``torch.save``/``torch.load(weights_only=True)``.
- ``step(state, updates, weights, *, client_ids=None, reference=None, oracle=None,
  local_norms=None, losses=None) -> (result, new_state, diagnostics)``: one round. Never mutates ``state`` in place.
- ``__call__(updates, weights=None, **same keywords) -> result``: a ``step`` from a fresh
  state.

Rows holding NaN or Inf (or a non-finite weight) are dropped by ``step`` itself before
the rule sees them (as :func:`drop_non_finite` does for the server) and listed in
``diagnostics["dropped_non_finite"]`` (input rows, only when some were dropped); every
per-client diagnostic stays indexed by the caller's rows. All rows non-finite raises.

Round inputs beyond the updates, for the rules whose class says so:

- ``requires_oracle`` (Zeno): ``oracle`` maps candidate updates ``(k, d)`` to the loss
  on a server batch after applying each, ``(k,)`` (see ``aggregation.zeno``);
- ``requires_reference`` (FLTrust, MoNNA anchored on the server): ``reference`` is the
  server's own update ``(d,)`` from its root data, made the way clients make theirs;
- ``requires_client_ids`` (FoolsGold): ``client_ids`` are the stable ids of the rows
  (n distinct ints), which key the rule's per-client history. Any rule accepts them.
- ``requires_local_norms`` (FedNova): ``local_norms`` ``(n,)`` are ‖a_i‖₁, how much
  local work each row's client did (its SGD steps, discounted by momentum and the
  proximal term; :func:`aggregation.fednova.local_norm`), all > 0.
- ``requires_losses`` (AFL): ``losses`` ``(n,)`` are each row's client's loss of the
  round's global model on its own training data, all finite.

Diagnostics (a plain dict, for the exclusion trail). Every registered rule returns:

- ``"effective_weight"``: float64 ``(n,)`` on the CPU, the weight each client effectively
  received in the result (each rule's docstring says how it is defined; for rules that
  output a weighted mean of the rows, ``effective_weight @ updates == result``);
- ``"columns"``: ``dict[str, Tensor]`` of further per-client float64 ``(n,)`` values
  (Krum scores, clip factors, trimmed shares, trust scores, ...);
- ``"selected"`` (selection rules only): LongTensor of the chosen rows, ascending;
- rule-specific scalars (iterations, base loss, ...).

A pre-aggregator transforms the stacked updates before any rule (ByzFL's sense):
``step(state, updates, weights=None, *, generator=None) -> (PreAggregation, new_state)``,
whose ``mixing`` matrix ``(m, n)`` says how each output row is made from the input rows
(``rows == mixing @ updates``), so every effect can be traced back to the clients.

A filter runs in front of any aggregator and decides which clients to keep:
``step(state, updates, client_ids, weights) -> (FilterDecision, new_state)``. Client
history is keyed by ``client_ids`` (stable ids), never by the row order of ``updates``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from registry.constraints import Interval, check, check_fields

__all__ = [
    "AggregationRule",
    "Diagnostics",
    "Filter",
    "FilterDecision",
    "Oracle",
    "PreAggregation",
    "PreAggregator",
    "RoundInputs",
    "RoundSeededRule",
    "ServerOptimizer",
    "SiteLosses",
    "TolerantPreAggregator",
    "Validate",
    "check_int",
    "check_minority",
    "check_updates",
    "drop_non_finite",
    "normalised_weights",
    "on_caller_rows",
    "required",
    "row_mean",
]

State = dict[str, Any]
Diagnostics = dict[str, Any]
Weights = Tensor | None
Rng = torch.Generator | None
# Maps candidate updates (k, d) to the server-batch loss after applying each one, (k,).
Oracle = Callable[[Tensor], Tensor]


def check_updates(updates: Tensor, weights: Tensor | None) -> None:
    """Validate shapes of a rule's inputs (a programming error, not a data condition)."""
    if updates.ndim != 2:
        raise ValueError(
            f"updates must be 2-D (n_clients, n_params), got shape {tuple(updates.shape)}"
        )
    if updates.shape[0] == 0:
        raise ValueError("updates holds no clients (n_clients = 0)")
    if weights is not None and weights.shape != (updates.shape[0],):
        raise ValueError(
            f"weights must have shape ({updates.shape[0]},) to match updates, got {tuple(weights.shape)}"
        )


def check_int(name: str, value: Any, minimum: int) -> None:
    """Raise unless ``value`` is an int (not a bool) >= ``minimum`` (a hyperparameter check)."""
    check(name, value, (Interval(int, minimum),))


def check_minority(rule: str, n: int, f: int) -> None:
    """Raise unless ``n > 2f``: the f tolerated Byzantine clients are a minority."""
    if n <= 2 * f:
        raise ValueError(
            f"{rule} with f={f} needs n_clients > 2f = {2 * f} (a Byzantine minority), got "
            f"{n} clients: lower f or wait for more clients"
        )


def normalised_weights(updates: Tensor, weights: Tensor | None) -> Tensor:
    """Client weights as a probability vector on the updates' device and dtype (equal when None)."""
    n = updates.shape[0]
    if weights is None:
        return torch.full((n,), 1.0 / n, device=updates.device, dtype=updates.dtype)
    w = weights.to(device=updates.device, dtype=updates.dtype)
    if bool((w < 0).any()) or not bool(torch.isfinite(w).all()):
        raise ValueError("weights must be finite and non-negative")
    total = w.sum()
    if float(total) <= 0:
        raise ValueError("weights sum to zero")
    return w / total


def drop_non_finite(
    updates: Tensor, weights: Tensor | None
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Remove the clients whose update (or weight) holds a NaN or an Inf.

    Returns ``(updates, weights, keep)`` with ``keep`` a bool ``(n_clients,)`` mask on the
    updates' device (True = kept; record the others with reason ``non_finite``). When every
    client is kept the inputs are returned as they are (no copy). A NaN or an Inf makes
    its row's sum non-finite, so only rows whose sum is not finite (those, or finite rows
    whose sum overflows) are checked element by element: one reduction, no O(n·d) mask.
    """
    check_updates(updates, weights)
    keep = torch.isfinite(updates.sum(dim=1))
    for row in (~keep).nonzero().flatten().tolist():
        keep[row] = bool(torch.isfinite(updates[row]).all())
    if weights is not None:
        keep &= torch.isfinite(weights).to(updates.device)
    if bool(keep.all()):
        return updates, weights, keep
    kept_weights = None if weights is None else weights[keep.to(weights.device)]
    return updates[keep], kept_weights, keep


def row_mean(updates: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """``(mean of updates[rows], coefficients)``: the unweighted mean of the chosen rows as
    a matrix-vector product (no row copies) and its coefficients, float64 ``(n,)`` on the
    CPU (1/len(rows) on the chosen rows, 0 elsewhere): the rows' effective weights."""
    coefficients = torch.zeros(updates.shape[0], dtype=torch.float64)
    coefficients[rows.cpu()] = 1.0 / rows.numel()
    return coefficients.to(updates) @ updates, coefficients


@dataclass(frozen=True)
class RoundInputs:
    """What the server knows beyond the updates, each ``None`` when not given (see the
    module docstring for who needs which)."""

    client_ids: tuple[int, ...] | None = None
    reference: Tensor | None = None
    oracle: Oracle | None = None
    local_norms: Tensor | None = None
    losses: Tensor | None = None

    @classmethod
    def checked(
        cls,
        updates: Tensor,
        client_ids: Sequence[int] | None,
        reference: Tensor | None,
        oracle: Oracle | None,
        local_norms: Tensor | None = None,
        losses: Tensor | None = None,
    ) -> RoundInputs:
        n, d = updates.shape
        ids = None
        if client_ids is not None:
            ids = tuple(int(i) for i in client_ids)
            if len(ids) != n or len(set(ids)) != n:
                raise ValueError(
                    f"client_ids must be {n} distinct ids, one per row of updates, got {len(ids)} "
                    f"({len(set(ids))} distinct)"
                )
        if reference is not None:
            if reference.shape != (d,):
                raise ValueError(
                    f"reference must have shape ({d},) like one row of updates, got "
                    f"{tuple(reference.shape)}"
                )
            if not bool(torch.isfinite(reference).all()):
                raise ValueError("reference (the server's update) holds NaN or Inf")
        if local_norms is not None:
            local_norms = torch.as_tensor(local_norms, dtype=torch.float64).cpu()
            if local_norms.shape != (n,) or not bool((local_norms > 0).all()):
                raise ValueError(
                    f"local_norms must be {n} positive numbers, one per row of updates, got "
                    f"{local_norms.tolist()}"
                )
        if losses is not None:
            losses = torch.as_tensor(losses, dtype=torch.float64).cpu()
            if losses.shape != (n,) or not bool(torch.isfinite(losses).all()):
                raise ValueError(
                    f"losses must be {n} finite numbers, one per row of updates, got "
                    f"{losses.tolist()}"
                )
        return cls(
            client_ids=ids, reference=reference, oracle=oracle, local_norms=local_norms,
            losses=losses,
        )  # fmt: skip

    def rows(self, positions: list[int]) -> RoundInputs:
        """The inputs for a subset of the rows (the reference and oracle are shared)."""
        ids = None if self.client_ids is None else tuple(self.client_ids[p] for p in positions)
        norms = None if self.local_norms is None else self.local_norms[positions]
        losses = None if self.losses is None else self.losses[positions]
        return RoundInputs(
            client_ids=ids, reference=self.reference, oracle=self.oracle, local_norms=norms,
            losses=losses,
        )  # fmt: skip


def required(value: Any, rule: str, keyword: str, meaning: str) -> Any:
    """``value`` if given; else a TypeError saying how the server passes it to ``rule``."""
    if value is None:
        raise TypeError(
            f"{rule} needs {keyword}: call step(state, updates, weights, {keyword}=...) from "
            f"the server loop, with {meaning}"
        )
    return value


def on_caller_rows(values: Tensor, positions: Tensor, n: int, fill: float) -> Tensor:
    """Per-row values of the kept rows ``positions`` spread over the caller's ``n`` rows
    as float64 on the CPU, ``fill`` for the dropped rows."""
    out = torch.full((n,), fill, dtype=torch.float64)
    out[positions] = torch.as_tensor(values).to("cpu", torch.float64)
    return out


def _dropped(positions: Tensor, n: int) -> Tensor:
    dropped = torch.ones(n, dtype=torch.bool)
    dropped[positions] = False
    return dropped.nonzero().flatten()


def _diagnostics_on_caller_rows(diagnostics: Diagnostics, positions: Tensor, n: int) -> Diagnostics:
    """Per-client diagnostics of the kept rows re-indexed by the caller's ``n`` rows:
    effective weight 0 and columns NaN for the dropped rows, ``selected`` mapped."""
    out = dict(diagnostics)
    if "effective_weight" in out:
        out["effective_weight"] = on_caller_rows(out["effective_weight"], positions, n, 0.0)
    if "columns" in out:
        out["columns"] = {
            name: on_caller_rows(values, positions, n, torch.nan)
            for name, values in out["columns"].items()
        }
    if "selected" in out:
        out["selected"] = positions[torch.as_tensor(out["selected"]).cpu()]
    out["dropped_non_finite"] = _dropped(positions, n)
    return out


def _finite_rows(
    updates: Tensor, weights: Tensor | None, what: str
) -> tuple[Tensor, Tensor | None, Tensor]:
    """``drop_non_finite`` plus the kept positions (CPU long); raises if none is left."""
    kept, kept_weights, keep = drop_non_finite(updates, weights)
    positions = keep.nonzero().flatten().cpu()
    if positions.numel() == 0:
        raise ValueError(
            f"every one of the {updates.shape[0]} updates (or its weight) holds NaN or Inf: "
            f"{what} has nothing to work on"
        )
    return kept, kept_weights, positions


class AggregationRule:
    """Base for rules. Stateless rules implement :meth:`aggregate`; stateful ones (or
    those using round inputs) :meth:`advance`. Subclasses are frozen dataclasses holding
    only hyperparameters, validated in ``__post_init__``."""

    requires_oracle: ClassVar[bool] = False
    requires_reference: ClassVar[bool] = False
    requires_client_ids: ClassVar[bool] = False
    requires_local_norms: ClassVar[bool] = False
    requires_losses: ClassVar[bool] = False

    def init_state(self) -> State:
        return {}

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, Diagnostics]:
        """Return ``(result, diagnostics)`` for one round. Override in stateless rules."""
        raise NotImplementedError

    def advance(
        self, state: State, updates: Tensor, weights: Tensor | None, inputs: RoundInputs
    ) -> tuple[Tensor, State, Diagnostics]:
        """One round on finite rows; override in rules with memory or round inputs."""
        result, diagnostics = self.aggregate(updates, weights)
        return result, state, diagnostics

    def step(
        self,
        state: State,
        updates: Tensor,
        weights: Tensor | None = None,
        *,
        client_ids: Sequence[int] | None = None,
        reference: Tensor | None = None,
        oracle: Oracle | None = None,
        local_norms: Tensor | None = None,
        losses: Tensor | None = None,
    ) -> tuple[Tensor, State, Diagnostics]:
        check_updates(updates, weights)
        inputs = RoundInputs.checked(updates, client_ids, reference, oracle, local_norms, losses)
        kept, kept_weights, positions = _finite_rows(updates, weights, type(self).__name__)
        n = updates.shape[0]
        if positions.numel() == n:
            return self.advance(state, updates, weights, inputs)
        result, new_state, diagnostics = self.advance(
            state, kept, kept_weights, inputs.rows(positions.tolist())
        )
        return result, new_state, _diagnostics_on_caller_rows(diagnostics, positions, n)

    def __call__(
        self,
        updates: Tensor,
        weights: Tensor | None = None,
        *,
        client_ids: Sequence[int] | None = None,
        reference: Tensor | None = None,
        oracle: Oracle | None = None,
        local_norms: Tensor | None = None,
        losses: Tensor | None = None,
    ) -> Tensor:
        result, _, _ = self.step(
            self.init_state(),
            updates,
            weights,
            client_ids=client_ids,
            reference=reference,
            oracle=oracle,
            local_norms=local_norms,
            losses=losses,
        )
        return result


class RoundSeededRule(AggregationRule):
    """Base for rules whose random draws are seeded by their ``seed`` field and the round:
    the state counts the rounds (``{"round": r}``, from 0), so a resumed run draws what an
    unbroken one would. Subclasses are frozen dataclasses; their fields are checked here."""

    def __post_init__(self) -> None:
        check_fields(self)

    def init_state(self) -> State:
        return {"round": 0}

    def advance(
        self, state: State, updates: Tensor, weights: Tensor | None, inputs: RoundInputs
    ) -> tuple[Tensor, State, Diagnostics]:
        round_ = int(state.get("round", 0))
        result, diagnostics = self.advance_round(round_, updates, weights, inputs)
        return result, {"round": round_ + 1}, diagnostics

    def advance_round(
        self, round_: int, updates: Tensor, weights: Tensor | None, inputs: RoundInputs
    ) -> tuple[Tensor, Diagnostics]:
        """Round ``round_`` on finite rows: the result and its diagnostics."""
        raise NotImplementedError


@dataclass
class PreAggregation:
    """What a pre-aggregator made of the ``n`` input rows this round.

    ``rows`` ``(m, d)``: the transformed updates handed on (to the next pre-aggregator or
    the rule); ``weights`` ``(m,)`` their client weights (None when none came in);
    ``mixing`` float64 ``(m, n)`` on the CPU with ``rows == mixing @ updates`` (zero
    columns for dropped rows); ``row_of`` long ``(m,)``: the input row each output row
    stands for, or None when output rows mix clients into new entities (buckets);
    ``columns``: per-input-row float64 ``(n,)`` values for the trail (clip factor, bucket,
    ...; NaN for dropped rows); ``info``: scalars of the round (e.g. ARC's threshold);
    ``dropped_non_finite``: input rows holding NaN or Inf.
    """

    rows: Tensor
    weights: Tensor | None
    mixing: Tensor
    row_of: Tensor | None
    columns: dict[str, Tensor] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    dropped_non_finite: Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))


Transformed = tuple[PreAggregation, State]


class PreAggregator:
    """Base for pre-aggregators. Subclasses are frozen dataclasses of hyperparameters and
    implement :meth:`transform` on finite rows; :meth:`step` drops non-finite rows first.

    ``keeps_rows``: True when output row i is a transformed input row i (clipping, ARC,
    NNM), so client ids and weights carry over; False when rows are regrouped (Bucketing).
    """

    keeps_rows: ClassVar[bool] = True

    def init_state(self) -> State:
        return {}

    def transform(self, state: State, updates: Tensor, weights: Weights, rng: Rng) -> Transformed:
        """One round on finite ``updates`` (indices in the result refer to its rows);
        ``rng`` is the generator passed to :meth:`step`."""
        raise NotImplementedError

    def step(
        self,
        state: State,
        updates: Tensor,
        weights: Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> tuple[PreAggregation, State]:
        check_updates(updates, weights)
        kept, kept_weights, positions = _finite_rows(updates, weights, type(self).__name__)
        done, new_state = self.transform(state, kept, kept_weights, generator)
        n = updates.shape[0]
        if positions.numel() == n:
            return done, new_state
        mixing = torch.zeros(done.mixing.shape[0], n, dtype=torch.float64)
        mixing[:, positions] = done.mixing
        result = PreAggregation(
            rows=done.rows,
            weights=done.weights,
            mixing=mixing,
            row_of=None if done.row_of is None else positions[done.row_of],
            columns={
                name: on_caller_rows(values, positions, n, torch.nan)
                for name, values in done.columns.items()
            },
            info=done.info,
            dropped_non_finite=_dropped(positions, n),
        )
        return result, new_state


@dataclass(frozen=True, kw_only=True)
class TolerantPreAggregator(PreAggregator):
    """A pre-aggregator built for ``f`` Byzantine clients; each round checks ``n > 2f``
    (call :meth:`check_clients`) before its transform."""

    f: int = 0  # number of Byzantine clients tolerated

    def __post_init__(self) -> None:
        check_int("f", self.f, 0)

    def check_clients(self, name: str, updates: Tensor) -> int:
        """The number of rows n, after checking ``n > 2f`` for the pre-aggregator ``name``."""
        check_minority(name, updates.shape[0], self.f)
        return updates.shape[0]


@dataclass
class FilterDecision:
    """What a filter decided this round, per submitted client (rows of ``updates``).

    ``keep``: bool ``(n_clients,)``; ``scores``: the statistic compared to ``threshold``
    (None when the filter has no scalar score); ``reason``: the exclusion reason recorded
    in the trail for dropped clients; ``columns``: further per-client values for the trail
    (e.g. PID-MADE's distance and P/I/D terms), each a tensor ``(n_clients,)``; ``note``:
    how the threshold was chosen, written beside each exclusion in the trail.
    """

    keep: Tensor
    reason: str
    scores: Tensor | None = None
    threshold: float | None = None
    columns: dict[str, Tensor] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class SiteLosses:
    """Each answering site's mean loss of each candidate model on its own held-out split:
    ``sites`` (m ids), their held-out ``counts`` ``(m,)`` and ``losses`` ``(m, k)``, float64
    on the CPU (candidate order as asked). Only these numbers come back from a site."""

    sites: tuple[int, ...]
    counts: Tensor
    losses: Tensor


# (candidate updates (k, d), the site ids to ask) -> each site's held-out loss of the
# model each candidate makes (the sites that answered).
Validate = Callable[[Tensor, Sequence[int]], SiteLosses]


class Filter:
    """Base for filters (exclusion steps in front of an aggregator). A filter whose class
    sets ``requires_validation`` is given ``validate`` (:data:`Validate`) in ``step``: the
    sites' losses of candidate updates on their own held-out splits."""

    requires_validation: ClassVar[bool] = False

    def init_state(self) -> State:
        return {}

    def cannot_exclude(self, clients: int) -> str | None:
        """Why this filter can exclude nobody among ``clients`` clients a round, whatever
        they send (None when it can): a run says so in one line when it starts."""
        return None

    def step(
        self,
        state: State,
        updates: Tensor,
        client_ids: Sequence[int],
        weights: Tensor | None = None,
    ) -> tuple[FilterDecision, State]:
        raise NotImplementedError


@dataclass(kw_only=True)
class ServerOptimizer:
    """Base of the server optimizers (:mod:`aggregation.server_optimizers`): what the
    server does with a rule's aggregate. Checks its hyperparameters when built and keeps
    its state (``step``, and the moment tensors once a step made them) in the open, as
    torch optimizers do."""

    state: dict[str, Any] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        check_fields(self)
        self.load_state_dict({})

    def step(self, weights: Tensor, delta: Tensor) -> Tensor:
        """The next global weights from ``weights`` and the round's aggregate ``delta``."""
        new_weights, self.state = self._update(weights, delta, self.state)
        return new_weights

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's memory (its tensors are never changed in place: a saved dict
        stays as it was)."""
        return dict(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (an empty dict: a fresh optimizer)."""
        self.state = {"step": 0, **state}

    def _update(
        self, weights: Tensor, delta: Tensor, state: dict[str, Any]
    ) -> tuple[Tensor, dict[str, Any]]:
        raise NotImplementedError
