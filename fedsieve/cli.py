"""``fedsieve``: the command-line entry point.

``fedsieve run [--params FILE] [--set key=value ...] [--resume]`` runs the whole pipeline
flow; ``fedsieve partition|train|evaluate`` run one stage (what dvc.yaml calls);
``fedsieve list`` shows what can be named in params.yaml. A bad parameter, an unusable
dataset or an impossible partition ends with exit code 2 and one line, before anything
runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import fedsieve  # noqa: F401  (environment first)
from federated.data import DataError
from federated.partition import PartitionError
from federated.registry import RegistryError
from fedsieve.config import ConfigError, Params, load_params

__all__ = ["main"]

USAGE_ERRORS = (ConfigError, DataError, PartitionError, RegistryError)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedsieve", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("run", "run the whole pipeline flow (partition -> train -> evaluate)"),
        ("partition", "partition the dataset across clients"),
        ("train", "run the federated training rounds"),
        ("evaluate", "evaluate the final model, log and register it"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument(
            "--params", default="params.yaml", help="params file (default params.yaml)"
        )
        sub.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override one parameter, e.g. --set train.rounds=3 (repeatable)",
        )
        if name in ("run", "train"):
            sub.add_argument(
                "--resume",
                action="store_true",
                help="continue from the checkpoint of an interrupted run with the same params",
            )
    commands.add_parser("list", help="list datasets, models, partition schemes, rules and filters")
    return parser


def _preflight(params: Params, workdir: Path) -> None:
    """Fail before any flow starts: the dataset must be usable and the partition possible."""
    from federated.data import ensure_medmnist, load_medmnist
    from federated.partition import build_partitioner
    from tasks.data import data_root

    root = data_root(params.data.root, workdir)
    ensure_medmnist(
        params.data.dataset, root, download=params.data.download, progress=sys.stderr.isatty()
    )
    labels = load_medmnist(params.data.dataset, root).train.targets
    build_partitioner(params.partition.scheme, **params.partition.partitioner_params())(
        labels, params.partition.num_clients, seed=params.seed
    )


def _list() -> None:
    from aggregation import list_aggregators, list_filters
    from federated.data import list_datasets
    from federated.partition import list_partitioners
    from models import list_models

    for title, names in (
        ("datasets", list_datasets()),
        ("models", list_models()),
        ("partition schemes", list_partitioners()),
        ("aggregators", list_aggregators()),
        ("filters", list_filters()),
    ):
        print(f"{title}: {', '.join(names)}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "list":
        _list()
        return 0
    workdir = Path.cwd()
    try:
        params = load_params(Path(args.params), args.overrides)
        if args.command in ("run", "partition"):
            _preflight(params, workdir)
        if args.command == "run":
            from flows.pipeline import pipeline_flow

            pipeline_flow(params, workdir, resume=args.resume)
        elif args.command == "partition":
            from flows.partition import partition_flow

            partition_flow(params, workdir)
        elif args.command == "train":
            from flows.train import train_flow

            train_flow(params, workdir, resume=args.resume)
        else:
            from flows.evaluate import evaluate_flow

            evaluate_flow(params, workdir)
    except USAGE_ERRORS as error:
        print(f"fedsieve: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
