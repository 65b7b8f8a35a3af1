"""MDA: minimum-diameter averaging.

El Mhamdi, Guerraoui, Guirguis, Hoang, Rouault 2020, "Genuinely Distributed Byzantine
Machine Learning" (PODC, https://arxiv.org/abs/1905.03853), MDA: among all subsets S of
``n - f`` updates, take the one with the smallest diameter ``max_{i,j in S} ||x_i -
x_j||`` and return its mean. Client weights are ignored (unweighted rule).

Exact search without enumerating the C(n, f) subsets. A subset of diameter at most t
exists iff the f removed updates cover every pair farther apart than t, i.e. iff the
"conflict graph" of those pairs has a vertex cover of at most f vertices. The optimal
diameter t* is one of the pairwise distances: it is found by bisection over them, each
test a bounded search (fixed-parameter branching: a vertex with more than b conflicts
must be removed; otherwise remove u or all of u's conflicts, for the u with most
conflicts), O(2^f n²) at worst and usually far less. The search visits at most
``max_nodes`` branches; a larger search raises (lower f).

Equal diameters. Several subsets can share the minimum diameter (removing fewer than f
updates already reaches it, or several covers exist). Each minimal cover at t* (the
branching finds them all) is extended
to exactly f removals by repeatedly removing the remaining update with the largest sum
of squared distances to the others; among the resulting subsets the one with the
smallest sum of squared pairwise distances is kept (then the lexicographically smallest
rows). ByzFL's ``MDA`` enumerates every subset with ``itertools.combinations`` and keeps
the first minimum in that order, which depends on the client order; the two agree
whenever the minimum-diameter subset is unique.

Parameters: ``f: int`` (>= 0, required), ``max_nodes: int = 1_000_000`` (>= 1). Needs
``n > 2f`` (checked at call time). Shapes: ``(n, d), (n,) | None -> (d,)``. Distances
come from the centered Gram matrix (one O(n²·d) pass). Diagnostics: ``selected`` (the
n - f rows averaged, ascending), ``effective_weight`` 1/(n - f) on them (exact),
``columns["farthest"]`` each client's largest distance to the selected rows, and the
scalar ``diameter``.

Example (f = 1): updates ``[[0, 0], [1, 0], [0, 1], [5, 5]]``. The subsets of three and
their diameters: {0, 1, 2} sqrt(2) = 1.414, {0, 1, 3} sqrt(50), {0, 2, 3} sqrt(50),
{1, 2, 3} sqrt(41). MDA averages rows 0-2: ``[1/3, 1/3]`` (the mean is ``[1.5, 1.5]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aggregation.base import AggregationRule, check_minority, row_mean
from aggregation.ops import centered_gram, squared_distances
from aggregation.registry import register_aggregator
from registry.constraints import Interval, allowed, check_fields

__all__ = ["MDA", "minimum_diameter_subset"]


class _Search:
    """Vertex covers of at most ``f`` vertices of a conflict graph (bool (n, n)), by
    bounded branching; counts its branches against ``max_nodes``."""

    def __init__(self, conflicts: np.ndarray, f: int, max_nodes: int, nodes: list[int]) -> None:
        self.conflicts = conflicts
        self.f = f
        self.max_nodes = max_nodes
        self.nodes = nodes  # shared counter across the searches of one call

    def covers(self, first_only: bool) -> list[frozenset[int]]:
        found: list[frozenset[int]] = []
        self._branch(frozenset(), found, first_only)
        return found

    def _branch(self, removed: frozenset[int], found: list[frozenset[int]], first: bool) -> None:
        self.nodes[0] += 1
        if self.nodes[0] > self.max_nodes:
            raise ValueError(
                f"mda's exact search passed max_nodes={self.max_nodes} branches with f={self.f}: "
                "lower f (the search grows like 2^f) or raise max_nodes"
            )
        alive = np.ones(len(self.conflicts), dtype=bool)
        alive[list(removed)] = False
        graph = self.conflicts & alive[:, None] & alive[None, :]
        degree = graph.sum(axis=1)
        budget = self.f - len(removed)
        if not degree.any():
            found.append(removed)
            return
        if budget == 0 or int(degree.sum()) // 2 > budget * int(degree.max()):
            return
        forced = np.flatnonzero(degree > budget)
        if forced.size:  # such a vertex is in every cover within the budget
            self._branch(removed | {int(forced[0])}, found, first)
            return
        u = int(np.argmax(degree))
        self._branch(removed | {u}, found, first)
        if not (first and found):
            neighbours = frozenset(int(v) for v in np.flatnonzero(graph[u]))
            if len(removed) + len(neighbours) <= self.f:
                self._branch(removed | neighbours, found, first)


def _extended(removed: frozenset[int], squared: np.ndarray, f: int) -> tuple[int, ...]:
    """The rows kept when ``removed`` grows to ``f`` rows, each time by the remaining row
    with the largest sum of squared distances to the others (ties: the lowest index)."""
    keep = [i for i in range(len(squared)) if i not in removed]
    while len(keep) > len(squared) - f:
        spread = squared[np.ix_(keep, keep)].sum(axis=1)
        keep.pop(int(np.argmax(spread)))
    return tuple(keep)


def minimum_diameter_subset(squared: np.ndarray, f: int, max_nodes: int) -> tuple[int, ...]:
    """Rows (ascending) of the ``n - f`` subset of smallest diameter, from the squared
    pairwise distances ``(n, n)``; equal diameters resolved as the module says."""
    n = len(squared)
    if f == 0:
        return tuple(range(n))
    candidates = np.unique(squared[np.triu_indices(n, 1)])
    nodes = [0]

    def search(t: float, first_only: bool) -> list[frozenset[int]]:
        return _Search(squared > t, f, max_nodes, nodes).covers(first_only)

    low, high = 0, len(candidates) - 1  # the largest distance always admits a cover
    while low < high:
        middle = (low + high) // 2
        if search(float(candidates[middle]), first_only=True):
            high = middle
        else:
            low = middle + 1
    covers = set(search(float(candidates[low]), first_only=False))
    minimal = [cover for cover in covers if not any(other < cover for other in covers)]
    subsets = {_extended(cover, squared, f) for cover in minimal}

    def spread(rows: tuple[int, ...]) -> float:
        return float(squared[np.ix_(rows, rows)].sum())

    return min(subsets, key=lambda rows: (spread(rows), rows))


@register_aggregator("mda")
@dataclass(frozen=True, kw_only=True)
class MDA(AggregationRule):
    """Mean of the ``n - f`` updates whose set has the smallest diameter."""

    # Byzantine clients tolerated (updates left out)
    f: int = field(metadata=allowed(Interval(int, 0)))
    # branches the exact search may visit
    max_nodes: int = field(default=1_000_000, metadata=allowed(Interval(int, 1)))

    def __post_init__(self) -> None:
        check_fields(self)

    def aggregate(self, updates: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
        n = updates.shape[0]
        check_minority("mda", n, self.f)
        squared = squared_distances(centered_gram(updates)).cpu().numpy()
        rows = minimum_diameter_subset(squared, self.f, self.max_nodes)
        selected = torch.tensor(rows, dtype=torch.long)
        result, weight = row_mean(updates, selected)
        farthest = torch.from_numpy(np.sqrt(squared[:, list(rows)].max(axis=1)))
        diagnostics = {
            "selected": selected,
            "effective_weight": weight,
            "columns": {"farthest": farthest},
            "diameter": math.sqrt(float(squared[np.ix_(rows, rows)].max())),
        }
        return result, diagnostics
