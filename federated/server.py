"""The server's round: sample clients, have them trained, screen their updates, aggregate,
evaluate. (The loop over rounds is :func:`federated.loop.train`.)

A :class:`Federation` is assembled from frozen parts (:mod:`federated.parts`). It keeps
the round's order of events and hands each step to a part of its own: the executor trains
the clients (:mod:`federated.execution`), the non-IID screen judges them before they train
(:mod:`federated.noniid_screen`), the defence makes the aggregate (:mod:`federated.defence`),
the scorer scores it and makes the round's metrics (:mod:`federated.scoring`) and the
trail records why each client counted or not (:mod:`federated.trail`). A state's model is
scored after the run by the same scorer, ``federation.scorer`` (e.g.
``federation.scorer.evaluate(state.selected_vector, "test")``).

All memory lives in :class:`ServerState` (the global model vector, the aggregator's and
filters' states, the per-round metrics and the exclusion trail), which
:meth:`ServerState.to_dict` turns into tensors and plain values for a checkpoint that
``torch.load(weights_only=True)`` reads back. Random draws come from seeds derived from
(run seed, round, client), so a resumed run is identical to an uninterrupted one.

Screening order in a round, each dropped client recorded in the trail with its reason:
0. ``noniid_loss`` (optional): the global model's loss on the client's data is an
   outlier (z-score > z); the client is left out before training.
1. ``client_error`` / ``client_timeout`` / ``client_unavailable``: no update came back
   from the executor; ``bad_update``: one came, of the wrong shape or dtype. The round
   goes on with the rest.
2. ``non_finite``: the update holds NaN or Inf; it can never reach the global model.
3. filters (e.g. ``pid_made``), in the configured order.
4. the aggregation rule (selection rules report their implicit choice as ``not_selected``).
A round with fewer than ``min_clients`` survivors is skipped: the global model is kept.

Per-site evaluation, where the round's scores come from and the backends are described
with their parts. Under client-level DP (:mod:`federated.privacy`) the rule's inputs are
clipped and weighted equally, the release is DP-FedAvg's noisy mean, every round logs ε
and :meth:`Federation.budget_spent` says when the next round would pass the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from federated.client import (
    ClientData,
    ClientUpdate,
    LocalTraining,
    RegisteredClient,
    round_epochs,
)
from federated.defence import Aggregation, RoundDefence
from federated.execution import (
    BatchedExecutor,
    ClientExecutor,
    ClientResult,
    NextRound,
    SiteEvaluation,
    local_executor,
)
from federated.layout import use_fast_layout_
from federated.metrics import loss_function, site_summary
from federated.noniid_screen import NonIIDScreen, Screen
from federated.parts import (
    Backend,
    Defence,
    EvaluationSets,
    Execution,
    FederationConfig,
    NonIIDCheck,
    RoundReport,
    ServerState,
    ThreatModel,
    check_assembly,
    check_local,
)
from federated.privacy import released_rounds
from federated.scaffold import LOCAL_EXECUTORS, advance_controls, train_with_variates
from federated.scoring import RoundScorer, scored_together
from federated.seeding import SAMPLERS, SHUFFLE, clients_per_round, derive_seed
from federated.trail import (
    TrailRows,
    checked_update,
    detection_counts,
    left_out,
    new_row,
    record_local_work,
)
from federated.vectors import model_to_vector

__all__ = [
    "Backend",
    "Defence",
    "EvaluationSets",
    "Execution",
    "Federation",
    "FederationConfig",
    "NonIIDCheck",
    "RoundReport",
    "ServerState",
    "ThreatModel",
    "detection_counts",
    "left_out",
]


class Federation:
    """A federation assembled from frozen parts (clients, local training, the defence,
    the threat model, the evaluation sets, the execution) and the round step over an
    explicit :class:`ServerState`."""

    def __init__(
        self,
        *,
        model: nn.Module,
        clients: Sequence[ClientData | RegisteredClient],
        local: LocalTraining | None,
        config: FederationConfig,
        defence: Defence,
        evaluation: EvaluationSets,
        threat: ThreatModel = ThreatModel(),
        execution: Execution = Execution(),
    ) -> None:
        check_assembly(clients, config, defence, evaluation, threat, execution)
        check_local(local, config, defence, execution)
        device = (
            evaluation.test[0].device
            if evaluation.test is not None
            else next(model.parameters()).device
        )
        self.model = use_fast_layout_(model, device)  # the workspace
        self.device: torch.device = device
        self.clients = list(clients)
        self.local = local
        self.config = config
        self.defence = defence
        self.evaluation = evaluation
        self.threat = threat
        self.initial_vector = model_to_vector(self.model).to(self.device)
        self.clients_per_round = clients_per_round(config.client_fraction, len(self.clients))
        self.loss_fn = loss_function(evaluation.multi_label)
        self.local_work = execution.local_work
        self._assemble_steps(execution)

    def _assemble_steps(self, execution: Execution) -> None:
        """The round's steps, each given only what it needs: the executor, the scorer,
        the non-IID screen and the defence."""
        held_here = frozenset(c.client_id for c in self.clients if isinstance(c, ClientData))
        self.executor = execution.executor or self._local_executor(execution)
        self.scorer = RoundScorer(
            model=self.model, device=self.device, clients=self.clients,
            evaluation=self.evaluation, config=self.config,
            backdoor_test=self.threat.backdoor_test,
        )  # fmt: skip
        self.screen = NonIIDScreen(
            check=self.defence.noniid, scorer=self.scorer,
            all_held_here=len(held_here) == len(self.clients),
        )  # fmt: skip
        validates = any(f.requires_validation for f in self.defence.filters)
        self.round_defence = RoundDefence(
            defence=self.defence, threat=self.threat, config=self.config, model=self.model,
            loss_fn=self.loss_fn, local=self.local, held_here=held_here,
            validator=self.scorer.site_scorer() if validates else None,  # type: ignore[arg-type]
        )  # fmt: skip

    def _local_executor(self, execution: Execution) -> ClientExecutor:
        assert self.local is not None  # checked when the federation was built
        return local_executor(
            self.model, self.clients, self.local, self.loss_fn, self._shuffle_seed,
            backend=execution.backend, max_parallel=execution.max_parallel,
            epochs_of=self.local_epochs if execution.local_work is not None else None,
        )  # fmt: skip

    def local_epochs(self, round_number: int, client_id: int) -> int:
        """A client's local epochs in a round: drawn (``local_work``) or ``local.epochs``."""
        return round_epochs(self.local, self.local_work, self.config.seed, round_number, client_id)

    @property
    def batched(self) -> bool:
        """Whether the round's clients are trained in one batched call."""
        return isinstance(self.executor, BatchedExecutor)

    def initial_state(self) -> ServerState:
        """Round 0: the model's weights as the federation was built (the workspace model
        holds whatever was loaded last), fresh rule, filter and attack states."""
        return ServerState(
            round=0,
            global_vector=self.initial_vector.clone(),
            aggregator_state=self.defence.rule.init_state(),
            filter_states=[f.init_state() for f in self.defence.filters],
            attack_state=self.threat.model_attack.init_state() if self.threat.model_attack else {},
            preaggregator_states=[p.init_state() for p in self.defence.preaggregators],
            control=torch.zeros_like(self.initial_vector) if self.config.scaffold else None,
        )

    def sample_clients(self, round_number: int) -> list[int]:
        """Seeded choice of ``clients_per_round`` client positions for a round (by the
        configured ``sampling`` rule)."""
        sample = SAMPLERS[self.config.sampling]
        return sample(self.config.seed, round_number, len(self.clients), self.clients_per_round)

    def global_model(self, state: ServerState) -> nn.Module:
        """The workspace model holding the state's global weights (eval mode)."""
        return self.scorer.load(state.global_vector)

    def selected_model(self, state: ServerState) -> nn.Module:
        """The model the run ends with: the last round's, or (``select="best_val"``) the
        best validation round's (eval mode)."""
        return self.scorer.load(state.selected_vector)

    def scored_beside(self, state: ServerState, champion: torch.Tensor) -> dict[str, Any]:
        """The run's model and ``champion`` (a vector) scored in the same evaluation of the
        sites' held-out splits, pooled over the sites that scored both (the gate's
        comparison when only the sites hold the images)."""
        models = {
            "candidate": model_to_vector(self.selected_model(state)),
            "champion": champion.to(self.device),
        }
        return scored_together(self.scorer, models)

    def budget_spent(self, state: ServerState) -> str | None:
        """Why no further round may run (the next would take ε past
        ``privacy.target_epsilon``), in one line; None while the budget admits it."""
        privacy, done, spent = self.defence.privacy, state.round, released_rounds(state.history)
        if privacy is None or privacy.admits(spent + 1):
            return None
        return (
            f"privacy budget: round {done + 1} would take ε to {privacy.epsilon(spent + 1):.3f}, "
            f"past privacy.target_epsilon = {privacy.target_epsilon:g} (δ = {privacy.delta:g}); "
            f"the run ends with round {done}'s model (ε = {privacy.epsilon(spent):.3f})"
        )

    def _next_round(self, state: ServerState) -> NextRound | None:
        """The round after the state's, when one is due: the clients it samples, who train
        on the state's model (remote sites then score it and train in one exchange)."""
        following = state.round + 1
        if following > self.config.rounds or state.halted or self.budget_spent(state):
            return None
        ids = tuple(self.clients[p].client_id for p in self.sample_clients(following))
        return NextRound(following, ids, state.control)

    def _shuffle_seed(self, round_number: int, client_id: int) -> int:
        return derive_seed(self.config.seed, round_number, client_id, SHUFFLE)

    def run_round(
        self, state: ServerState, on_client: Callable[[int], None] | None = None
    ) -> tuple[ServerState, RoundReport]:
        """One round: sample, screen, train, attack, filter, aggregate, score.
        ``on_client(client_id)`` is called as each sampled client is done (trained,
        screened out or failed), e.g. to advance a progress bar."""
        round_number = state.round + 1
        sampled = self.sample_clients(round_number)
        screen = self.screen.screen(state.global_vector, round_number, sampled, state.control)
        rows, updates = self._train_clients(state, round_number, sampled, screen, on_client)
        outcome = self.round_defence.aggregate(state, round_number, updates, rows)
        self.round_defence.site_epsilons(state, rows)
        new_state = self._settled(state, round_number, outcome, updates, rows)
        next_round = self._next_round(new_state) if self.screen.trains_with_scoring() else None
        ahead = self.screen.losses_ahead(next_round)
        vector = new_state.global_vector
        evaluations = self.scorer.at_sites(vector, round_number, next_round, ahead)
        metrics = self.scorer.round_metrics(
            vector, round_number, rows, updates, screen.metrics, outcome, evaluations
        )
        if self.config.select == "best_val":
            new_state.keep_if_best(metrics.get("val_auc", math.nan))
        sites = self._site_rows(new_state, round_number, evaluations, next_round, ahead)
        if sites:  # remote sites that all failed to answer leave none
            metrics |= site_summary(sites, self.config.target_acc)
        if self.defence.privacy is not None:  # spent by the rounds that released a model
            spent = released_rounds([*new_state.history, metrics])
            metrics["privacy_epsilon"] = self.defence.privacy.epsilon(spent)
        new_state.history.append(metrics)
        trail_rows = list(rows.values())
        new_state.trail.extend(trail_rows)
        report = RoundReport(round=round_number, metrics=metrics, clients=trail_rows, sites=sites)
        return new_state, report

    def _settled(
        self, state: ServerState, round_number: int, outcome: Aggregation,
        updates: list[ClientUpdate], rows: TrailRows,
    ) -> ServerState:  # fmt: skip
        """The state the round leaves: none of its aggregate under a fail-closed halt (the
        model and the server optimizer's memory stay as they were), SCAFFOLD's variates
        advanced."""
        halted = self._exclusion_bound_exceeded(round_number, rows)
        if halted is not None:  # fail closed: no aggregate from what was left
            outcome.global_vector = state.global_vector
            outcome.server_optimizer_state = state.server_optimizer_state
        new_state = self._next_state(state, round_number, outcome)
        new_state.halted = halted
        if self.config.scaffold:
            advance_controls(
                new_state, updates, outcome, rows, self.config.min_clients, len(self.clients),
                keep_clients=isinstance(self.executor, LOCAL_EXECUTORS),
            )  # fmt: skip
        return new_state

    def _site_rows(
        self, state: ServerState, round_number: int,
        evaluations: Sequence[SiteEvaluation] | None, next_round: NextRound | None,
        data_loss: str,
    ) -> list[dict[str, float]]:  # fmt: skip
        """The round's per-site rows when they are due (kept in ``state.sites`` too):
        scored here, or taken from the sites' ``evaluations``."""
        if not self.scorer.sites_due(round_number):
            return []
        scored = self.scorer.site_rows(state.global_vector, evaluations, next_round, data_loss)
        sites = [{"round": round_number, **row} for row in scored]
        state.sites.extend(sites)
        return sites

    def _exclusion_bound_exceeded(self, round_number: int, rows: TrailRows) -> str | None:
        """Why the round must not be aggregated, if more of its clients were left out
        than ``max_excluded`` allows (a client whose training failed is not counted)."""
        bound = self.config.max_excluded
        if bound is None:
            return None
        excluded = left_out(list(rows.values()))
        allowed = bound if isinstance(bound, int) else math.floor(bound * len(rows))
        if excluded <= allowed:
            return None
        return (
            f"round {round_number}: {excluded} of {len(rows)} clients left out, more than "
            f"train.max_excluded = {bound!r} allows ({allowed}); the round was not aggregated"
        )

    def _train_clients(
        self,
        state: ServerState,
        round_number: int,
        sampled: list[int],
        screen: Screen,
        on_client: Callable[[int], None] | None,
    ) -> tuple[TrailRows, list[ClientUpdate]]:
        """Ask the executor for the updates of every sampled client the screen kept and
        check each one: its trail row (by client id) and the updates that passed."""
        rows: TrailRows = {}
        for position in sampled:
            client = self.clients[position]
            row = rows[client.client_id] = new_row(
                round_number, client, malicious=client.client_id in self.threat.malicious
            )
            if client.client_id in screen.losses:
                row["noniid_loss"] = screen.losses[client.client_id]
            if client.client_id in screen.excluded:
                row.update(excluded=True, reason="noniid_loss")
        to_train = [i for i in rows if i not in screen.excluded]
        done = (lambda result: on_client(result.client_id)) if on_client is not None else None
        results = self._results(state, round_number, to_train, done)
        if on_client is not None:
            for client_id in screen.excluded & rows.keys():
                on_client(client_id)
        updates = []
        for result in results:
            update = checked_update(result, rows[result.client_id], state.global_vector)
            if update is not None:
                updates.append(update)
                if self.local is not None:  # FedNova's τ_i (sites: by the registered count)
                    epochs = self.local_epochs(round_number, update.client_id)
                    record_local_work(rows[update.client_id], update, self.local, epochs)
        if self.defence.rule.requires_losses:  # AFL's λ gradient: L_k of the round's model
            ids = [u.client_id for u in updates]
            for client_id, loss in self.scorer.model_losses(state.global_vector, ids).items():
                rows[client_id]["model_loss"] = loss
        return rows, updates

    def _results(
        self, state: ServerState, round_number: int, to_train: list[int],
        done: Callable[[ClientResult], None] | None,
    ) -> list[ClientResult]:  # fmt: skip
        """The executor's results; under SCAFFOLD each client trains with its variates."""
        if not self.config.scaffold:
            return self.executor.train(state.global_vector, round_number, to_train, done)
        return train_with_variates(self.executor, state, round_number, to_train, done)

    def _next_state(
        self, state: ServerState, round_number: int, outcome: Aggregation
    ) -> ServerState:
        return ServerState(
            round=round_number,
            global_vector=outcome.global_vector,
            aggregator_state=outcome.aggregator_state,
            filter_states=outcome.filter_states,
            history=list(state.history),
            trail=list(state.trail),
            best_round=state.best_round,
            best_val_auc=state.best_val_auc,
            best_vector=state.best_vector,
            attack_state=outcome.attack_state,
            preaggregator_states=outcome.preaggregator_states,
            sites=list(state.sites),
            server_optimizer_state=outcome.server_optimizer_state,
            control=state.control,
            client_controls=state.client_controls,
        )
