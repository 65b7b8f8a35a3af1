"""The server loop: sample clients, train them, screen their updates, aggregate, evaluate.

All memory lives in :class:`ServerState` (the global model vector, the aggregator's and
filters' states, the per-round metrics and the exclusion trail), which
:meth:`ServerState.to_dict` turns into tensors and plain values for a checkpoint that
``torch.load(weights_only=True)`` reads back. Random draws come from seeds derived from
(run seed, round, client), so a resumed run is identical to an uninterrupted one.

Screening order in a round, each dropped client recorded in the trail with its reason:
1. ``client_error``: local training raised; the round goes on with the rest.
2. ``non_finite``: the update holds NaN or Inf; it can never reach the global model.
3. filters (e.g. ``pid_made``), in the configured order.
4. the aggregation rule (selection rules report their implicit choice as ``not_selected``).
A round with fewer than ``min_clients`` survivors is skipped: the global model is kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from aggregation.base import AggregationRule, Filter
from federated.client import ClientData, ClientUpdate, LocalTraining, train_client
from federated.metrics import evaluate, loss_function
from federated.seeding import SAMPLING, SHUFFLE, derive_seed
from federated.vectors import model_to_vector, vector_to_model_

__all__ = ["Federation", "FederationConfig", "RoundReport", "ServerState"]

# Called with (round, client updates (n, d), malicious mask (n,), seed) -> attacked updates.
UpdateAttack = Callable[[int, Tensor, Tensor, int], Tensor]


@dataclass(frozen=True, kw_only=True)
class FederationConfig:
    rounds: int
    client_fraction: float = 1.0  # share of clients sampled per round
    server_lr: float = 1.0  # global += server_lr * aggregated update
    min_clients: int = 1  # fewer survivors than this: the round is skipped
    seed: int = 0
    eval_batch_size: int = 512

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if not 0 < self.client_fraction <= 1:
            raise ValueError(f"client_fraction must be in (0, 1], got {self.client_fraction}")
        if self.server_lr <= 0 or self.min_clients < 1:
            raise ValueError("server_lr must be > 0 and min_clients >= 1")


@dataclass
class ServerState:
    """Everything a round needs from the past; ``round`` counts completed rounds."""

    round: int
    global_vector: Tensor
    aggregator_state: dict[str, Any]
    filter_states: list[dict[str, Any]]
    history: list[dict[str, float]] = field(default_factory=list)
    trail: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "global_vector": self.global_vector.detach().cpu(),
            "aggregator_state": self.aggregator_state,
            "filter_states": self.filter_states,
            "history": self.history,
            "trail": self.trail,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], device: torch.device | str = "cpu") -> ServerState:
        return cls(
            round=int(data["round"]),
            global_vector=data["global_vector"].to(device),
            aggregator_state=data["aggregator_state"],
            filter_states=list(data["filter_states"]),
            history=list(data["history"]),
            trail=list(data["trail"]),
        )


@dataclass(frozen=True)
class RoundReport:
    round: int  # 1-based
    metrics: dict[str, float]
    clients: list[dict[str, Any]]  # this round's exclusion-trail rows


class Federation:
    """The static parts of a federation (model workspace, clients, rule, filters, test set)
    and the round step over an explicit :class:`ServerState`."""

    def __init__(
        self,
        *,
        model: nn.Module,
        clients: Sequence[ClientData],
        test: tuple[Tensor, Tensor],
        rule: AggregationRule,
        filters: Sequence[Filter] = (),
        local: LocalTraining,
        config: FederationConfig,
        multi_label: bool = False,
        malicious: frozenset[int] = frozenset(),
        update_attack: UpdateAttack | None = None,
    ) -> None:
        if not clients:
            raise ValueError("a federation needs at least one client")
        self.model = model
        self.clients = list(clients)
        self.test = test
        self.rule = rule
        self.filters = list(filters)
        self.local = local
        self.config = config
        self.multi_label = multi_label
        self.malicious = malicious
        self.update_attack = update_attack
        self.loss_fn = loss_function(multi_label)

    @property
    def device(self) -> torch.device:
        return self.test[0].device

    def initial_state(self) -> ServerState:
        return ServerState(
            round=0,
            global_vector=model_to_vector(self.model).to(self.device),
            aggregator_state=self.rule.init_state(),
            filter_states=[f.init_state() for f in self.filters],
        )

    def sample_clients(self, round_number: int) -> list[int]:
        """Seeded choice of ``ceil(fraction * n)`` client positions for a round."""
        n = len(self.clients)
        k = max(1, math.ceil(self.config.client_fraction * n - 1e-9))
        if k == n:
            return list(range(n))
        rng = np.random.default_rng(derive_seed(self.config.seed, round_number, SAMPLING))
        return sorted(int(i) for i in rng.choice(n, size=k, replace=False))

    def global_model(self, state: ServerState) -> nn.Module:
        """The workspace model holding the state's global weights (eval mode)."""
        vector_to_model_(self.model, state.global_vector)
        return self.model.eval()

    def evaluate(self, state: ServerState) -> dict[str, float]:
        model = self.global_model(state)
        return evaluate(
            model, *self.test, multi_label=self.multi_label, batch_size=self.config.eval_batch_size
        )

    def run_round(self, state: ServerState) -> tuple[ServerState, RoundReport]:
        round_number = state.round + 1
        rows: dict[int, dict[str, Any]] = {}
        updates: list[ClientUpdate] = []
        for position in self.sample_clients(round_number):
            client = self.clients[position]
            row = {
                "round": round_number,
                "client": client.client_id,
                "num_samples": len(client),
                "malicious": client.client_id in self.malicious,
                "excluded": False,
                "reason": "",
                "message": "",
            }
            rows[client.client_id] = row
            try:
                update = train_client(
                    self.model,
                    state.global_vector,
                    client,
                    self.local,
                    self.loss_fn,
                    seed=derive_seed(self.config.seed, round_number, client.client_id, SHUFFLE),
                )
            except Exception as error:  # a broken client must not stop the federation
                row.update(
                    excluded=True, reason="client_error", message=f"{type(error).__name__}: {error}"
                )
                continue
            row["train_loss"] = update.train_loss
            updates.append(update)

        ids = [u.client_id for u in updates]
        new_global = state.global_vector
        aggregator_state, filter_states = state.aggregator_state, list(state.filter_states)
        kept_ids: list[int] = []
        if updates:
            stacked = torch.stack([u.delta for u in updates])  # (n, d)
            weights = torch.tensor(
                [float(u.num_samples) for u in updates], device=stacked.device, dtype=stacked.dtype
            )
            if self.update_attack is not None and self.malicious:
                mask = torch.tensor([i in self.malicious for i in ids], device=stacked.device)
                if bool(mask.any()):
                    stacked = self.update_attack(
                        round_number, stacked, mask, derive_seed(self.config.seed, round_number)
                    )
            keep = torch.isfinite(stacked).all(dim=1)
            for client_id, finite in zip(ids, keep.tolist(), strict=True):
                if not finite:
                    rows[client_id].update(excluded=True, reason="non_finite")
            for index, (flt, flt_state) in enumerate(zip(self.filters, filter_states, strict=True)):
                positions = keep.nonzero().flatten()
                if len(positions) == 0:
                    break
                decision, filter_states[index] = flt.step(
                    flt_state,
                    stacked[positions],
                    [ids[p] for p in positions.tolist()],
                    weights[positions],
                )
                for row_index, position in enumerate(positions.tolist()):
                    row = rows[ids[position]]
                    if decision.scores is not None:
                        row["score"] = float(decision.scores[row_index])
                    if decision.threshold is not None:
                        row["threshold"] = float(decision.threshold)
                    for name, column in decision.columns.items():
                        row[name] = float(column[row_index])
                    if not bool(decision.keep[row_index]):
                        row.update(excluded=True, reason=decision.reason)
                        keep[position] = False
            positions = keep.nonzero().flatten()
            kept_ids = [ids[p] for p in positions.tolist()]
            if len(kept_ids) >= self.config.min_clients:
                aggregate, aggregator_state, diagnostics = self.rule.step(
                    state.aggregator_state, stacked[positions], weights[positions]
                )
                selected = diagnostics.get("selected")
                if selected is not None:
                    chosen = {kept_ids[i] for i in torch.as_tensor(selected).tolist()}
                    for client_id in kept_ids:
                        rows[client_id]["selected"] = client_id in chosen
                new_global = state.global_vector + self.config.server_lr * aggregate.to(
                    state.global_vector.dtype
                )

        skipped = len(kept_ids) < self.config.min_clients
        new_state = ServerState(
            round=round_number,
            global_vector=new_global,
            aggregator_state=aggregator_state,
            filter_states=filter_states,
            history=list(state.history),
            trail=list(state.trail),
        )
        metrics = {f"test_{k}": v for k, v in self.evaluate(new_state).items()}
        losses = [u.train_loss for u in updates]
        metrics.update(
            round=float(round_number),
            clients_sampled=float(len(rows)),
            clients_kept=float(0 if skipped else len(kept_ids)),
            clients_excluded=float(sum(r["excluded"] for r in rows.values())),
            round_skipped=float(skipped),
            client_loss_mean=float(np.mean(losses)) if losses else math.nan,
        )
        trail_rows = list(rows.values())
        new_state.history.append(metrics)
        new_state.trail.extend(trail_rows)
        return new_state, RoundReport(round=round_number, metrics=metrics, clients=trail_rows)
