"""Partition tasks: split the training labels across clients, write the split and its
report."""

from __future__ import annotations

from typing import Any

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from federated.partition import build_partitioner, partition_report, split_off_root
from fedsieve.config import Params
from tasks.plots import plot_partition
from tasks.reports import ProjectPaths, write_json, write_partition

__all__ = ["partition_clients", "split_partition", "write_partition_reports"]


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
) -> tuple[list[np.ndarray], np.ndarray, dict[str, Any]]:
    """The clients' training indices, the server's root data (``root_size`` images held
    back first, never a client's) and the partition report."""
    parts, root = split_partition(labels, scheme, num_clients, seed, params, root_size)
    report = partition_report(parts, labels, n_classes) | {"root_size": len(root)}
    return parts, root, report


def split_partition(
    labels: np.ndarray,
    scheme: str,
    num_clients: int,
    seed: int,
    params: dict[str, Any],
    root_size: int,
) -> tuple[list[np.ndarray], np.ndarray]:
    """The server's root data held back, then the clients' partition of the rest (as
    indices of the whole training split)."""
    root, rest = split_off_root(labels, root_size, seed)
    parts = build_partitioner(scheme, **params)(labels[rest], num_clients, seed=seed)
    return [rest[part] for part in parts], root


@task(name="write-partition-reports", cache_policy=NO_CACHE)
def write_partition_reports(
    paths: ProjectPaths,
    parts: list[np.ndarray],
    root: np.ndarray,
    report: dict[str, Any],
    params: Params,
    labels: tuple[str, ...],
) -> dict[str, Any]:
    """``artifacts/partition/clients.npz`` (each client's indices), ``reports/partition.json``
    (sizes and class histograms) and its figure."""
    write_partition(paths.partition, parts, root)
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
