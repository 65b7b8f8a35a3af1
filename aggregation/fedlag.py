"""FedLag: per-parameter Gaussian likelihood fusion over pairwise midpoints.

FedLag (ITM Web of Conferences 82, 02010, 2026, https://doi.org/10.1051/itmconf/20268202010;
../shared/papers/fedlag.txt), Algorithm 1 (lines 10-30) and Sections 3.2-3.4. For every
parameter k, over the n clients' values ``g_1k .. g_nk``:

- ``sigma² = (1/n) sum_i (g_ik - mu_k)² + eps`` (population variance plus eps, line 15);
- candidates: every pairwise midpoint ``D = (g_ik + g_jk) / 2``, ``i < j`` (lines 18-19);
- score ``L(D) = sum_i w_i N(D | g_ik, sigma²)`` with ``w`` the clients' data shares (the
  normalised weights; equal when None; line 22);
- the fused value is the candidate with the highest score (lines 20-27); scores equal to
  within a relative 1e-12 (float64 rounding) are ties, resolved to the smallest candidate.

With one client there is no pair and the fused value is that client's value (the
paper's initial 0 would be no aggregate at all). ``eps`` is absolute, in squared update
units: keep it far below the spread of honest values (default 1e-12).

Exact computation. The shared sigma makes the score factor through the clients' Gaussian
kernel. With ``u = (g - mu) / (2 sigma)`` and ``K_ai = exp(-(u_a - u_i)²)``,

    L(D_ab) ∝ sum_i w_i exp(-(u_a + u_b - 2 u_i)² / 2) = K_ab^(-1/2) (K diag(w) K)_ab,

so all n(n-1)/2 scores of a parameter cost n² exponentials and one n x n x n product,
not n³/2 exponentials. The scores are screened in float32 (when n <= 80 and float32
matmuls run at full precision; float64 otherwise), with a rigorous relative error bound
``m = eps32 (64 U² + 2n + 32)``, ``U = max |u|``: every candidate within ``2.5m`` of the
screened maximum is rescored exactly (float64 direct sum ``sum_i w_i exp(-(D - g_i)² /
(2 sigma²))``), and the choice is made on the exact scores. The result equals the direct
evaluation of every candidate (``benchmarks/speed/aggregation.py`` checks it). Beyond n = 600
(where the float64 kernel could underflow) every midpoint is scored directly. Parameters
are processed in blocks so memory stays O(n·d) + O(block·n²).

``max_candidates``: for very large n, score only that many candidate pairs, drawn without
replacement among the pairs of order statistics ``(x_(r), x_(s))``, r < s, of each
parameter (so the draw does not depend on the client order), with a generator seeded by
``(seed, round)``; ``round`` counts calls and lives in the state, so a resumed run draws
the same pairs. ``None`` (default) evaluates every pair.

Parameters: ``eps: float = 1e-12`` (> 0), ``max_candidates: int | None = None`` (>= 1),
``seed: int = 0``. State: ``{"round": int}``. Shapes: ``(n, d), (n,) | None -> (d,)``.

Diagnostics: ``effective_weight`` (n,), each client's responsibility for the fused value
averaged over the coordinates: ``w_i N(D | g_i, sigma²) / L(D)`` at the chosen D (its
share of the winning likelihood; sums to 1). An attribution: D itself is the midpoint of
two values, so the output is no weighted mean of the clients with these weights.

Example (equal weights): one parameter with values ``0, 1, 1, 10``: mu = 3, sigma² =
16.5; the candidates are 0.5 (twice), 1, 5 and 5.5 (twice);
``L(1) ∝ exp(-1/33) + 2 + exp(-81/33) = 3.0560`` beats ``L(0.5) = 3.0422`` and
``L(5) = 2.1692``, so FedLag returns ``1`` (the mean is 3). The responsibilities at 1 are
``exp(-1/33), 1, 1, exp(-81/33)`` over their sum 3.0560: ``[0.3175, 0.3272, 0.3272,
0.0281]``, the effective weights of this one-coordinate example.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aggregation.base import Diagnostics, RoundInputs, RoundSeededRule, normalised_weights
from aggregation.ops import block_columns, column_blocks, fedlag_kernel_for, sort_columns
from aggregation.registry import register_aggregator
from registry.constraints import POSITIVE, Interval, allowed

__all__ = ["FedLag", "direct_scores", "fedlag_direct"]

TIE = 1e-12  # relative score difference under which two candidates are tied
_SCREEN32_MAX_N = 80  # float32 screening: exp(-(u_a - u_i)²) stays normal (n - 1 < 87)
_FACTOR64_MAX_N = 600  # float64 screening: exp(-(n - 1)) stays normal


def direct_scores(values: Tensor, candidates: Tensor, weights: Tensor, var: Tensor) -> Tensor:
    """Exact FedLag scores (without the constant 1/sqrt(2 pi sigma²)) in float64.

    ``values`` (c, n) client values, ``candidates`` (c, k), ``weights`` (n,), ``var``
    (c, 1) sigma² per parameter -> (c, k) ``sum_i w_i exp(-(D - g_i)² / (2 sigma²))``.
    """
    diff = candidates[:, :, None] - values[:, None, :]  # (c, k, n)
    return (torch.exp(diff.square_().div_(-2.0 * var[:, :, None])) * weights).sum(dim=2)


def _choose(index: Tensor, candidates: Tensor, scores: Tensor, count: int) -> Tensor:
    """For each of ``count`` parameters, the smallest of its candidates whose exact score
    is within TIE of its best. ``index`` (K,) says which parameter each candidate belongs to."""
    best = torch.full((count,), -math.inf, dtype=scores.dtype, device=scores.device)
    best = best.scatter_reduce(0, index, scores, reduce="amax")
    tied = scores >= best[index] * (1.0 - TIE)
    chosen = torch.full((count,), math.inf, dtype=candidates.dtype, device=candidates.device)
    return chosen.scatter_reduce(0, index[tied], candidates[tied], reduce="amin")


def _moments(values: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Column mean (c, 1) and sigma² = population variance + eps (c, 1) of (c, n) values."""
    mean = values.mean(dim=1, keepdim=True)
    var = (values - mean).square().mean(dim=1, keepdim=True) + eps
    return mean, var


def fedlag_direct(values: Tensor, weights: Tensor, eps: float) -> Tensor:
    """Reference FedLag of a block ``(c, n)`` float64: every midpoint scored directly
    (n³/2 exponentials per parameter). Returns (c,) float64."""
    c, n = values.shape
    if n == 1:
        return values[:, 0].clone()
    _, var = _moments(values, eps)
    left, right = torch.triu_indices(n, n, 1, device=values.device)
    candidates = (values[:, left] + values[:, right]) / 2  # (c, C)
    scores = torch.empty_like(candidates)
    step = max(1, (1 << 22) // (c * n))
    for part in column_blocks(candidates.shape[1], step):
        scores[:, part] = direct_scores(values, candidates[:, part], weights, var)
    index = torch.arange(c, device=values.device)[:, None].expand_as(scores)
    return _choose(index.reshape(-1), candidates.reshape(-1), scores.reshape(-1), c)


def _screen_dtype(n: int, device: torch.device) -> torch.dtype | None:
    """Precision of the factorised screening, or None when only the direct sum is safe."""
    full_fp32 = torch.get_float32_matmul_precision() == "highest"
    if device.type == "cuda":
        full_fp32 = full_fp32 and not torch.backends.cuda.matmul.allow_tf32
    if n <= _SCREEN32_MAX_N and full_fp32:
        return torch.float32
    if n <= _FACTOR64_MAX_N:
        return torch.float64
    return None


def _fedlag_factorised(values: Tensor, weights: Tensor, eps: float, screen: torch.dtype) -> Tensor:
    """Exact FedLag of a block ``(c, n)`` float64 via the kernel factorisation, screened
    in ``screen`` precision, the survivors rescored directly in float64."""
    c, n = values.shape
    mean, var = _moments(values, eps)
    u64 = (values - mean) * torch.rsqrt(4.0 * var)  # (c, n)
    u = u64.to(screen)
    kernel = u[:, :, None] - u[:, None, :]  # (c, n, n)
    kernel = kernel.square_().neg_().exp_()  # K_ai = exp(-(u_a - u_i)²)
    mixed = torch.bmm(kernel * weights.to(screen), kernel)  # (K diag(w) K)_ab
    scores = mixed.mul_(kernel.rsqrt_())  # L(D_ab) up to a constant, symmetric in a, b
    scores.diagonal(dim1=1, dim2=2).zero_()  # a = b is no candidate
    flat = scores.view(c, n * n)
    best = flat.amax(dim=1, keepdim=True).to(torch.float64)  # (c, 1)
    unit = torch.finfo(screen).eps / 2
    bound = unit * (64.0 * u64.abs().amax(dim=1, keepdim=True).square() + 2 * n + 32)
    # 4 more units cover the rounding of the threshold itself to the screening dtype.
    threshold = best * (1.0 - 2.5 * bound - TIE - 4.0 * unit)
    # A vanishing screened maximum (only with nearly all weight on far clients) gives no
    # relative guarantee: rescore every pair of that parameter.
    threshold = torch.where(best < torch.finfo(screen).tiny * 2**24, 0.0, threshold)
    index, pair = (flat >= threshold.to(screen)).nonzero(as_tuple=True)
    left, right = pair // n, pair % n
    upper = left < right  # each pair once (the scores are symmetric), never a = b
    index, left, right = index[upper], left[upper], right[upper]
    candidates = (values[index, left] + values[index, right]) / 2  # (K,)
    exact = torch.empty_like(candidates)
    step = max(1, (1 << 22) // n)
    for part in column_blocks(index.numel(), step):
        rows = index[part]
        exact[part] = direct_scores(values[rows], candidates[part, None], weights, var[rows])[:, 0]
    return _choose(index, candidates, exact, c)


def _fedlag_sampled(values: Tensor, weights: Tensor, eps: float, pairs: Tensor) -> Tensor:
    """FedLag of a block ``(c, n)`` float64 over the order-statistic ``pairs`` (2, k)."""
    c, _ = values.shape
    _, var = _moments(values, eps)
    ordered = sort_columns(values.T).T  # (c, n) each row ascending
    candidates = (ordered[:, pairs[0]] + ordered[:, pairs[1]]) / 2  # (c, k)
    scores = direct_scores(values, candidates, weights, var)
    index = torch.arange(c, device=values.device)[:, None].expand_as(scores)
    return _choose(index.reshape(-1), candidates.reshape(-1), scores.reshape(-1), c)


@register_aggregator("fedlag")
@dataclass(frozen=True, kw_only=True)
class FedLag(RoundSeededRule):
    """Most likely pairwise midpoint under the clients' shared-sigma Gaussians."""

    # added to the population variance (squared update units)
    eps: float = field(default=1e-12, metadata=allowed(POSITIVE))
    # None: every pair (exact); else a seeded subsample
    max_candidates: int | None = field(default=None, metadata=allowed(Interval(int, 1), None))
    # seeds the subsample together with the round counter
    seed: int = field(default=0, metadata=allowed(Interval(int)))

    def advance_round(
        self, round_: int, updates: Tensor, weights: Tensor | None, inputs: RoundInputs
    ) -> tuple[Tensor, Diagnostics]:
        n, d = updates.shape
        w = normalised_weights(updates, weights).to(torch.float64)
        n_pairs = n * (n - 1) // 2
        pairs = None
        if self.max_candidates is not None and self.max_candidates < n_pairs:
            rng = np.random.default_rng([self.seed, round_])
            chosen = np.sort(rng.choice(n_pairs, size=self.max_candidates, replace=False))
            pairs = torch.triu_indices(n, n, 1)[:, torch.from_numpy(chosen)].to(updates.device)
        screen = _screen_dtype(n, updates.device)
        kernel = fedlag_kernel_for(updates)
        if kernel is not None and pairs is None and screen == torch.float32 and n > 1:
            out = self._on_gpu(kernel, updates, w)
            return out, self._attribution(updates, out, w)
        if pairs is not None:
            per_column = 8 * n * (3 * pairs.shape[1] + 4)
        elif screen is not None:
            per_column = 6 * n * n * screen.itemsize
        else:
            per_column = 8 * 4 * n_pairs
        out = torch.empty(d, dtype=updates.dtype, device=updates.device)
        for columns in column_blocks(d, block_columns(updates, per_column)):
            values = updates[:, columns].T.to(torch.float64).contiguous()  # (c, n)
            if n == 1:
                fused = values[:, 0]
            elif pairs is not None:
                fused = _fedlag_sampled(values, w, self.eps, pairs)
            elif screen is not None:
                fused = _fedlag_factorised(values, w, self.eps, screen)
            else:
                fused = fedlag_direct(values, w, self.eps)
            out[columns] = fused.to(updates.dtype)
        return out, self._attribution(updates, out, w)

    def _attribution(self, updates: Tensor, out: Tensor, w: Tensor) -> dict[str, Any]:
        """The clients' responsibilities for the fused values, averaged over the
        parameters (computed by blocks from the updates and the result)."""
        n, d = updates.shape
        total = torch.zeros(n, dtype=torch.float64)
        for columns in column_blocks(d, block_columns(updates, 8 * 3 * n)):
            values = updates[:, columns].T.to(torch.float64)  # (c, n)
            _, var = _moments(values, self.eps)
            fused = out[columns].to(torch.float64)[:, None]  # (c, 1)
            logits = w.log() - (fused - values).square() / (2.0 * var)
            total += torch.softmax(logits, dim=1).sum(dim=0).cpu()
        return {"effective_weight": total / d, "columns": {}}

    def _on_gpu(self, kernel: Any, updates: Tensor, w: Tensor) -> Tensor:
        """The Triton kernels (:mod:`aggregation.fedlag_kernel`); the few parameters whose
        survivors overflow its lists go through the torch path."""
        out, unresolved = kernel.fedlag(updates, w, self.eps, TIE)
        if unresolved.numel():
            values = updates[:, unresolved].T.to(torch.float64).contiguous()
            fused = _fedlag_factorised(values, w, self.eps, torch.float32)
            out[unresolved] = fused.to(updates.dtype)
        return out
