"""The round's scores, apart from the round: the global model on the server's test and
validation splits (``where="hub"``) or pooled from the sites' summaries of their own
(``where="sites"``), each site's row, the backdoor's success rate, the round's metrics
(its scores beside its counts of clients and detections), and the model's loss on the
clients' training data (EMA's non-IID check, every round's and the trained model's).

A :class:`RoundScorer` is given what it scores with (the workspace model, the clients, the
evaluation sets, the run's scoring settings) and is handed model vectors; it never reads a
:class:`~federated.parts.ServerState` nor advances one. A :class:`~federated.server.Federation`
builds one and exposes it as ``federation.scorer``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from federated.backdoor_eval import attack_success_rate
from federated.client import ClientData, ClientUpdate, RegisteredClient
from federated.defence import Aggregation
from federated.execution import (
    LocalSiteScorer,
    NextRound,
    ScoreRequest,
    SiteEvaluation,
    SiteScorer,
)
from federated.metrics import ModelDiverged, evaluate, pooled_scores, site_scores
from federated.parts import EvaluationSets, FederationConfig
from federated.stats.noniid import NonIIDResult, client_losses, noniid_verdict
from federated.trail import TrailRows, contributions, detection_counts, worst_client
from federated.vectors import model_to_vector, vector_to_model_

__all__ = ["RoundScorer", "scored_together"]


@dataclass(frozen=True, kw_only=True)
class RoundScorer:
    """Scores of a model vector for a federation's rounds and its end.

    ``model`` is the federation's workspace (a vector is loaded into it to be scored) on
    ``device``; ``backdoor_test`` a backdoor's triggered test images and target label."""

    model: nn.Module
    device: torch.device
    clients: Sequence[ClientData | RegisteredClient]
    evaluation: EvaluationSets
    config: FederationConfig
    backdoor_test: tuple[Tensor, int] | None = None

    def load(self, vector: Tensor) -> nn.Module:
        """The workspace model holding ``vector`` (eval mode)."""
        vector_to_model_(self.model, vector)
        return self.model.eval()

    def scores(
        self, model: nn.Module, split: tuple[Tensor, Tensor], *, full: bool = True
    ) -> dict[str, float]:
        images, targets = split
        return evaluate(
            model, images, targets, multi_label=self.evaluation.multi_label,
            batch_size=self.config.eval_batch_size, full=full,
        )  # fmt: skip

    def evaluate(self, vector: Tensor, split: str = "test") -> dict[str, float]:
        """Loss, ACC, AUC, ECE and Brier of ``vector`` on the test or validation split (with
        ``where="sites"``, the sites' pooled splits)."""
        if self.evaluation.where == "sites":
            request = ScoreRequest(splits=(split,), rows=False)
            return self.pooled(self.site_scorer().score(vector, self.ids(), request), split)
        data = self.evaluation.test if split == "test" else self.evaluation.val
        if data is None:
            raise ValueError("this federation has no validation split (val=)")
        return self.scores(self.load(vector), data)

    def ids(self) -> list[int]:
        return [c.client_id for c in self.clients]

    def site_scorer(self) -> SiteScorer:
        """The sites that score the model: elsewhere (``site_scorer``), or the local
        ``sites`` and ``site_vals`` scored here as a site scores its own."""
        if self.evaluation.site_scorer is not None:
            return self.evaluation.site_scorer
        splits: dict[int, dict[str, tuple[Tensor, Tensor]]] = {}
        for index, client in enumerate(self.clients):
            held = {"test": self.evaluation.sites[index]} if self.evaluation.sites else {}
            if self.evaluation.site_vals:
                held["val"] = self.evaluation.site_vals[index]
            splits[client.client_id] = held
        return LocalSiteScorer(
            model=self.model, splits=splits, multi_label=self.evaluation.multi_label,
            batch_size=self.config.eval_batch_size,
        )  # fmt: skip

    def pooled(
        self, evaluations: Sequence[SiteEvaluation], split: str, *, full: bool = True
    ) -> dict[str, float]:
        summaries = [e.splits[split] for e in evaluations if split in e.splits]
        return pooled_scores(summaries, multi_label=self.evaluation.multi_label, full=full)

    def at_sites(
        self, vector: Tensor, round_number: int, next_round: NextRound | None, data_loss: str
    ) -> list[SiteEvaluation] | None:
        """Every site's summaries of its test and validation splits (and, when per-site
        evaluation is due, its row) for ``vector``; ``data_loss``: the loss on its training
        data the next round's screen needs (``""``: none). None when the round is scored
        here (``where="hub"``)."""
        if self.evaluation.where != "sites":
            return None
        request = ScoreRequest(
            splits=("test", "val"), full=self.full(round_number),
            rows=self.sites_due(round_number), data_loss=data_loss,
        )  # fmt: skip
        return self.site_scorer().score(vector, self.ids(), request, next_round)

    def full(self, round_number: int) -> bool:
        """Whether the round is scored fully (every round, or the last one only)."""
        return self.config.round_scores == "full" or round_number == self.config.rounds

    def sites_due(self, round_number: int) -> bool:
        """Whether the sites' rows are scored this round (every ``site_every`` and the last)."""
        every = self.config.site_every
        scored = bool(self.evaluation.sites) or self.evaluation.site_scorer is not None
        return scored and (round_number % every == 0 or round_number == self.config.rounds)

    def site_scores(self, model: nn.Module) -> list[dict[str, float]]:
        """``model``'s scores on every site's local test split, one row per site."""
        splits = {
            c.client_id: split for c, split in zip(self.clients, self.evaluation.sites, strict=True)
        }
        return site_scores(
            model,
            splits,
            multi_label=self.evaluation.multi_label,
            batch_size=self.config.eval_batch_size,
        )

    def site_rows(
        self, vector: Tensor, evaluations: Sequence[SiteEvaluation] | None = None,
        next_round: NextRound | None = None, data_loss: str = "",
    ) -> list[dict[str, float]]:  # fmt: skip
        """Every site's scores of ``vector``: on the local test splits held here, or as the
        sites scored it on their own (those that answered, from ``evaluations`` when the
        round's already came)."""
        scorer = self.evaluation.site_scorer
        if scorer is None and evaluations is None:
            return self.site_scores(self.load(vector))
        if evaluations is None:
            request = ScoreRequest(data_loss=data_loss)
            evaluations = scorer.score(vector, self.ids(), request, next_round)
        return [{"site": e.site, **e.row, "n": int(e.row["n"])} for e in evaluations if e.row]

    def backdoor_asr(self, vector: Tensor) -> float | None:
        """The backdoor's attack success rate on the triggered test images; ``None``
        without a backdoor."""
        if self.backdoor_test is None:
            return None
        return attack_success_rate(self.load(vector), *self.backdoor_test)

    def round_scores(
        self, vector: Tensor, round_number: int,
        evaluations: Sequence[SiteEvaluation] | None = None,
    ) -> dict[str, float]:  # fmt: skip
        """The round's test (and validation) scores of ``vector`` under the hub's names:
        on the server's splits, or pooled from the sites' ``evaluations``. A model whose
        outputs are not finite stops the run with the round that broke it."""
        if evaluations is not None:
            return self.pooled_scores(evaluations, round_number)
        try:
            return self.hub_scores(vector, round_number)
        except ModelDiverged as error:
            raise ModelDiverged(f"round {round_number}: {error}") from None

    def round_metrics(
        self, vector: Tensor, round_number: int, rows: TrailRows,
        updates: Sequence[ClientUpdate], screen_metrics: dict[str, float],
        outcome: Aggregation, evaluations: Sequence[SiteEvaluation] | None = None,
    ) -> dict[str, float]:  # fmt: skip
        """The round's metrics: test (and validation) scores of its global ``vector``
        (``evaluations``: pooled from the sites' summaries), its counts of clients (by
        their trail ``rows``, the ``updates`` that passed and the ``outcome``'s kept ids),
        the non-IID screen's and the attack's metrics and the trail's detections."""
        metrics = self.round_scores(vector, round_number, evaluations)
        skipped = len(outcome.kept_ids) < self.config.min_clients
        losses = [u.train_loss for u in updates]
        trail_rows = list(rows.values())
        return metrics | {
            "round": float(round_number),
            "clients_sampled": float(len(rows)),
            "clients_kept": float(0 if skipped else len(outcome.kept_ids)),
            "clients_excluded": float(sum(r["excluded"] for r in trail_rows)),
            "round_skipped": float(skipped),
            "client_loss_mean": float(np.mean(losses)) if losses else math.nan,
            **screen_metrics,
            **outcome.attack_metrics,
            **detection_counts(trail_rows),
            **worst_client(trail_rows),
            **contributions(trail_rows),
        }

    def hub_scores(self, vector: Tensor, round_number: int) -> dict[str, float]:
        """``vector`` on the server's test (and validation) split, the backdoor's success
        rate and the caller's own scores (``EvaluationSets.model_scores``)."""
        model = self.load(vector)  # loaded once for both splits
        full = self.full(round_number)
        splits = {"test": self.evaluation.test, "val": self.evaluation.val}
        metrics = {
            f"{name}_{k}": v
            for name, split in splits.items()
            if split is not None
            for k, v in self.scores(model, split, full=full).items()
        }
        if self.backdoor_test is not None:
            triggered, target = self.backdoor_test
            metrics["backdoor_asr"] = attack_success_rate(model, triggered, target)
        if self.evaluation.model_scores is not None:
            metrics |= self.evaluation.model_scores(model, round_number)
        return metrics

    def pooled_scores(
        self, evaluations: Sequence[SiteEvaluation], round_number: int
    ) -> dict[str, float]:
        """The sites' pooled test scores (NaN when none answered) and validation scores
        (left out when no site holds a validation split), under the hub's names, and how
        many sites' test splits the pooled scores cover (``sites_scored``: a site that did
        not answer is not in them)."""
        full = self.full(round_number)
        metrics = {f"test_{k}": v for k, v in self.pooled(evaluations, "test", full=full).items()}
        metrics["sites_scored"] = float(
            sum(1 for e in evaluations if e.splits.get("test") is not None and e.splits["test"].n)
        )
        if any(e.splits.get("val") is not None and e.splits["val"].n for e in evaluations):
            val = self.pooled(evaluations, "val", full=full)
            metrics |= {f"val_{k}": v for k, v in val.items()}
        return metrics

    def data_losses(
        self, vector: Tensor, positions: Sequence[int], loss: str,
        then_train: NextRound | None = None,
    ) -> dict[int, float]:  # fmt: skip
        """``vector``'s ``loss`` on the training data of the clients at ``positions``, by
        client id (EMA's Algorithm 3): computed here for clients held here (as the server
        sees their data, poisoned labels included), or by the sites on their own data, one
        number each (those that answered; ``then_train``: the round whose clients train on
        ``vector``, which remote sites do in the same exchange)."""
        clients = [self.clients[p] for p in positions]
        if all(isinstance(c, ClientData) for c in clients):
            model = self.load(vector)
            datasets = [(c.images, c.targets) for c in clients]  # type: ignore[union-attr]
            values = client_losses(model, datasets, loss=loss, device=self.device)  # type: ignore[arg-type]
            return dict(zip([c.client_id for c in clients], values.tolist(), strict=True))
        request = ScoreRequest(rows=False, data_loss=loss)
        ids = [c.client_id for c in clients]
        answers = self.site_scorer().score(vector, ids, request, then_train)
        return {e.site: e.data_loss for e in answers if e.data_loss is not None}

    def model_losses(self, vector: Tensor, client_ids: Sequence[int]) -> dict[int, float]:
        """``vector``'s cross-entropy on each client's own training data, by client id
        (AFL's gradient of λ): :meth:`data_losses` by id."""
        positions = {c.client_id: p for p, c in enumerate(self.clients)}
        return self.data_losses(vector, [positions[i] for i in client_ids], "cross_entropy")

    def trained_model_noniid(
        self, model: nn.Module, loss: str, threshold: float
    ) -> NonIIDResult | None:
        """EMA's Algorithms 3-4 as the paper runs them: the trained ``model``'s ``loss`` on
        every client's local data (at the sites, by the sites) and the CV verdict against
        ``threshold``; ``client_ids`` are the clients the losses are of. None when fewer
        than two sites answered (a CV of one loss says nothing)."""
        losses = self.data_losses(model_to_vector(model), range(len(self.clients)), loss)
        if len(losses) < 2:
            return None
        result = noniid_verdict(np.array(list(losses.values())), threshold=threshold)
        return replace(result, client_ids=tuple(losses))


def scored_together(scorer: RoundScorer, models: dict[str, Tensor]) -> dict[str, Any]:
    """Each of ``models`` (name -> vector) on every site's held-out test split, pooled over
    the sites that scored them all (``sites``): how the gate compares a run's model with
    the champion on the same held-out images when only the sites hold them."""
    request = ScoreRequest(splits=("test",), rows=False)
    answers = {
        name: {e.site: e for e in scorer.site_scorer().score(vector, scorer.ids(), request)}
        for name, vector in models.items()
    }
    common = set(scorer.ids())
    for answered in answers.values():
        common &= set(answered)
    sites = sorted(common)
    pooled = {
        name: scorer.pooled([answered[site] for site in sites], "test")
        for name, answered in answers.items()
    }
    return {"sites": sites, **pooled}
