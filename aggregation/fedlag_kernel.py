"""Exact FedLag on a CUDA GPU: the screening and the exact rescoring as two Triton kernels.

The torch path (:func:`aggregation.fedlag._fedlag_factorised`) screens every parameter's
n(n-1)/2 midpoints with batched n x n products over (block, n, n) intermediates and then
rescores the survivors directly in float64, most of its time moving those intermediates
through memory. Here the same two steps keep them in registers:

1. ``_screen_kernel``, one program per parameter: the moments in float64, ``u``, the
   Gaussian kernel ``K`` (float32), ``K diag(w) K`` as one ``tl.dot`` in full float32
   ("ieee"), the screened scores ``K_ab^(-1/2) (K diag(w) K)_ab``, and the same rigorous
   threshold as the torch path (:mod:`aggregation.fedlag`: ``m = eps32 (64 U² + 2n + 32)``,
   within ``2.5 m`` of the screened maximum; ``exp`` and ``rsqrt`` of K are taken in float64
   and rounded, at least as accurate as the torch path's float32 ones).
   The surviving pairs ``a < b`` are compacted into a short list per parameter (at most
   ``MAX_SURVIVORS``; their count is kept).
2. ``_choose_kernel``, a block of parameters per program: each survivor's midpoint and its
   exact float64 score ``sum_i w_i exp(-(D - g_i)² / (2 sigma²))``, then the torch path's
   choice: the smallest candidate within a relative ``TIE`` of the best exact score.

Parameters with more survivors than the list holds (ties, or many clients: at n = 50 on
Gaussian updates about 1 in 1,000 has more than 32) are returned to the caller, which runs
the torch path on just those. The result is the torch path's, which is the direct
evaluation of every midpoint (the CUDA tests assert equality; while the kernels took up
to 64 clients, they held at n = 50 and 64 too).

The kernels are faster than the torch path only for few clients: with 64 x 64 tiles each
program holds several float32 and float64 temporaries, probably more than its registers
(not profiled), so they are used for at most ``MAX_CLIENTS`` clients
(``benchmarks/speed/aggregation.py``; docs/results.md). Going further needs smaller live tiles
(rows of K in turn, float32 exp with a widened bound) or tensor-core products with a
bound that covers them.

Only imported where Triton is installed; :func:`aggregation.ops.fedlag_kernel_for`
decides (CUDA, float32/half, 2..MAX_CLIENTS clients, every pair scored, full-float32
matmuls).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["MAX_CLIENTS", "MAX_SURVIVORS", "fedlag"]

MAX_CLIENTS = 16  # beyond it the torch path was faster on an H100
MAX_SURVIVORS = 16  # survivors listed per parameter (python -m benchmarks.speed.gpu_kernels_tune)
CHUNK = 1 << 21  # parameters per pair of launches (bounds the survivor lists' memory)
CHOOSE_BLOCK = 32  # parameters per program of _choose_kernel
SCREEN_WARPS = 4  # (python -m benchmarks.speed.gpu_kernels_tune --fedlag)


@triton.jit
def _screen_kernel(  # noqa: PLR0913  (Triton kernel: takes pointers and scalars only)
    updates_ptr,
    weights32_ptr,
    codes_ptr,
    counts_ptr,
    var_ptr,
    n,
    row_stride,
    eps,
    unit,
    tie,
    vanishing,
    N_PAD: tl.constexpr,
    MAX_SURVIVORS: tl.constexpr,
):
    column = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, N_PAD)
    client = rows < n
    g = tl.load(updates_ptr + rows.to(tl.int64) * row_stride + column, mask=client, other=0.0)
    g = g.to(tl.float64)
    mean = tl.sum(g, axis=0) / n
    centered = tl.where(client, g - mean, 0.0)
    var = tl.sum(centered * centered, axis=0) / n + eps
    u64 = centered / tl.sqrt(4.0 * var)
    u = u64.to(tl.float32)
    spread = tl.max(tl.abs(u64), axis=0)
    difference = u[:, None] - u[None, :]
    # K_ai = exp(-(u_a - u_i)²); exp and rsqrt in float64, then rounded: Triton's float32
    # exp is an approximation (ex2.approx) that the threshold's bound does not cover.
    kernel = tl.exp(-(difference * difference).to(tl.float64)).to(tl.float32)
    weights = tl.load(weights32_ptr + rows, mask=client, other=0.0)
    mixed = tl.dot(kernel * weights[None, :], kernel, input_precision="ieee")
    scores = mixed * (1.0 / tl.sqrt(kernel.to(tl.float64))).to(tl.float32)
    pair_of_clients = client[:, None] & client[None, :]
    off_diagonal = pair_of_clients & (rows[:, None] != rows[None, :])
    best = tl.max(tl.max(tl.where(off_diagonal, scores, 0.0), axis=1), axis=0).to(tl.float64)
    bound = unit * (64.0 * spread * spread + 2 * n + 32)
    threshold = best * (1.0 - 2.5 * bound - tie - 4.0 * unit)
    threshold = tl.where(best < vanishing, 0.0, threshold).to(tl.float32)
    survives = (pair_of_clients & (rows[:, None] < rows[None, :]) & (scores >= threshold)).to(
        tl.int32
    )
    flat = tl.reshape(survives, (N_PAD * N_PAD,))
    slot = tl.cumsum(flat, axis=0) - 1
    code = tl.arange(0, N_PAD * N_PAD)  # a * N_PAD + b
    tl.store(
        codes_ptr + column * MAX_SURVIVORS + slot,
        code,
        mask=(flat > 0) & (slot < MAX_SURVIVORS),
    )
    tl.store(counts_ptr + column, tl.sum(flat, axis=0))
    tl.store(var_ptr + column, var)


@triton.jit
def _choose_kernel(  # noqa: PLR0913  (Triton kernel: takes pointers and scalars only)
    updates_ptr,
    weights_ptr,
    codes_ptr,
    counts_ptr,
    var_ptr,
    out_ptr,
    n,
    d,
    row_stride,
    tie,
    N_PAD: tl.constexpr,
    MAX_SURVIVORS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    columns = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = columns < d
    count = tl.load(counts_ptr + columns, mask=in_range, other=0)
    slots = tl.arange(0, MAX_SURVIVORS)
    listed = in_range[:, None] & (slots[None, :] < count[:, None])
    code = tl.load(codes_ptr + columns[:, None] * MAX_SURVIVORS + slots[None, :], mask=listed)
    low = (code // N_PAD).to(tl.int64)
    high = (code % N_PAD).to(tl.int64)
    g_low = tl.load(updates_ptr + low * row_stride + columns[:, None], mask=listed, other=0.0)
    g_high = tl.load(updates_ptr + high * row_stride + columns[:, None], mask=listed, other=0.0)
    candidates = (g_low.to(tl.float64) + g_high.to(tl.float64)) / 2
    scale = -2.0 * tl.load(var_ptr + columns, mask=in_range, other=1.0)
    exact = tl.zeros((BLOCK, MAX_SURVIVORS), dtype=tl.float64)
    for i in range(N_PAD):  # padded clients weigh 0
        weight = tl.load(weights_ptr + i, mask=i < n, other=0.0)
        g = tl.load(updates_ptr + i * row_stride + columns, mask=in_range & (i < n), other=0.0)
        difference = candidates - g.to(tl.float64)[:, None]
        exact += tl.exp(difference * difference / scale[:, None]) * weight
    exact = tl.where(listed, exact, -float("inf"))
    best = tl.max(exact, axis=1)
    tied = listed & (exact >= best[:, None] * (1.0 - tie))
    chosen = tl.min(tl.where(tied, candidates, float("inf")), axis=1)
    tl.store(out_ptr + columns, chosen.to(out_ptr.dtype.element_ty), mask=in_range)


def fedlag(updates: Tensor, weights: Tensor, eps: float, tie: float) -> tuple[Tensor, Tensor]:
    """FedLag of ``updates`` (n, d) with normalised float64 ``weights`` (n,): ``(out,
    unresolved)``, where ``unresolved`` lists the parameters (long, ascending) whose
    survivors overflowed the list; their entries of ``out`` are not set."""
    n, d = updates.shape
    if updates.stride(1) != 1:
        updates = updates.contiguous()
    device = updates.device
    n_pad = max(16, triton.next_power_of_2(n))  # tl.dot needs sides of 16 or more
    weights64 = weights.to(device=device, dtype=torch.float64).contiguous()
    weights32 = weights64.to(torch.float32)
    out = torch.empty(d, dtype=updates.dtype, device=device)
    unresolved = []
    unit = torch.finfo(torch.float32).eps / 2
    vanishing = torch.finfo(torch.float32).tiny * 2**24
    for start in range(0, d, CHUNK):
        part = updates[:, start : start + CHUNK]
        c = part.shape[1]
        codes = torch.empty(c, MAX_SURVIVORS, dtype=torch.int32, device=device)
        counts = torch.empty(c, dtype=torch.int32, device=device)
        var = torch.empty(c, dtype=torch.float64, device=device)
        _screen_kernel[(c,)](
            part, weights32, codes, counts, var, n, part.stride(0), eps, unit, tie, vanishing,
            N_PAD=n_pad, MAX_SURVIVORS=MAX_SURVIVORS, num_warps=SCREEN_WARPS,
        )  # fmt: skip
        _choose_kernel[(triton.cdiv(c, CHOOSE_BLOCK),)](
            part, weights64, codes, counts, var, out[start : start + c], n, c, part.stride(0),
            tie, N_PAD=n_pad, MAX_SURVIVORS=MAX_SURVIVORS, BLOCK=CHOOSE_BLOCK,
        )  # fmt: skip
        # no survivor cannot happen (the best pair always survives) unless the screen
        # went wrong; the torch path then decides too
        overflow = (counts > MAX_SURVIVORS) | (counts == 0)
        unresolved.append(overflow.nonzero()[:, 0] + start)
    return out, torch.cat(unresolved)
