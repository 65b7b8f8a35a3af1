"""Median, trimmed mean and EMA in one pass over the updates on a CUDA GPU (Triton).

The torch path of these rules sorts every column (``torch.sort(dim=0)`` on a GPU), writes
the sorted copy out and reads it back for the statistic, many times the cost of reading
the updates once. Here one Triton program loads a tile of
``BLOCK`` columns × all n clients into registers (padded to a power of two with +inf,
which sorts last), sorts it along the clients with Triton's bitonic ``tl.sort``, and
computes the rule's statistic from the sorted tile before storing one value per column:
the updates are read once and the result written once.

Each statistic follows its torch path operation for operation (same order statistics,
same interpolation formulas), so the two agree to float32 rounding; the rules' CUDA
contract tests and ``benchmarks/speed/aggregation.py``'s reference check hold them to it.
Inputs must be finite (the server drops non-finite clients before aggregating:
:func:`aggregation.base.drop_non_finite`); float16/bfloat16 are computed in float32 and
float64 is left to the torch path.

Only imported where Triton is installed (the CUDA images); :func:`aggregation.ops.
order_kernels_for` decides.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["MAX_CLIENTS", "estimated_mean", "median", "trimmed_mean"]

MAX_CLIENTS = 256  # a tile of 256 clients × 8 columns still fits in registers
_MEDIAN, _TRIMMED, _EMA = 0, 1, 2
# Padded clients × columns per program, and warps per program: one warp keeps tl.sort
# along the clients in one warp's registers (python -m benchmarks.speed.gpu_kernels_tune --order).
TILE_ELEMENTS = 2048
NUM_WARPS = 1


@triton.jit
def _row(tile, rows, index):
    """Per column, the tile's value in row ``index`` (the same row for every column)."""
    return tl.sum(tl.where(rows[None, :] == index, tile, 0.0), axis=1)


@triton.jit
def _rows(tile, rows, index):
    """Per column ``c``, the tile's value in row ``index[c]``."""
    return tl.sum(tl.where(rows[None, :] == index[:, None], tile, 0.0), axis=1)


@triton.jit
def _window_quantile(tile, rows, start, count, q: tl.constexpr):
    """Linear-interpolation q-quantile of the sorted rows ``start .. start+count-1`` per
    column (:func:`aggregation.ema.window_quantile`)."""
    position = start.to(tl.float32) + q * (count - 1).to(tl.float32)
    low = tl.floor(position)
    high = tl.minimum(low + 1, (start + count - 1).to(tl.float32))
    below = _rows(tile, rows, low.to(tl.int32))
    above = _rows(tile, rows, high.to(tl.int32))
    return below + (position - low) * (above - below)


@triton.jit
def _order_statistic_kernel(  # noqa: PLR0913  (Triton kernel: takes pointers and scalars only)
    updates_ptr,
    out_ptr,
    n,
    d,
    row_stride,
    trim,  # trimmed mean: values dropped at each end
    fence,  # EMA: k, the fence width in IQRs
    q1_low,  # EMA: Q1 = row q1_low + q1_fraction * (next row - row q1_low)
    q1_fraction,
    q3_low,
    q3_fraction,
    below,  # EMA: rows before this one may lie below the lower fence
    inside,  # EMA: rows from this one on may lie above the upper fence
    STATISTIC: tl.constexpr,
    N_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    columns = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rows = tl.arange(0, N_PAD)
    in_range = columns < d
    offsets = rows[None, :].to(tl.int64) * row_stride + columns[:, None]
    tile = tl.load(
        updates_ptr + offsets,
        mask=in_range[:, None] & (rows[None, :] < n),
        other=float("inf"),
    ).to(tl.float32)
    tile = tl.sort(tile, dim=1)  # (BLOCK, N_PAD): each column's values ascending
    if STATISTIC == 0:  # median: the middle value, or the mean of the two middle ones
        result = _row(tile, rows, (n - 1) // 2) * 0.5 + _row(tile, rows, n // 2) * 0.5
    elif STATISTIC == 1:  # trimmed mean of rows trim .. n - trim - 1
        kept = (rows[None, :] >= trim) & (rows[None, :] < n - trim)
        result = tl.sum(tl.where(kept, tile, 0.0), axis=1) / (n - 2 * trim)
    else:  # EMA (aggregation.ema.EstimatedMean._estimate)
        low1 = _row(tile, rows, q1_low)
        q1 = low1 + q1_fraction * (_row(tile, rows, tl.minimum(q1_low + 1, n - 1)) - low1)
        low3 = _row(tile, rows, q3_low)
        q3 = low3 + q3_fraction * (_row(tile, rows, tl.minimum(q3_low + 1, n - 1)) - low3)
        iqr = q3 - q1
        lower = q1 - fence * iqr
        upper = q3 + fence * iqr
        under = (rows[None, :] < below) & (tile < lower[:, None])
        within = (rows[None, :] >= inside) & (rows[None, :] < n) & (tile <= upper[:, None])
        start = tl.sum(under.to(tl.int32), axis=1)
        count = inside + tl.sum(within.to(tl.int32), axis=1) - start
        empty = count == 0
        start = tl.where(empty, 0, start)
        count = tl.where(empty, n, count)
        kept_q1 = _window_quantile(tile, rows, start, count, 0.25)
        middle = _row(tile, rows, (n - 1) // 2) * 0.5 + _row(tile, rows, n // 2) * 0.5
        kept_q3 = _window_quantile(tile, rows, start, count, 0.75)
        weight = 0.70 + 0.39 / count.to(tl.float32)
        result = middle + weight * ((kept_q1 + kept_q3) / 2 - middle)
    tl.store(out_ptr + columns, result.to(out_ptr.dtype.element_ty), mask=in_range)


def _launch(updates: Tensor, statistic: int, **scalars: float) -> Tensor:
    n, d = updates.shape
    if updates.stride(1) != 1:
        updates = updates.contiguous()
    n_pad = triton.next_power_of_2(n)
    block = max(8, TILE_ELEMENTS // n_pad)
    out = torch.empty(d, dtype=updates.dtype, device=updates.device)
    arguments = {
        "trim": 0,
        "fence": 0.0,
        "q1_low": 0,
        "q1_fraction": 0.0,
        "q3_low": 0,
        "q3_fraction": 0.0,
        "below": 0,
        "inside": 0,
        **scalars,
    }
    grid = (triton.cdiv(d, block),)
    _order_statistic_kernel[grid](
        updates,
        out,
        n,
        d,
        updates.stride(0),
        STATISTIC=statistic,
        N_PAD=n_pad,
        BLOCK=block,
        num_warps=NUM_WARPS,
        **arguments,
    )
    return out


def median(updates: Tensor) -> Tensor:
    """Coordinate-wise median of ``updates`` (n, d) -> (d,)."""
    return _launch(updates, _MEDIAN)


def trimmed_mean(updates: Tensor, trim: int) -> Tensor:
    """Mean of the middle ``n - 2 trim`` values of every column."""
    return _launch(updates, _TRIMMED, trim=trim)


def estimated_mean(updates: Tensor, fence: float) -> Tensor:
    """EMA's estimate per column: IQR fences of width ``fence``, then Luo et al.'s mean."""
    n = updates.shape[0]
    q1_position, q3_position = 0.25 * (n - 1), 0.75 * (n - 1)
    return _launch(
        updates,
        _EMA,
        fence=float(fence),
        q1_low=int(q1_position),
        q1_fraction=q1_position - int(q1_position),
        q3_low=int(q3_position),
        q3_fraction=q3_position - int(q3_position),
        below=math.ceil(q1_position),
        inside=math.floor(q3_position) + 1,
    )
