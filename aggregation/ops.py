"""Column-wise building blocks shared by the rules (internal to ``aggregation``).

Every rule works on stacked updates ``(n_clients, n_params)``. The helpers here keep the
work vectorised over parameters and the memory bounded: they walk the parameters in
column blocks (``column_blocks``), so no rule allocates more than O(n·d) plus
O(block·n²), and they hold the two primitives most rules reduce to:

- ``sort_columns``: each column sorted across clients. On CPU a Batcher odd-even merge
  sorting network of ``torch.minimum``/``torch.maximum`` over whole rows (about 5x faster
  than ``torch.sort(dim=0)`` for n = 50, whose per-column overhead dominates); on other
  devices ``torch.sort``. Both give the same values.
- ``centered_gram`` / ``squared_distances``: the clients' Gram matrix after subtracting
  the column mean block by block (so a common offset of the updates costs no precision),
  accumulated in float64, and the pairwise squared distances derived from it.
- ``window_shares`` / ``point_shares``: which clients a coordinate-wise rule's output is
  made of, per column (the per-client attribution behind every such rule's
  ``effective_weight`` and trimmed share), by comparisons with the sorted values only.
- On a CUDA GPU with Triton installed, one-pass kernels replace the torch paths where
  they apply (float32 or half precision, not too many clients): ``centered_gram`` uses
  :mod:`aggregation.gram_kernel`, ``order_kernels_for`` hands the rules that reduce
  sorted columns to one value (median, trimmed mean, EMA) :mod:`aggregation.order_kernels`,
  and ``fedlag_kernel_for`` hands FedLag :mod:`aggregation.fedlag_kernel`.
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
import os
import shutil
from collections.abc import Iterator
from types import ModuleType

import torch
from torch import Tensor

__all__ = [
    "WeightedColumns",
    "block_columns",
    "centered_gram",
    "column_blocks",
    "compute_dtype",
    "fedlag_kernel_for",
    "gram",
    "krum_scores",
    "order_kernels_for",
    "point_shares",
    "ranking",
    "row_products",
    "sort_columns",
    "squared_distances",
    "window_shares",
]

_log = logging.getLogger(__name__)

# Scratch memory a rule may use per block of columns, beyond its input and output.
_BLOCK_BYTES_CPU = 16 * 2**20
_BLOCK_BYTES_ACCELERATOR = 512 * 2**20
# Largest client count sorted by the network on CPU (beyond it, torch.sort wins).
_NETWORK_MAX_N = 256


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a rule computes in: float64 stays float64, every other float is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def block_columns(updates: Tensor, bytes_per_column: int) -> int:
    """How many columns one block holds when each column needs ``bytes_per_column``
    bytes of scratch (a fixed budget per device kind)."""
    budget = _BLOCK_BYTES_CPU if updates.device.type == "cpu" else _BLOCK_BYTES_ACCELERATOR
    return max(1, budget // max(1, bytes_per_column))


def column_blocks(n_params: int, block: int) -> Iterator[slice]:
    """Consecutive column slices of at most ``block`` parameters covering ``n_params``."""
    for start in range(0, n_params, block):
        yield slice(start, min(start + block, n_params))


@functools.lru_cache(maxsize=64)
def _network(n: int) -> tuple[tuple[int, int], ...]:
    """Comparators ``(low, high)`` of Batcher's odd-even merge sort for ``n`` keys.

    Built for the next power of two; comparators touching a padded position (>= n) are
    dropped, which is exact because padding keys would be +inf and never move.
    """
    size = 1 << max(0, (n - 1).bit_length())
    pairs: list[tuple[int, int]] = []
    p = 1
    while p < size:
        k = p
        while k >= 1:
            for j in range(k % p, size - k, 2 * k):
                for i in range(min(k, size - j - k)):
                    low, high = i + j, i + j + k
                    if low // (2 * p) == high // (2 * p) and high < n:
                        pairs.append((low, high))
            k //= 2
        p *= 2
    return tuple(pairs)


def _network_sort(block: Tensor) -> Tensor:
    """Sort the columns of ``block`` (n, c) with a sorting network over whole rows."""
    rows = list(block.clone().unbind(0))
    spare = torch.empty_like(rows[0])
    for low, high in _network(block.shape[0]):
        a, b = rows[low], rows[high]
        torch.minimum(a, b, out=spare)
        torch.maximum(a, b, out=b)
        rows[low], spare = spare, a
    return torch.stack(rows)


def sort_columns(block: Tensor) -> Tensor:
    """``block`` (n, c) with every column sorted ascending (values only)."""
    n = block.shape[0]
    if n == 1:
        return block.clone()
    if block.device.type == "cpu" and n <= _NETWORK_MAX_N:
        return _network_sort(block)
    return torch.sort(block, dim=0).values


def _c_compiler_found() -> bool:
    """Triton builds a small C launcher for each kernel on first use, with ``$CC``, gcc or
    clang: without one every launch fails (e.g. a slim container image)."""
    return bool(os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang"))


@functools.cache
def _triton_module(name: str) -> ModuleType | None:
    """``aggregation.<name>``, or None where Triton is not installed (CPU-only installs:
    CI, `make setup`) or cannot build its launchers (no C compiler: said once)."""
    if not _c_compiler_found():
        _log.warning(
            "no C compiler (CC, gcc or clang) for Triton: aggregation.%s is not used, the "
            "rules take their slower torch path on the GPU (install gcc to use it)",
            name,
        )
        return None
    try:
        return importlib.import_module(f"aggregation.{name}")
    except ImportError:
        return None


def _kernels_for(name: str, updates: Tensor) -> ModuleType | None:
    # Ampere or newer: the Gram kernel's split-TF32 products need tensor cores with TF32,
    # and the kernels were verified on Hopper only.
    if (
        updates.device.type != "cuda"
        or updates.dtype == torch.float64
        or torch.cuda.get_device_capability(updates.device) < (8, 0)
    ):
        return None
    kernels = _triton_module(name)
    if kernels is None or updates.shape[0] > kernels.MAX_CLIENTS:
        return None
    return kernels


def order_kernels_for(updates: Tensor) -> ModuleType | None:
    """:mod:`aggregation.order_kernels` where it applies to ``updates`` (a CUDA tensor of
    float32 or half precision from at most ``MAX_CLIENTS`` clients, Triton installed),
    else None: the caller then sorts with :func:`sort_columns`."""
    return _kernels_for("order_kernels", updates)


def fedlag_kernel_for(updates: Tensor) -> ModuleType | None:
    """:mod:`aggregation.fedlag_kernel` where it applies to ``updates`` (as
    :func:`order_kernels_for`, for at most its ``MAX_CLIENTS`` clients), else None."""
    return _kernels_for("fedlag_kernel", updates)


def centered_gram(updates: Tensor) -> Tensor:
    """Gram matrix ``(n, n)`` float64 of the updates minus their column mean.

    Computed block by block in the updates' precision and summed in float64; if that
    overflows (huge finite attack vectors in float32), it is recomputed in float64.
    """
    kernel = _kernels_for("gram_kernel", updates)
    if kernel is not None:  # one pass on a CUDA GPU
        gram = kernel.centered_gram(updates)
    else:
        gram = _centered_gram(updates, compute_dtype(updates.dtype))
    if not bool(torch.isfinite(gram).all()) and updates.dtype != torch.float64:
        gram = _centered_gram(updates, torch.float64)
    return gram


def _centered_gram(updates: Tensor, dtype: torch.dtype) -> Tensor:
    n, d = updates.shape
    itemsize = torch.empty((), dtype=dtype).element_size()
    block = block_columns(updates, 2 * n * itemsize)
    gram = torch.zeros(n, n, dtype=torch.float64, device=updates.device)
    buffer = torch.empty(n, min(block, d), dtype=dtype, device=updates.device)
    for columns in column_blocks(d, block):
        x = updates[:, columns].to(dtype)
        centered = buffer[:, : x.shape[1]]
        torch.sub(x, x.mean(dim=0, keepdim=True), out=centered)
        gram += (centered @ centered.T).to(torch.float64)
    return (gram + gram.T) / 2


def squared_distances(gram: Tensor) -> Tensor:
    """Pairwise squared Euclidean distances ``(n, n)`` from a (centered) Gram matrix:
    exactly symmetric, zero diagonal, never negative."""
    norms = gram.diagonal()
    dist = (norms[:, None] + norms[None, :] - 2.0 * gram).clamp_min(0.0)
    dist = (dist + dist.T) / 2
    dist.fill_diagonal_(0.0)
    return dist


def ranking(scores: Tensor, tiebreak: Tensor) -> Tensor:
    """Indices ordering ``scores`` ascending, equal scores ordered by ``tiebreak``
    ascending (then by index): a choice that does not depend on the client order
    except for exact ties in both keys."""
    by_tiebreak = torch.sort(tiebreak, stable=True).indices
    by_score = torch.sort(scores[by_tiebreak], stable=True).indices
    return by_tiebreak[by_score]


def krum_scores(dist: Tensor, n_neighbours: int) -> Tensor:
    """Krum scores (Blanchard et al. 2017): for every row of the squared-distance matrix
    ``dist`` (m, m), the sum of its ``n_neighbours`` smallest distances to the others."""
    k = max(0, min(n_neighbours, dist.shape[0] - 1))
    others = dist.clone()
    others.fill_diagonal_(math.inf)
    return torch.sort(others, dim=1).values[:, :k].sum(dim=1)


def window_shares(
    values: Tensor, ordered: Tensor, start: Tensor | int, count: Tensor | int
) -> Tensor:
    """Each client's share ``(n, c)`` of the window ``[start, start + count)`` of every
    column's sorted values: 1 strictly inside, 0 outside. A run of equal values crossing a
    window edge puts only some of its positions inside; those are split equally among the
    clients holding the value, so equal values always get equal shares (and the shares of
    a column sum to ``count``).

    ``values`` ``(n, c)`` the clients' values, ``ordered`` the same block sorted per column;
    ``start`` and ``count`` ints or ``(c,)`` long tensors (count >= 1).
    """
    c = ordered.shape[1]
    start = torch.as_tensor(start, device=ordered.device).expand(c)
    end = start + torch.as_tensor(count, device=ordered.device).expand(c)
    low = ordered.gather(0, start[None, :])[0]
    high = ordered.gather(0, (end - 1)[None, :])[0]
    below_low, upto_low = (values < low).sum(dim=0), (values <= low).sum(dim=0)
    below_high, upto_high = (values < high).sum(dim=0), (values <= high).sum(dim=0)
    low_part = (torch.minimum(upto_low, end) - start) / (upto_low - below_low)
    high_part = (end - torch.maximum(below_high, start)) / (upto_high - below_high)
    share = ((values > low) & (values < high)).to(ordered.dtype)
    at_low = (values == low) * low_part.to(ordered.dtype)
    at_high = (values == high) * high_part.to(ordered.dtype)
    return share + torch.where(low == high, at_low, at_low + at_high)


def point_shares(values: Tensor, points: Tensor) -> Tensor:
    """``(n, c)``: per column, 1/k for each of the k clients whose value equals the
    column's ``points`` value ``(c,)`` (one of the sorted values), 0 for the others."""
    equal = (values == points).to(values.dtype)
    return equal / equal.sum(dim=0)


def gram(rows: Tensor) -> Tensor:
    """The rows' plain Gram matrix ``rows @ rows.T`` ``(n, n)`` float64 on the CPU, summed
    block by block in float64 (no overflow for huge float32 values)."""
    n, d = rows.shape
    out = torch.zeros(n, n, dtype=torch.float64, device=rows.device)
    for columns in column_blocks(d, block_columns(rows, 2 * n * 8)):
        block = rows[:, columns].to(torch.float64)
        out += block @ block.T
    return ((out + out.T) / 2).cpu()


def row_products(rows: Tensor, vector: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(rows @ vector, squared norms of the rows)``, each float64 ``(n,)`` on the CPU,
    computed block by block in float64 (the products are 0 without a vector)."""
    n, d = rows.shape
    dots = torch.zeros(n, dtype=torch.float64, device=rows.device)
    squares = torch.zeros(n, dtype=torch.float64, device=rows.device)
    for columns in column_blocks(d, block_columns(rows, 2 * n * 8)):
        block = rows[:, columns].to(torch.float64)
        if vector is not None:
            dots += block @ vector[columns].to(block)
        squares += block.square().sum(dim=1)
    return dots.cpu(), squares.cpu()


class WeightedColumns:
    """A block of client values ``(n, c)`` sorted per column, with each client's weight
    carried along, for the size-weighted coordinate-wise rules.

    ``ordered`` (n, c) the sorted values, ``index`` (n, c) the client at each sorted
    position, ``weight`` (n, c) float64 its weight, ``before`` (n, c) the total weight of
    the positions before it (so position p spans the weight interval ``[before, before +
    weight]``). Runs of equal values are tracked so that :meth:`spread` can share what a
    run receives among its clients by their weights, whatever order the sort left them in.
    """

    def __init__(self, values: Tensor, weights: Tensor) -> None:
        n = values.shape[0]
        self.ordered, self.index = torch.sort(values, dim=0, stable=True)
        self.weight = weights.to(torch.float64)[self.index]
        self.before = self.weight.cumsum(dim=0) - self.weight
        positions = torch.arange(n, device=values.device)[:, None].expand_as(self.index)
        starts = torch.ones_like(self.ordered, dtype=torch.bool)
        starts[1:] = self.ordered[1:] != self.ordered[:-1]
        ends = torch.ones_like(starts)
        ends[:-1] = starts[1:]
        self.first = torch.where(starts, positions, 0).cummax(dim=0).values
        last = torch.where(ends, positions, n - 1).flip(0).cummin(dim=0).values.flip(0)
        self.last = last

    def run_weight(self) -> tuple[Tensor, Tensor]:
        """``(start, end)`` (n, c): the weight interval spanned by each position's run."""
        start = self.before.gather(0, self.first)
        end = (self.before + self.weight).gather(0, self.last)
        return start, end

    def spread(self, position_weights: Tensor) -> Tensor:
        """Per-client coefficients ``(n, c)`` from coefficients of the sorted positions
        ``(n, c)``: each run's total is shared among its clients in proportion to their
        weights (equally when they all weigh 0)."""
        total = position_weights.cumsum(dim=0)
        run_total = total.gather(0, self.last) - (total - position_weights).gather(0, self.first)
        start, end = self.run_weight()
        count = (self.last - self.first + 1).to(torch.float64)
        share = torch.where(end > start, self.weight / (end - start).clamp_min(1e-300), 1.0 / count)
        return torch.zeros_like(share).scatter_(0, self.index, share * run_total)
