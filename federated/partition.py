"""Seeded partitioners: split a training set's indices across clients.

Each partitioner is a frozen dataclass registered by name and called as
``partitioner(labels, num_clients, seed=...) -> list[np.ndarray]``: one sorted index array
per client, disjoint and together covering every sample. ``labels`` is the class index
per sample ``(N,)`` (label-skew schemes refuse multi-label data).

- ``iid``: a seeded permutation split into near-equal parts.
- ``dirichlet``: label skew (Hsu et al. 2019, https://arxiv.org/abs/1909.06335): for each
  class, client shares ~ Dir(alpha); small alpha, strong skew. Re-drawn (seeded) up to
  ``max_draws`` times until every client holds ``min_samples``, as NIID-Bench does.
- ``shards``: every client holds exactly ``classes_per_client`` classes ("#C=k" in Li et
  al. 2022, NIID-Bench); each class's samples are split evenly among its holders.
- ``quantity``: sizes ∝ log-normal(0, sigma) draws, labels IID (quantity skew).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from registry import Registry
from registry.constraints import POSITIVE, Interval, allowed, check_fields

__all__ = [
    "PARTITIONERS",
    "PartitionError",
    "build_partitioner",
    "group_by_client",
    "hold_out_local_tests",
    "list_partitioners",
    "partition_report",
    "split_off_root",
]

PARTITIONERS: Registry = Registry("partition scheme")


class PartitionError(ValueError):
    """A partition that cannot satisfy its constraints (names the knob to turn)."""


def build_partitioner(name: str, **params: object):
    return PARTITIONERS.build(name, **params)


MIN_SAMPLES = allowed(Interval(int, 1))  # the fewest samples a client may get


def list_partitioners() -> list[str]:
    return PARTITIONERS.names()


def _check_counts(sizes: np.ndarray, min_samples: int, hint: str) -> None:
    if int(sizes.min()) < min_samples:
        raise PartitionError(
            f"client {int(sizes.argmin())} would get {int(sizes.min())} samples, fewer than "
            f"min_samples={min_samples}; {hint}"
        )


def _check_inputs(labels: np.ndarray, num_clients: int, min_samples: int) -> None:
    if num_clients < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}")
    if len(labels) < num_clients * max(min_samples, 1):
        raise PartitionError(
            f"{len(labels)} samples cannot give {num_clients} clients {max(min_samples, 1)} samples "
            f"each; use fewer clients (at most {len(labels) // max(min_samples, 1)}) or lower min_samples"
        )


def split_off_root(labels: np.ndarray, root_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The server's root data (FLTrust's): ``root_size`` training indices drawn uniformly
    with ``seed``, and the rest, from which the clients' partition is drawn; both sorted.
    ``root_size = 0`` holds nothing back."""
    n = len(labels)
    if not 0 <= root_size < n:
        raise PartitionError(
            f"partition.root_size = {root_size}: the server's root data must be 0 to {n - 1} "
            f"of the {n} training images"
        )
    if root_size == 0:
        return np.empty(0, dtype=np.int64), np.arange(n)
    chosen = np.random.default_rng(np.random.SeedSequence([int(seed), 7])).choice(
        n, size=root_size, replace=False
    )
    root = np.sort(chosen)
    return root, np.setdiff1d(np.arange(n), root, assume_unique=True)


def hold_out_local_tests(
    parts: list[np.ndarray], fraction: float, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's seeded local test split (per-site evaluation, as FLamby's centres keep
    their own test sets): ``floor(fraction * n)`` of its ``n`` indices, at least one, drawn
    uniformly; the rest stay its training data. Both sorted and disjoint; ``fraction = 0``
    holds nothing back."""
    if not 0 <= fraction < 1:
        raise PartitionError(f"partition.local_test = {fraction}: must be in [0, 1) (0 = off)")
    if fraction == 0:
        return parts, [np.empty(0, dtype=np.int64) for _ in parts]
    train, test = [], []
    for client, indices in enumerate(parts):
        held = max(1, int(fraction * len(indices)))
        if held >= len(indices):
            raise PartitionError(
                f"client {client} holds {len(indices)} samples: a local test split of "
                f"{fraction} leaves it none to train on; lower partition.local_test or use "
                "fewer clients"
            )
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 11, client]))
        chosen = np.zeros(len(indices), dtype=bool)
        chosen[rng.choice(len(indices), size=held, replace=False)] = True
        train.append(np.sort(indices[~chosen]))
        test.append(np.sort(indices[chosen]))
    return train, test


def group_by_client(owners: np.ndarray, samples: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Each client's sample indices, sorted, from parallel arrays of (owner, sample):
    one sort for the whole population, near-linear in the number of clients."""
    order = np.lexsort((samples, owners))  # by client, then by sample
    counts = np.bincount(owners, minlength=num_clients)
    return np.split(samples[order], np.cumsum(counts)[:-1])


def _single_label(labels: np.ndarray, scheme: str) -> np.ndarray:
    if labels.ndim != 1:
        raise PartitionError(
            f"partition scheme {scheme!r} needs single-label data; use iid or quantity"
        )
    return labels


@PARTITIONERS.register("iid")
@dataclass(frozen=True, kw_only=True)
class IIDPartitioner:
    min_samples: int = field(default=1, metadata=MIN_SAMPLES)

    def __post_init__(self) -> None:
        check_fields(self)

    def __call__(self, labels: np.ndarray, num_clients: int, *, seed: int) -> list[np.ndarray]:
        _check_inputs(labels, num_clients, self.min_samples)
        order = np.random.default_rng(seed).permutation(len(labels))
        return [np.sort(part) for part in np.array_split(order, num_clients)]


@PARTITIONERS.register("dirichlet")
@dataclass(frozen=True, kw_only=True)
class DirichletPartitioner:
    alpha: float = field(default=0.5, metadata=allowed(POSITIVE))  # the concentration
    min_samples: int = field(default=1, metadata=MIN_SAMPLES)
    max_draws: int = field(default=100, metadata=allowed(Interval(int, 1)))

    def __post_init__(self) -> None:
        check_fields(self)

    def __call__(self, labels: np.ndarray, num_clients: int, *, seed: int) -> list[np.ndarray]:
        labels = _single_label(labels, "dirichlet")
        _check_inputs(labels, num_clients, self.min_samples)
        rng = np.random.default_rng(seed)
        classes = np.unique(labels)
        smallest = None
        for _ in range(self.max_draws):
            owners, samples = [], []
            for cls in classes:
                members = rng.permutation(np.flatnonzero(labels == cls))
                shares = rng.dirichlet(np.full(num_clients, self.alpha))
                cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
                counts = np.diff(np.concatenate([[0], cuts, [len(members)]]))
                owners.append(np.repeat(np.arange(num_clients), counts))
                samples.append(members)
            result = group_by_client(np.concatenate(owners), np.concatenate(samples), num_clients)
            sizes = np.array([len(p) for p in result])
            if sizes.min() >= self.min_samples:
                return result
            smallest = sizes.min()
        raise PartitionError(
            f"dirichlet alpha={self.alpha} with {num_clients} clients left a client with {smallest} "
            f"samples (< min_samples={self.min_samples}) in {self.max_draws} draws; "
            "raise alpha, use fewer clients, or lower min_samples"
        )


@PARTITIONERS.register("shards")
@dataclass(frozen=True, kw_only=True)
class ShardPartitioner:
    classes_per_client: int = field(default=2, metadata=allowed(Interval(int, 1)))
    min_samples: int = field(default=1, metadata=MIN_SAMPLES)

    def __post_init__(self) -> None:
        check_fields(self)

    def __call__(self, labels: np.ndarray, num_clients: int, *, seed: int) -> list[np.ndarray]:
        labels = _single_label(labels, "shards")
        _check_inputs(labels, num_clients, self.min_samples)
        rng = np.random.default_rng(seed)
        classes = np.unique(labels)
        k = self.classes_per_client
        if k > len(classes):
            raise PartitionError(
                f"classes_per_client={k} exceeds the {len(classes)} classes present"
            )
        if num_clients * k < len(classes):
            raise PartitionError(
                f"{num_clients} clients x classes_per_client={k} cannot cover {len(classes)} classes; "
                "raise classes_per_client or the number of clients"
            )
        order = rng.permutation(classes)
        # Round-robin over a shuffled class order: every class gets a holder, every client k
        # classes (client c holds the classes at positions c·k, ..., c·k + k - 1, mod C).
        positions = (np.arange(num_clients)[:, None] * k + np.arange(k)) % len(classes)
        held = order[positions]  # (clients, k)
        owners, samples = [], []
        for cls in classes:
            holders = np.flatnonzero((held == cls).any(axis=1))
            members = rng.permutation(np.flatnonzero(labels == cls))
            # np.array_split's sizes: the first len % h holders get one sample more
            base, extra = divmod(len(members), len(holders))
            counts = np.full(len(holders), base) + (np.arange(len(holders)) < extra)
            owners.append(np.repeat(holders, counts))
            samples.append(members)
        result = group_by_client(np.concatenate(owners), np.concatenate(samples), num_clients)
        _check_counts(
            np.array([len(p) for p in result]),
            self.min_samples,
            "use fewer clients or more classes_per_client",
        )
        return result


@PARTITIONERS.register("quantity")
@dataclass(frozen=True, kw_only=True)
class QuantityPartitioner:
    # the log-normal spread of the clients' sizes
    sigma: float = field(default=1.0, metadata=allowed(POSITIVE))
    min_samples: int = field(default=1, metadata=MIN_SAMPLES)
    max_draws: int = field(default=100, metadata=allowed(Interval(int, 1)))

    def __post_init__(self) -> None:
        check_fields(self)

    def __call__(self, labels: np.ndarray, num_clients: int, *, seed: int) -> list[np.ndarray]:
        _check_inputs(labels, num_clients, self.min_samples)
        rng = np.random.default_rng(seed)
        n = len(labels)
        sizes = np.zeros(num_clients, dtype=int)
        for _ in range(self.max_draws):
            shares = rng.lognormal(0.0, self.sigma, size=num_clients)
            sizes = np.floor(shares / shares.sum() * n).astype(int)
            sizes[np.argsort(-shares)[: n - sizes.sum()]] += 1  # hand out the remainder
            if sizes.min() >= self.min_samples:
                order = rng.permutation(n)
                return [np.sort(p) for p in np.split(order, np.cumsum(sizes)[:-1])]
        raise PartitionError(
            f"quantity sigma={self.sigma} with {num_clients} clients left a client with "
            f"{sizes.min()} samples (< min_samples={self.min_samples}) in {self.max_draws} draws; "
            "lower sigma, use fewer clients, or lower min_samples"
        )


def _histogram(labels: np.ndarray, n_classes: int) -> list[int]:
    counts = np.bincount(labels, minlength=n_classes) if labels.ndim == 1 else labels.sum(axis=0)
    return counts.astype(int).tolist()


def partition_report(
    parts: list[np.ndarray],
    labels: np.ndarray,
    n_classes: int,
    local_tests: list[np.ndarray] | None = None,
) -> dict:
    """Sizes and the class histogram per client (multi-label: positives per label), and
    of each client's local test split when there are any."""
    clients = []
    for client, indices in enumerate(parts):
        row = {
            "client": client,
            "size": len(indices),
            "classes": _histogram(labels[indices], n_classes),
        }
        if local_tests is not None and len(local_tests[client]):
            held = local_tests[client]
            row |= {
                "local_test": len(held),
                "local_test_classes": _histogram(labels[held], n_classes),
            }
        clients.append(row)
    sizes = np.array([len(p) for p in parts])
    held_total = 0 if local_tests is None else sum(len(t) for t in local_tests)
    return {
        "num_clients": len(parts),
        "total": int(sizes.sum()),
        "size_min": int(sizes.min()),
        "size_max": int(sizes.max()),
        "local_test_total": int(held_total),
        "clients": clients,
    }
