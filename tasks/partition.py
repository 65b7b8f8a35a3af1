"""Partition tasks: split the training labels across clients, write the split and its
report."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from config.params import Params
from federated.partition import (
    build_partitioner,
    hold_out_local_tests,
    partition_report,
    split_off_root,
)
from tasks.plots import plot_partition, plot_registered_sites
from tasks.reports import ProjectPaths, write_json, write_partition, write_sites_partition

__all__ = [
    "Partition",
    "partition_clients",
    "split_partition",
    "write_partition_reports",
    "write_sites_hold_data",
]


class Partition(NamedTuple):
    """Indices into the training split: each client's training data, the server's root
    data, and each client's local test split (empty arrays when ``local_test`` is 0)."""

    clients: list[np.ndarray]
    root: np.ndarray
    local_tests: list[np.ndarray]

    @property
    def held_local_tests(self) -> list[np.ndarray] | None:
        """The local test splits, or None when no client holds one (``local_test`` 0),
        as ``tasks.reports.read_local_tests`` reads them from the partition file."""
        return self.local_tests if any(len(t) for t in self.local_tests) else None


@task(name="partition-clients", cache_policy=NO_CACHE)
def partition_clients(
    labels: np.ndarray,
    n_classes: int,
    *,
    scheme: str,
    num_clients: int,
    seed: int,
    params: dict[str, Any],
    root_size: int = 0,
    local_test: float = 0.0,
) -> tuple[Partition, dict[str, Any]]:
    """The partition (the server's root data, ``root_size`` images, held back first and
    never a client's; each client's local test split, a ``local_test`` share of its
    data) and its report."""
    split = split_partition(labels, scheme, num_clients, seed, params, root_size, local_test)
    report = partition_report(split.clients, labels, n_classes, split.local_tests)
    return split, report | {"root_size": len(split.root)}


def split_partition(
    labels: np.ndarray,
    scheme: str,
    num_clients: int,
    seed: int,
    params: dict[str, Any],
    root_size: int,
    local_test: float = 0.0,
) -> Partition:
    """The server's root data held back, then the clients' partition of the rest, then
    each client's local test split out of its part (as indices of the training split)."""
    root, rest = split_off_root(labels, root_size, seed)
    parts = build_partitioner(scheme, **params)(labels[rest], num_clients, seed=seed)
    clients, local_tests = hold_out_local_tests([rest[part] for part in parts], local_test, seed)
    return Partition(clients, root, local_tests)


@task(name="write-partition-reports", cache_policy=NO_CACHE)
def write_partition_reports(
    paths: ProjectPaths,
    split: Partition,
    report: dict[str, Any],
    params: Params,
    labels: tuple[str, ...],
) -> dict[str, Any]:
    """``artifacts/partition/clients.npz`` (each client's indices), ``reports/partition.json``
    (sizes and class histograms) and its figure."""
    write_partition(paths.partition, split.clients, split.root, split.local_tests)
    report = {"dataset": params.data.dataset, "scheme": params.partition.scheme, **report}
    write_json(paths.partition_report, report)
    plot_partition(report, labels, paths.partition_plot)
    get_run_logger().info(
        "partitioned %d %s training images across %d clients (%s; sizes %d-%d)",
        report["total"],
        params.data.dataset,
        report["num_clients"],
        params.partition.scheme,
        report["size_min"],
        report["size_max"],
    )
    return report


@task(name="sites-hold-the-data", cache_policy=NO_CACHE)
def write_sites_hold_data(paths: ProjectPaths, params: Params) -> dict[str, Any]:
    """The partition stage at real sites (``federation.runtime: flower``): nothing is
    partitioned here. Its outputs say so: ``reports/partition.json`` and its figure list
    the registered sites and their sample counts, ``artifacts/partition/clients.npz``
    holds those two lists and no client's indices."""
    sites = [{"name": site.name, "samples": site.samples} for site in params.federation.sites]
    write_sites_partition(paths.partition, sites)
    report = {
        "runtime": "flower",
        "held_at": "sites",
        "num_clients": len(sites),
        "total": sum(site["samples"] for site in sites),
        "sites": sites,
    }
    write_json(paths.partition_report, report)
    plot_registered_sites(sites, paths.partition_plot)
    get_run_logger().info(
        "federation.runtime = flower: the %d sites hold the data, nothing is partitioned "
        "here (reports/partition.json lists them)",
        len(sites),
    )
    return report
