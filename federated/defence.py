"""The server's side of a round once the updates are in: the model attack applied to the
malicious clients' rows, local DP's noise on behalf of the clients simulated here, the
non-finite rows dropped, the filters, the pre-aggregators and the rule
(:mod:`aggregation.defence`), DP-FedAvg's clipping and release, and the server
optimizer's step on the released aggregate (its state loaded from the round's
:class:`~federated.parts.ServerState` and handed back, never kept between rounds).

:class:`RoundDefence` is given what it needs (the defence, the threat model, the run's
seed and server settings, the workspace model for Zeno's oracle and FLTrust's reference)
and works on a :class:`~federated.parts.ServerState` it never advances: it returns an
:class:`Aggregation`, and the round builds the next state from it. The optimising
attacks see the same defence through :meth:`RoundDefence._simulated_defence`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from aggregation.base import SiteLosses, Validate, drop_non_finite
from aggregation.defence import Rows, RuleOutcome, run_filters, run_rule
from aggregation.fednova import local_norm
from aggregation.mean import FedAvg
from federated.client import ClientUpdate, LocalTraining, train_client
from federated.execution import SiteValidator
from federated.parts import Defence, FederationConfig, ServerState, ThreatModel
from federated.seeding import ATTACK, PREAGGREGATION, PRIVACY, SHUFFLE, derive_seed, torch_generator
from federated.trail import TrailRows, record_decisions, record_filter_steps, sent_update
from federated.vectors import vector_to_model_

__all__ = ["Aggregation", "RoundDefence"]


@dataclass
class Aggregation:
    """What aggregating a round produced: the next global vector, the rule's and the
    filters' states, and the ids of the clients that reached the rule."""

    global_vector: Tensor
    aggregator_state: dict[str, Any]
    filter_states: list[dict[str, Any]]
    kept_ids: list[int]
    preaggregator_states: list[dict[str, Any]] = field(default_factory=list)
    attack_state: dict[str, Any] = field(default_factory=dict)
    attack_metrics: dict[str, float] = field(default_factory=dict)
    server_optimizer_state: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class RoundDefence:
    """What the server makes of a round's updates. ``model`` is the federation's workspace
    (the oracle and the reference load weights into it); ``held_here``: the ids of the
    clients simulated in this process (local DP noises their rows on their behalf)."""

    defence: Defence
    threat: ThreatModel
    config: FederationConfig
    model: nn.Module
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    local: LocalTraining | None  # trains the root data's reference update (FLTrust)
    held_here: frozenset[int]
    validator: SiteValidator | None = None  # the sites that score candidates (site_validation)

    def aggregate(
        self,
        state: ServerState,
        round_number: int,
        updates: list[ClientUpdate],
        rows: TrailRows,
    ) -> Aggregation:
        """Attack, drop non-finite rows, filter, aggregate: the new global vector, the
        rule's, filters' and attack's states and the ids that reached the rule."""
        outcome = Aggregation(
            state.global_vector, state.aggregator_state, list(state.filter_states), [],
            preaggregator_states=list(state.preaggregator_states),
            attack_state=state.attack_state,
            server_optimizer_state=state.server_optimizer_state,
        )  # fmt: skip
        if not updates:
            return outcome
        ids = [u.client_id for u in updates]
        stacked = torch.stack([u.delta for u in updates])
        weights = torch.tensor(
            [float(u.num_samples) for u in updates], device=stacked.device, dtype=stacked.dtype
        )
        if self.defence.privacy is not None and self.defence.privacy.mode == "local":
            stacked = self._privatised_for_simulated(round_number, stacked, ids)
        stacked = self._attacked(state, round_number, stacked, weights, ids, outcome, rows)
        keep = self._screened(outcome, stacked, weights, ids, rows)
        positions = keep.nonzero().flatten()
        outcome.kept_ids = [ids[p] for p in positions.tolist()]
        if len(outcome.kept_ids) < self.config.min_clients:
            return outcome
        kept, kept_weights = stacked, weights  # everyone kept: no copy of the round
        if len(positions) < len(ids):
            kept, kept_weights = stacked[positions], weights[positions]
        aggregate = self._ruled(state, round_number, kept, kept_weights, outcome, rows)
        self._server_step(state, aggregate, outcome)
        return outcome

    def _server_step(self, state: ServerState, aggregate: Tensor, outcome: Aggregation) -> None:
        """The server optimizer's step from the state's memory: the new global vector
        and the optimizer's new state go into ``outcome``."""
        optimizer = self.defence.server_optimizer
        optimizer.load_state_dict(state.server_optimizer_state)
        outcome.global_vector = optimizer.step(
            state.global_vector, aggregate.to(state.global_vector.dtype)
        )
        outcome.server_optimizer_state = optimizer.state_dict()

    def _screened(
        self,
        outcome: Aggregation,
        stacked: Tensor,
        weights: Tensor,
        ids: list[int],
        rows: TrailRows,
    ) -> Tensor:
        """Which rows reach the rule: the finite ones the filters kept (each exclusion in
        its trail row); the filters' new states go into ``outcome``."""
        _, _, keep = drop_non_finite(stacked, weights)
        keep = keep.clone()
        for client_id, finite in zip(ids, keep.tolist(), strict=True):
            if not finite:
                rows[client_id].update(excluded=True, reason="non_finite")
        outcome.filter_states = self._filter(
            outcome.filter_states,
            self._validate(outcome.global_vector, outcome.server_optimizer_state),
            stacked, weights, ids, keep, rows,
        )  # fmt: skip
        return keep

    def _ruled(
        self,
        state: ServerState,
        round_number: int,
        kept: Tensor,
        kept_weights: Tensor,
        outcome: Aggregation,
        rows: TrailRows,
    ) -> Tensor:
        """The pre-aggregators and the rule on the kept rows (under DP-FedAvg clipped,
        centrally, and weighted equally), their values in the trail, their new states in
        ``outcome``: the aggregate the server releases."""
        privacy = self.defence.privacy
        if privacy is not None:
            kept = privacy.clipped(kept) if privacy.mode == "central" else kept
            kept_weights = torch.ones_like(kept_weights)
        decided = self._decide(state, round_number, kept, kept_weights, outcome.kept_ids, rows)
        outcome.aggregator_state = decided.rule_state
        outcome.preaggregator_states = decided.preaggregator_states
        record_decisions(decided.columns, outcome.kept_ids, rows)
        if privacy is None:
            return decided.aggregate
        return self._privately_released(round_number, decided.aggregate, kept)

    def _privatised_for_simulated(
        self, round_number: int, stacked: Tensor, ids: list[int]
    ) -> Tensor:
        """``local`` mode: the rows of the clients simulated here, clipped and noised as
        each client would (its noise from a seed of the run); a real site's row came
        privatised by the site itself and is left as it is."""
        held = [p for p, i in enumerate(ids) if i in self.held_here]
        if not held:
            return stacked
        generators = [
            torch_generator(derive_seed(self.config.seed, round_number, PRIVACY, ids[p]), stacked.device)
            for p in held
        ]  # fmt: skip
        privatised = self.defence.privacy.privatised_by_clients(stacked[held], generators)
        if len(held) == len(ids):
            return privatised
        stacked = stacked.clone()
        stacked[held] = privatised
        return stacked

    def site_epsilons(self, state: ServerState, rows: TrailRows) -> None:
        """``local`` mode: each client that sent an update this round gets its ε against
        the server in its trail row (``privacy_epsilon``), after every round it sent one
        in, by the accountant a real site runs on itself."""
        privacy = self.defence.privacy
        if privacy is None or privacy.mode != "local":
            return
        sent = Counter(int(row["client"]) for row in state.trail if sent_update(row))
        for client_id, row in rows.items():
            if sent_update(row):
                row["privacy_epsilon"] = privacy.site_epsilon(sent[client_id] + 1)

    def _privately_released(self, round_number: int, aggregate: Tensor, kept: Tensor) -> Tensor:
        """The aggregate the server releases under DP-FedAvg: the noisy fixed-denominator
        mean of the kept rows; a rule other than the mean (run outside the accountant,
        ``privacy.unaccounted: warn``) keeps its output, plus the noise the mean would get."""
        generator = torch_generator(
            derive_seed(self.config.seed, round_number, PRIVACY), kept.device
        )
        if isinstance(self.defence.rule, FedAvg):
            return self.defence.privacy.released(kept.sum(dim=0), generator)
        return aggregate + self.defence.privacy.released(torch.zeros_like(aggregate), generator)

    def _attacked(
        self,
        state: ServerState,
        round_number: int,
        stacked: Tensor,
        weights: Tensor,
        ids: list[int],
        outcome: Aggregation,
        rows: TrailRows,
    ) -> Tensor:
        """The round's updates ``(n, d)`` after the model attack, if any malicious client
        is among them; the attack's new state and its diagnostics go into ``outcome``."""
        attack = self.threat.model_attack
        if attack is None or not self.threat.malicious:
            return stacked
        mask = torch.tensor([i in self.threat.malicious for i in ids], device=stacked.device)
        if not bool(mask.any()):
            return stacked
        generator = torch_generator(
            derive_seed(self.config.seed, round_number, ATTACK), stacked.device
        )
        defence = (
            self._simulated_defence(state, round_number, weights, ids, rows)
            if attack.requires_aggregate
            else None
        )
        attacked, outcome.attack_state, diagnostics = attack.step(
            state.attack_state, stacked, mask, generator, aggregate=defence
        )
        outcome.attack_metrics = {f"attack_{k}": float(v) for k, v in diagnostics.items()}
        return attacked

    def _simulated_defence(
        self, state: ServerState, round_number: int, weights: Tensor, ids: list[int],
        rows: TrailRows,
    ) -> Callable[[Tensor], Tensor]:  # fmt: skip
        """What the server would make of a candidate round ``(n, d)`` (rows in ``ids``'
        order): non-finite rows dropped, the filters, the rule; no state advanced. What an
        optimising attacker (Opt-ALIE, Opt-IPM) is assumed to know of the defence."""

        def defend(candidate: Tensor) -> Tensor:
            _, _, keep = drop_non_finite(candidate, weights)
            keep = keep.clone()
            run_filters(
                self.defence.filters, state.filter_states, candidate, weights, ids, keep,
                validate=self._validate(state.global_vector, state.server_optimizer_state),
            )  # fmt: skip
            positions = keep.nonzero().flatten()
            if len(positions) < self.config.min_clients:  # the round would be skipped
                return torch.zeros_like(candidate[0])
            kept = [ids[p] for p in positions.tolist()]
            return self._decide(
                state, round_number, candidate[positions], weights[positions], kept, rows
            ).aggregate

        return defend

    def _filter(
        self,
        filter_states: list[dict[str, Any]],
        validate: Validate | None,
        stacked: Tensor,
        weights: Tensor,
        ids: list[int],
        keep: Tensor,
        rows: TrailRows,
    ) -> list[dict[str, Any]]:
        """Run the filters in order on the rows still kept (``keep`` is updated in place),
        recording each client's scores and any exclusion; the filters' new states."""
        steps, states = run_filters(
            self.defence.filters, filter_states, stacked, weights, ids, keep,
            validate=validate,
        )  # fmt: skip
        record_filter_steps(steps, ids, rows)
        return states

    def _validate(self, global_vector: Tensor, optimizer_state: dict[str, Any]) -> Validate | None:
        """The sites' held-out losses of candidate updates applied to ``global_vector`` as
        the round would apply its aggregate (the server optimizer's step from
        ``optimizer_state``, which the candidates do not advance); None without sites that
        validate."""
        validator = self.validator
        if validator is None:
            return None
        optimizer = self.defence.server_optimizer

        def stepped(candidate: Tensor) -> Tensor:
            optimizer.load_state_dict(optimizer_state)
            return optimizer.step(global_vector, candidate.to(global_vector))

        def validate(candidates: Tensor, client_ids: Sequence[int]) -> SiteLosses:
            models = torch.stack([stepped(candidate) for candidate in candidates])
            answers = validator.validate(models, client_ids)
            table = [list(a.losses) for a in answers]  # (sites, candidates)
            return SiteLosses(
                sites=tuple(a.site for a in answers),
                counts=torch.tensor([float(a.n) for a in answers], dtype=torch.float64),
                losses=torch.tensor(table, dtype=torch.float64).reshape(-1, len(candidates)),
            )

        return validate

    def _decide(
        self,
        state: ServerState,
        round_number: int,
        updates: Tensor,
        weights: Tensor,
        ids: list[int],
        rows: TrailRows,
    ) -> RuleOutcome:
        """The pre-aggregators, then the rule, on the rows that passed the filters
        (:func:`aggregation.defence.run_rule`, with the server's oracle and reference and
        the clients' local work)."""
        generator = torch_generator(
            derive_seed(self.config.seed, round_number, PREAGGREGATION), updates.device
        )
        rule = self.defence.rule
        norms = self._local_norms(ids, rows) if rule.requires_local_norms else None
        losses = (
            torch.tensor([rows[i]["model_loss"] for i in ids], dtype=torch.float64)
            if rule.requires_losses
            else None
        )
        return run_rule(
            rule, state.aggregator_state, self.defence.preaggregators,
            state.preaggregator_states, Rows(updates, weights, ids, norms, losses),
            generator=generator,
            oracle=lambda: self._oracle(state),
            reference=lambda: self._reference(state, round_number),
        )  # fmt: skip

    def _local_norms(self, client_ids: Sequence[int], rows: TrailRows) -> Tensor:
        """FedNova's ‖a_i‖₁ of each client: its round's SGD steps (from its trail row),
        discounted by the local momentum and proximal term."""
        assert self.local is not None  # a rule that needs them needs local= (checked)
        lr_mu = self.local.lr * self.local.prox_mu
        return torch.tensor(
            [
                local_norm(rows[i]["local_steps"], momentum=self.local.momentum, lr_mu=lr_mu)
                for i in client_ids
            ],
            dtype=torch.float64,
        )

    def _reference(self, state: ServerState, round_number: int) -> Tensor:
        """The server's own update from its root data, made as a client makes its own."""
        assert self.defence.root is not None and self.local is not None  # checked when built
        seed = derive_seed(self.config.seed, round_number, self.defence.root.client_id, SHUFFLE)
        return train_client(
            self.model, state.global_vector, self.defence.root, self.local, self.loss_fn, seed=seed
        ).delta

    def _oracle(self, state: ServerState) -> Callable[[Tensor], Tensor]:
        """Loss on the server's batch after applying each candidate update (Zeno)."""
        if self.defence.server_batch is None:
            raise ValueError(
                f"aggregator {type(self.defence.rule).__name__} needs a server batch (server_batch=)"
            )
        images, targets = self.defence.server_batch

        @torch.no_grad()
        def oracle(candidates: Tensor) -> Tensor:
            losses = []
            for row in candidates:
                vector_to_model_(self.model, state.global_vector + row.to(state.global_vector))
                self.model.eval()
                losses.append(self.loss_fn(self.model(images), targets))
            return torch.stack(losses)

        return oracle
