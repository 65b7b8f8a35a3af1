"""The clients' centered Gram matrix in one pass over the updates on a CUDA GPU (Triton).

Krum, Multi-Krum, Bulyan and the geometric median start from
:func:`aggregation.ops.centered_gram`. Its torch path reads each block of columns three
times and writes it once (the column mean, the centered copy, the matrix product). Here
a fixed number of programs each walk their share of the columns: load a tile of
all n clients × ``BLOCK`` columns, subtract the tile's column means in registers (padding
rows stay zero), and accumulate the tile's Gram matrix in float32 with ``tl.dot``. The
per-program partial matrices are summed in float64 on the host, as the torch path sums
its blocks. The updates are read once.

``PRECISION``: "tf32x3" splits each float32 into two TF32 halves and sums three tensor-
core products (dropping the small × small one), which is float32-accurate (relative
error ~2^-22 a product, float32 accumulation) and several times faster than plain
float32 ("ieee") products on the FMA units; single "tf32" (10-bit mantissas) is never
used. The launch settings come from ``python -m benchmarks.speed.gpu_kernels_tune --gram``.

Only imported where Triton is installed; :func:`aggregation.ops.gram_kernel_for` decides.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["MAX_CLIENTS", "centered_gram"]

MAX_CLIENTS = 128  # a 128 x 128 float32 accumulator per program
PROGRAMS_PER_SM = 4
BLOCK = 64  # columns per tile
PRECISION = "tf32x3"


@triton.jit
def _centered_gram_kernel(  # noqa: PLR0913  (Triton kernel: takes pointers and scalars only)
    updates_ptr,
    partial_ptr,
    n,
    d,
    row_stride,
    N_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    TILES: tl.constexpr,  # tiles per program (a constant per model size: one compile)
    PRECISION: tl.constexpr,
):
    program = tl.program_id(0)
    rows = tl.arange(0, N_PAD)
    row_ok = rows < n
    first = program.to(tl.int64) * (TILES * BLOCK)
    gram = tl.zeros((N_PAD, N_PAD), dtype=tl.float32)
    for tile_index in range(TILES):
        columns = first + tile_index * BLOCK + tl.arange(0, BLOCK)
        tile = tl.load(
            updates_ptr + rows[:, None].to(tl.int64) * row_stride + columns[None, :],
            mask=row_ok[:, None] & (columns < d)[None, :],
            other=0.0,
        ).to(tl.float32)
        mean = tl.sum(tile, axis=0) / n
        centered = tl.where(row_ok[:, None], tile - mean[None, :], 0.0)
        gram += tl.dot(centered, tl.trans(centered), input_precision=PRECISION)
    tl.store(partial_ptr + program * N_PAD * N_PAD + rows[:, None] * N_PAD + rows[None, :], gram)


def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":  # Triton's interpreter (TRITON_INTERPRET=1) runs on the CPU
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def centered_gram(updates: Tensor) -> Tensor:
    """Gram matrix ``(n, n)`` float64 of ``updates`` (n, d) minus their column mean
    (:func:`aggregation.ops.centered_gram`'s definition)."""
    n, d = updates.shape
    if updates.stride(1) != 1:
        updates = updates.contiguous()
    n_pad = max(16, triton.next_power_of_2(n))  # tl.dot needs sides of 16 or more
    programs = min(
        triton.cdiv(d, BLOCK),
        PROGRAMS_PER_SM * _multiprocessors(updates.device),
    )
    tiles = triton.cdiv(triton.cdiv(d, programs), BLOCK)
    programs = triton.cdiv(d, tiles * BLOCK)
    partial = torch.empty(programs, n_pad, n_pad, dtype=torch.float32, device=updates.device)
    _centered_gram_kernel[(programs,)](
        updates,
        partial,
        n,
        d,
        updates.stride(0),
        N_PAD=n_pad,
        BLOCK=BLOCK,
        TILES=tiles,
        PRECISION=PRECISION,
        num_warps=4 if n_pad <= 64 else 8,
    )
    gram = partial.to(torch.float64).sum(dim=0)[:n, :n]
    return (gram + gram.T) / 2
