"""Preflight: everything that can be known before training, checked before anything runs.

The folders a run writes (reports, artifacts, a SQLite tracking store) writable by this
user, the data (a MedMNIST file present or downloaded, md5-checked, or the user's own
images read against their schema; none at real sites scored there, ``eval.where:
sites``: the hub holds no data), a feasible partition, the clients
sampled per round against ``train.min_clients``, and each rule's and filter's client-count
conditions (Krum's n > 2f + 2, Bulyan's n >= 4f + 3, ...) against the clients sampled per
round. The rule and the filters are asked for their conditions by running them once on a
synthetic round of that many random updates: a rule raises for a count it cannot take,
in its own words. The same check runs from the CLI (before a flow starts), in every DVC
stage and at the start of the pipeline flow (so a deployment run on a worker is checked
too). A failure is one :class:`~config.errors.ConfigError` line.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from aggregation import AggregationRule, build_aggregator, build_filter, build_preaggregator
from aggregation.base import SiteLosses
from aggregation.defence import Rows, run_rule
from config.assembly import device_problem
from config.errors import ConfigError
from config.params import Params, population
from federated.data import DataError, unwritable
from federated.partition import PartitionError
from federated.seeding import clients_per_round
from registry import RegistryError
from tasks.data import read_dataset
from tasks.partition import split_partition

__all__ = [
    "check_params",
    "check_writable",
    "preflight",
    "sampled_per_round",
]

PROBE_DIM = 8  # parameters of the synthetic updates a rule is probed with
POPULATION = {"simulation": "partition.num_clients", "flower": "the sites in federation.sites"}


def sampled_per_round(params: Params) -> int:
    """The clients the server samples each round under ``params`` (of the registered
    sites at real sites: :func:`config.params.population`)."""
    return clients_per_round(params.train.client_fraction, population(params))


def check_writable(workdir: Path) -> None:
    """The folders a run writes, writable by this process's user: otherwise one line naming
    the folder, its owner and the fix (a host folder mounted into the container as root's,
    say), instead of a PermissionError half-way through a run."""
    folders = {"reports/": workdir / "reports", "artifacts/": workdir / "artifacts"}
    uri = os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    if uri.startswith("sqlite:///"):
        folders["the MLflow store"] = Path(uri.removeprefix("sqlite:///")).absolute().parent
    uid = os.geteuid()
    for name, folder in folders.items():
        if (reason := unwritable(folder)) is not None:
            raise ConfigError(
                f"{name} ({folder.absolute()}) cannot be written by uid {uid}: {reason}; make "
                f"it writable for uid {uid}, or run the container as the folder's owner "
                "(docker run --user $(id -u):$(id -g) ...; docs/container.md)"
            )


def check_params(params: Params, workdir: Path, *, source: str = "params") -> None:
    """Raise :class:`ConfigError` naming what cannot work, before anything is written."""
    check_writable(workdir)
    if problem := device_problem(params.train.device):  # the hub's process resolves it too
        raise ConfigError(f"{source}: {problem}")
    if params.federation.runtime == "flower" and not params.federation.sites:
        raise ConfigError(
            f"{source}: federation.sites is empty: name each site (name, node_id from `flwr "
            "supernode register`, samples) before training at the sites"
        )
    if params.federation.runtime == "flower" and params.eval.where == "sites":
        _check_counts(params, source)  # the hub holds no data file: none is checked
        return
    try:
        labels = read_dataset(params.data, workdir).train.targets
        scheme = params.partition
        split_partition(
            labels, scheme.scheme, scheme.num_clients, params.seed,
            scheme.partitioner_params(), scheme.root_size, scheme.local_test,
        )  # fmt: skip
    except DataError as error:  # it names the data file or folder at fault, not the params
        raise ConfigError(str(error)) from None
    except (PartitionError, RegistryError) as error:
        raise ConfigError(f"{source}: {error}") from None
    _check_counts(params, source)


def _check_counts(params: Params, source: str) -> None:
    """The clients sampled per round against ``train.min_clients`` and the rules."""
    sampled = sampled_per_round(params)
    if params.train.min_clients > sampled:
        raise ConfigError(
            f"{source}: train.min_clients = {params.train.min_clients} but only {sampled} "
            f"clients are sampled per round ({POPULATION[params.federation.runtime]} x "
            "train.client_fraction): every round would be skipped"
        )
    check_rules(params, sampled, source=source)


def check_rules(params: Params, n: int, *, source: str = "params") -> None:
    """Run the rule and each filter once on ``n`` synthetic updates; a count condition
    they cannot meet is a :class:`ConfigError` naming the key."""
    generator = torch.Generator().manual_seed(0)
    updates = torch.randn(n, PROBE_DIM, generator=generator, dtype=torch.float64)
    weights = torch.ones(n, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a filter's warning about its threshold, say
        for index, entry in enumerate(params.filters):
            flt = build_filter(entry.name, **entry.params())
            extra = {"validate": _probe_losses} if flt.requires_validation else {}
            try:
                flt.step(flt.init_state(), updates, list(range(n)), weights, **extra)
            except ValueError as error:
                where = f"filters.{index} ({entry.name})"
                raise ConfigError(
                    f"{source}: {where} with {n} clients per round: {error}"
                ) from None
        rule = build_aggregator(params.aggregate.name, **params.aggregate.params())
        if rule.requires_reference and params.partition.root_size == 0:
            raise ConfigError(
                f"{source}: aggregate ({params.aggregate.name}) scores clients against the "
                "server's own update from its root data: set partition.root_size > 0"
            )
        try:
            _probe_rule(params, rule, updates, weights, generator)
        except ValueError as error:
            where = f"aggregate ({params.aggregate.name})"
            raise ConfigError(f"{source}: {where} with {n} clients per round: {error}") from None


def _probe_losses(candidates: torch.Tensor, sites: Sequence[int]) -> SiteLosses:
    """What sites that validate answer the probe: one held-out image each and an equal loss
    for every candidate (the probe asks whether a filter runs at this count, not what it
    decides; validation at the sites runs only where the sites are)."""
    m, k = len(sites), candidates.shape[0]
    return SiteLosses(tuple(sites), torch.ones(m, dtype=torch.float64),
                      torch.zeros(m, k, dtype=torch.float64))  # fmt: skip


def _probe_rule(
    params: Params,
    rule: AggregationRule,
    updates: torch.Tensor,
    weights: torch.Tensor,
    generator: torch.Generator,
) -> None:
    """The pre-aggregators, then the rule, once on the synthetic round (as the server runs
    them, with a synthetic oracle, reference or local work where the rule needs one)."""
    stages = [build_preaggregator(p.name, **p.params()) for p in params.preaggregators]
    ids = list(range(updates.shape[0]))
    norms = torch.ones(len(ids), dtype=torch.float64) if rule.requires_local_norms else None
    run_rule(
        rule, rule.init_state(), stages, [s.init_state() for s in stages],
        Rows(updates, weights, ids, norms), generator=generator,
        oracle=lambda: lambda c: (c**2).sum(dim=1),
        reference=lambda: torch.randn(updates.shape[1], generator=generator, dtype=updates.dtype),
    )  # fmt: skip


@task(name="preflight", cache_policy=NO_CACHE)
def preflight(params: Params, workdir: Path) -> None:
    """:func:`check_params` as the pipeline's first task."""
    check_params(params, workdir)
