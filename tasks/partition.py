"""Partition task: split the training labels across clients."""

from __future__ import annotations

from typing import Any

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from federated.partition import build_partitioner, partition_report

__all__ = ["partition_clients"]


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
