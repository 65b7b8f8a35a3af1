"""Partition tasks: split the training labels across clients, write the split and its
report."""

from __future__ import annotations

from typing import Any

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from federated.partition import build_partitioner, partition_report
from fedsieve.config import Params
from tasks.plots import plot_partition
from tasks.reports import ProjectPaths, write_json, write_partition

__all__ = ["partition_clients", "write_partition_reports"]


@task(name="partition-clients", cache_policy=NO_CACHE)
def partition_clients(
    labels: np.ndarray,
    n_classes: int,
    *,
    scheme: str,
    num_clients: int,
    seed: int,
    params: dict[str, Any],
) -> tuple[list[np.ndarray], dict[str, Any]]:
    parts = build_partitioner(scheme, **params)(labels, num_clients, seed=seed)
    return parts, partition_report(parts, labels, n_classes)


@task(name="write-partition-reports", cache_policy=NO_CACHE)
def write_partition_reports(
    paths: ProjectPaths,
    parts: list[np.ndarray],
    report: dict[str, Any],
    params: Params,
    labels: tuple[str, ...],
) -> dict[str, Any]:
    """``artifacts/partition/clients.npz`` (each client's indices), ``reports/partition.json``
    (sizes and class histograms) and its figure."""
    write_partition(paths.partition, parts)
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
