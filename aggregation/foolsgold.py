"""FoolsGold: down-weighting clients whose update histories look alike (sybils).

Fung, Yoon, Beschastnikh 2020, "The Limitations of Federated Learning in Sybil Settings"
(RAID, https://www.usenix.org/conference/raid2020/presentation/fung), Algorithm 1, as in
the authors' code (github.com/DistributedML/FoolsGold). Each client's history H_i is the
sum of all its updates so far (kept in the state, keyed by client id). Each round, over
the clients present:

1. ``cs_ij`` = cosine similarity of H_i and H_j, with ``cs_ii = 0``; ``v_i = max_j cs_ij``;
2. pardoning: ``cs_ij *= v_i / v_j`` where ``v_i < v_j`` (honest clients that merely
   resemble a sybil keep more of their weight);
3. ``alpha_i = 1 - max_j cs_ij``, clipped to [0, 1], divided by its maximum, 1 replaced by
   0.99;
4. logit: ``alpha_i = kappa (ln(alpha_i / (1 - alpha_i)) + 0.5)`` for alpha_i > 0, clipped
   to [0, 1] (alpha_i = 0 stays 0).

The update is the alpha-weighted mean ``sum_i alpha_i x_i / sum_i alpha_i``, zero when
every alpha is 0 (every client is some other's copy). The authors' first code returns the
unnormalised ``sum_i alpha_i x_i`` (a gradient step whose size grows with n); the
normalised mean, as in their deep-learning port, keeps model deltas on FedAvg's scale.
Not implemented: the optional importance weighting of output-layer features. A history
that is all zeros has cosine 0 with every other.

Client ids. ``requires_client_ids = True``: the server passes ``step(state, updates,
weights, client_ids=ids)`` with the stable id of each row; a client's history follows it
across rounds whatever rows it occupies, and clients not sampled keep theirs untouched.
The state ``{"history": {client_id: Tensor (d,)}}`` holds one vector per client ever
seen (n_total x d memory) and can be checkpointed. Client weights are ignored.

Parameters: ``kappa: float = 1.0`` (> 0, the logit's confidence). Shapes: ``(n, d), (n,)
| None -> (d,)``. Diagnostics: ``columns["foolsgold_weight"]`` alpha_i,
``columns["max_similarity"]`` v_i (before pardoning), ``effective_weight`` ``alpha_i /
sum_j alpha_j`` (exact: ``effective_weight @ updates``).

Example (first round, kappa = 1): updates ``[[1, 0], [1, 0], [0, 1]]`` (clients 0 and 1
identical). cs: ``cs_01 = 1``, every other 0; v = ``[1, 1, 0]``; no pardoning applies
(client 2's similarities are 0); alpha = ``1 - [1, 1, 0] = [0, 0, 1]`` -> 0.99 for
client 2 -> logit ``ln(99) + 0.5 = 5.1`` -> clipped to 1. FoolsGold returns ``[0, 1]``:
the two copies get no weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from aggregation.base import AggregationRule, RoundInputs, State, required
from aggregation.ops import gram
from aggregation.registry import register_aggregator
from registry.constraints import POSITIVE, allowed, check_fields

__all__ = ["FoolsGold", "foolsgold_weights"]


def foolsgold_weights(similarity: Tensor, kappa: float) -> tuple[Tensor, Tensor]:
    """``(alpha, v)`` from the clients' cosine similarities ``(n, n)`` float64 (steps 1-4)."""
    cs = similarity.clone()
    cs.fill_diagonal_(0.0)
    v = cs.max(dim=1).values
    pardon = v[:, None] < v[None, :]
    cs = torch.where(pardon, cs * v[:, None] / v[None, :].clamp_min(1e-300), cs)
    alpha = (1.0 - cs.max(dim=1).values).clamp(0.0, 1.0)
    if float(alpha.max()) == 0.0:
        return alpha, v
    alpha = alpha / alpha.max()
    alpha = torch.where(alpha == 1.0, 0.99, alpha)
    positive = alpha > 0
    logit = kappa * (torch.log(alpha / (1.0 - alpha)) + 0.5)
    alpha = torch.where(positive, logit, 0.0).clamp(0.0, 1.0)
    return alpha, v


@register_aggregator("foolsgold")
@dataclass(frozen=True, kw_only=True)
class FoolsGold(AggregationRule):
    """Mean weighted by how unlike every other client's history each history is."""

    requires_client_ids: ClassVar[bool] = True

    # confidence of the logit
    kappa: float = field(default=1.0, metadata=allowed(POSITIVE))

    def __post_init__(self) -> None:
        check_fields(self)

    def init_state(self) -> State:
        return {"history": {}}

    def advance(
        self, state: State, updates: Tensor, weights: Tensor | None, inputs: RoundInputs
    ) -> tuple[Tensor, State, dict[str, Any]]:
        meaning = "the stable id of each row (n distinct ints)"
        ids = required(inputs.client_ids, "foolsgold", "client_ids", meaning)
        history = dict(state.get("history", {}))
        for row, client in enumerate(ids):
            past = history.get(client)
            history[client] = updates[row].clone() if past is None else past + updates[row]
        g = gram(torch.stack([history[client] for client in ids]))
        norms = g.diagonal().sqrt()
        similarity = (g / (norms[:, None] * norms[None, :])).nan_to_num(nan=0.0)
        alpha, v = foolsgold_weights(similarity, self.kappa)
        total = float(alpha.sum())
        weight = alpha / total if total > 0 else alpha.clone()
        diagnostics = {
            "effective_weight": weight,
            "columns": {"foolsgold_weight": alpha, "max_similarity": v},
        }
        return weight.to(updates) @ updates, {"history": history}, diagnostics
