"""Partition stage: verified data in, per-client index arrays and a report out."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger

from fedsieve.config import Params
from fedsieve.plots import plot_partition
from fedsieve.reports import ProjectPaths, write_json, write_partition
from flows.common import stage_main
from tasks.data import load_verified_dataset
from tasks.partition import partition_clients

__all__ = ["partition_flow"]


@flow(name="partition")
def partition_flow(params: Params, workdir: Path) -> dict:
    paths = ProjectPaths(workdir)
    data = load_verified_dataset(params.data, workdir)
    parts, report = partition_clients(
        data.train.targets,
        data.info.n_classes,
        scheme=params.partition.scheme,
        num_clients=params.partition.num_clients,
        seed=params.seed,
        params=params.partition.partitioner_params(),
    )
    write_partition(paths.partition, parts)
    report = {"dataset": params.data.dataset, "scheme": params.partition.scheme, **report}
    write_json(paths.partition_report, report)
    plot_partition(report, data.info.labels, paths.partition_plot)
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


main = stage_main("partition")

if __name__ == "__main__":
    main()
