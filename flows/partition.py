"""Partition stage: verified data in, per-client index arrays and a report out. At real
sites (``federation.runtime: flower``) the sites hold the data: the stage partitions
nothing and its outputs list the registered sites."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from config.params import Params
from tasks.data import load_verified_dataset
from tasks.partition import partition_clients, write_partition_reports, write_sites_hold_data
from tasks.reports import ProjectPaths

__all__ = ["partition_flow"]


@flow(name="partition")
def partition_flow(params: Params, workdir: Path) -> dict[str, Any]:
    paths = ProjectPaths(workdir)
    if params.federation.runtime == "flower":
        return write_sites_hold_data(paths, params)
    data = load_verified_dataset(params.data, workdir)
    split, report = partition_clients(
        data.train.targets,
        data.info.n_classes,
        scheme=params.partition.scheme,
        num_clients=params.partition.num_clients,
        seed=params.seed,
        params=params.partition.partitioner_params(),
        root_size=params.partition.root_size,
        local_test=params.partition.local_test,
    )
    if data.sha256:  # own images: which ones were partitioned
        report = {**report, "data_sha256": data.sha256}
    return write_partition_reports(paths, split, report, params, data.info.labels)
