"""The engine's parts from validated params: the seeded model, local training, the
server's settings and its defence. The simulated train stage (``tasks.training``) and a
Flower hub (``flowerapp``) build theirs here, so both run the same federation."""

from __future__ import annotations

import torch

from aggregation import (
    build_aggregator,
    build_filter,
    build_preaggregator,
    build_server_optimizer,
)
from config.dataset import dataset_info_of, read_dataset
from config.params import Params, eval_batch_size, privacy_budget
from federated.client import ClientData, LocalTraining, LocalWork
from federated.data import DatasetInfo
from federated.seeding import seeded_init
from federated.server import Defence, FederationConfig, NonIIDCheck
from models import build_model

__all__ = [
    "build_defence",
    "build_global_model",
    "dataset_info_of",  # from config.dataset, beside the parts built from it
    "device_problem",
    "federation_config",
    "local_training",
    "local_work",
    "noniid_check",
    "read_dataset",  # likewise
    "resolve_device",
]


def device_problem(choice: str) -> str | None:
    """Why ``train.device = choice`` cannot run on this machine; None when it can."""
    if choice == "cuda" and not torch.cuda.is_available():
        return "train.device is 'cuda' but no CUDA device is available; use auto or cpu"
    return None


def resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if problem := device_problem(choice):
        raise RuntimeError(problem)
    return torch.device(choice)


def build_global_model(params: Params, info: DatasetInfo) -> torch.nn.Module:
    """The seeded initial global model: the same weights wherever it is built."""
    return seeded_init(
        params.seed,
        lambda: build_model(
            params.model.name,
            in_channels=info.n_channels,
            num_classes=info.n_classes,
            image_size=info.size,
        ),
    )


def local_training(params: Params) -> LocalTraining:
    """The clients' local training settings (``train.*``)."""
    train = params.train
    return LocalTraining(
        epochs=train.local_epochs,
        lr=train.lr,
        momentum=train.momentum,
        weight_decay=train.weight_decay,
        batch_size=train.batch_size,
        prox_mu=train.prox_mu,
    )


def local_work(params: Params) -> LocalWork | None:
    """Heterogeneous local work (``train.local_work``): each client's epochs drawn per
    round; None when every client trains ``train.local_epochs``."""
    work = params.train.local_work
    return None if work is None else LocalWork(epochs=tuple(work.epochs))


def federation_config(params: Params) -> FederationConfig:
    """The server's settings: rounds, sampling, the fail-closed bound, evaluation."""
    train = params.train
    return FederationConfig(
        rounds=train.rounds,
        client_fraction=train.client_fraction,
        min_clients=train.min_clients,
        seed=params.seed,
        eval_batch_size=eval_batch_size(params),
        select=params.eval.select,
        max_excluded=train.max_excluded,
        site_every=params.eval.every,
        target_acc=params.eval.target_acc,
        round_scores=params.eval.round_scores,
        scaffold=train.scaffold,
    )


def noniid_check(params: Params, info: DatasetInfo) -> NonIIDCheck | None:
    """EMA's CV non-IID check as ``noniid`` sets it (None when off, and for multi-label
    data, which its losses do not cover)."""
    noniid = params.noniid
    if info.multi_label or (noniid.every == 0 and not noniid.exclude and not noniid.final):
        return None
    return NonIIDCheck(
        every=noniid.every, loss=noniid.loss, threshold=noniid.threshold,
        exclude=noniid.exclude, z=noniid.z,
    )  # fmt: skip


def build_defence(
    params: Params,
    info: DatasetInfo,
    *,
    root: ClientData | None = None,
    server_batch: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Defence:
    """The rule, filters, pre-aggregators, non-IID check and central or local DP of
    ``params`` for data described by ``info``, with the server's own data where a rule
    needs it (``root``: FLTrust; ``server_batch``: Zeno), and the server optimizer every
    aggregate goes through (``train.server_optimizer``, or sgd at ``train.server_lr``)."""
    name, settings = params.train.server_step()
    return Defence(
        rule=build_aggregator(params.aggregate.name, **params.aggregate.params()),
        filters=tuple(build_filter(f.name, **f.params()) for f in params.filters),
        preaggregators=tuple(
            build_preaggregator(p.name, **p.params()) for p in params.preaggregators
        ),
        noniid=noniid_check(params, info),
        privacy=None if params.privacy.mode == "off" else privacy_budget(params),
        root=root,
        server_batch=server_batch,
        server_optimizer=build_server_optimizer(name, **settings),
    )
