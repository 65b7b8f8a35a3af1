"""Divide-and-Conquer (DnC).

Shejwalkar, Houmansadr 2021, "Manipulating the Byzantine: Optimizing Model Poisoning
Attacks and Defenses for Federated Learning" (NDSS,
https://www.ndss-symposium.org/ndss-paper/manipulating-the-byzantine-optimizing-model-poisoning-attacks-and-defenses-for-federated-learning/),
Algorithm 2. In each of ``n_iters`` iterations:

1. draw ``sub_dim`` of the d parameters at random (all of them when ``sub_dim >= d``);
2. center the clients' sub-vectors on their mean and take the top right singular vector
   v of the centered ``(n, sub_dim)`` matrix;
3. score every client by its squared projection ``s_i = <x_i - mean, v>²`` and keep the
   ``n - floor(filter_frac * f)`` clients with the lowest scores.

The clients kept in every iteration are averaged (unweighted). The algorithm starts the
intersection from the empty set, which can only stay empty; it is started from all
clients, as the authors' code does. If no client survives every iteration (possible only
with ``n_iters > 1``), the clients flagged in the fewest iterations are averaged. v is computed exactly from the eigen-decomposition
of the centered Gram matrix ``C C^T`` (n x n, float64): its top eigenpair (lambda, u)
gives the projections ``C v = sqrt(lambda) u``, so ``s_i = lambda u_i²``. Equal scores
are ordered by the clients' squared distances to the mean, then by row.

Randomness: the parameters of iteration k in round r are drawn by a generator seeded
with ``(seed, r, k)``; ``r`` counts calls and lives in the state, so a resumed run draws
the same parameters. Parameters: ``f: int`` (>= 0, required), ``n_iters: int = 1`` (>=
1), ``sub_dim: int = 10_000`` (>= 1), ``filter_frac: float = 1.0`` (>= 0), ``seed: int =
0`` (the authors' defaults). Needs ``n > floor(filter_frac * f)``. State: ``{"round":
int}``. Shapes: ``(n, d), (n,) | None -> (d,)``.

Diagnostics: ``selected`` (rows averaged, ascending), ``effective_weight`` 1/|kept| on
them (exact), ``columns["dnc_score"]`` (the score s_i averaged over the iterations, each
iteration's scores divided by their largest) and ``columns["dnc_flagged"]`` (in how
many iterations the client was among the removed).

Example (f = 1, sub_dim >= d so nothing is drawn): updates ``[[0, 0], [2, 0], [0, 2], [2,
2], [9, 9]]``. The mean is ``[2.6, 2.6]``; the centered rows are ``[-2.6, -2.6]``,
``[-0.6, -2.6]``, ``[-2.6, -0.6]``, ``[-0.6, -0.6]``, ``[6.4, 6.4]``; the top singular
direction is the diagonal ``v = [1, 1] / sqrt(2)``, so the scores are ``(x + y)² / 2``:
13.52, 5.12, 5.12, 0.72, 81.92. The last row is removed and DnC returns ``[1, 1]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from aggregation.base import Diagnostics, RoundInputs, RoundSeededRule, row_mean
from aggregation.ops import centered_gram, ranking
from aggregation.registry import register_aggregator
from registry.constraints import Interval, allowed

__all__ = ["DnC", "projection_scores"]


def projection_scores(gram: Tensor) -> Tensor:
    """Squared projections ``(n,)`` of the centered rows on their top right singular
    vector, from their Gram matrix ``(n, n)`` float64."""
    eigenvalues, eigenvectors = torch.linalg.eigh(gram)
    top = eigenvalues[-1].clamp_min(0.0)
    return top * eigenvectors[:, -1].square()


@register_aggregator("dnc")
@dataclass(frozen=True, kw_only=True)
class DnC(RoundSeededRule):
    """Mean of the clients never among the top projections on a random subspace."""

    f: int = field(metadata=allowed(Interval(int, 0)))  # Byzantine clients tolerated
    # subsampling iterations per round
    n_iters: int = field(default=1, metadata=allowed(Interval(int, 1)))
    # parameters drawn per iteration
    sub_dim: int = field(default=10_000, metadata=allowed(Interval(int, 1)))
    # clients removed per iteration: floor(filter_frac * f)
    filter_frac: float = field(default=1.0, metadata=allowed(Interval(float, 0)))
    # seeds the parameter draws together with the round counter
    seed: int = field(default=0, metadata=allowed(Interval(int)))

    def advance_round(
        self, round_: int, updates: Tensor, weights: Tensor | None, inputs: RoundInputs
    ) -> tuple[Tensor, Diagnostics]:
        n = updates.shape[0]
        removed = math.floor(self.filter_frac * self.f)
        if n <= removed:
            raise ValueError(
                f"dnc with f={self.f}, filter_frac={self.filter_frac} removes {removed} clients "
                f"per iteration but only {n} sent updates: lower f or filter_frac"
            )
        kept = torch.ones(n, dtype=torch.bool)
        score = torch.zeros(n, dtype=torch.float64)
        flagged = torch.zeros(n, dtype=torch.float64)
        for iteration in range(self.n_iters):
            gram = centered_gram(self._subsample(updates, round_, iteration)).cpu()
            scores = projection_scores(gram)
            order = ranking(scores, gram.diagonal())
            flags = torch.zeros(n, dtype=torch.bool)
            flags[order[n - removed :]] = True
            kept &= ~flags
            flagged += flags.double()
            score += scores / scores.max() if float(scores.max()) > 0 else scores
        if not bool(kept.any()):
            kept = flagged == flagged.min()
        selected = kept.nonzero().flatten()
        result, weight = row_mean(updates, selected)
        diagnostics = {
            "selected": selected,
            "effective_weight": weight,
            "columns": {"dnc_score": score / self.n_iters, "dnc_flagged": flagged},
        }
        return result, diagnostics

    def _subsample(self, updates: Tensor, round_: int, iteration: int) -> Tensor:
        """The columns drawn for one iteration (all when ``sub_dim >= d``)."""
        d = updates.shape[1]
        if self.sub_dim >= d:
            return updates
        rng = np.random.default_rng([self.seed, round_, iteration])
        columns = np.sort(rng.choice(d, size=self.sub_dim, replace=False))
        return updates[:, torch.from_numpy(columns).to(updates.device)]
