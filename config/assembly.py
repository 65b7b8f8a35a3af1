"""The engine's parts from validated params: the seeded model, local training, the
server's settings and its defence. The simulated train stage (``tasks.training``) and a
Flower hub (``flowerapp``) build theirs here, so both run the same federation."""

from __future__ import annotations

from pathlib import Path

import torch

from aggregation import build_aggregator, build_filter, build_preaggregator
from config.params import DataParams, Params, eval_batch_size, privacy_budget
from federated.client import ClientData, LocalTraining
from federated.data import (
    DataError,
    DatasetInfo,
    MedMNISTData,
    dataset_info,
    ensure_medmnist,
    load_medmnist,
)
from federated.own_data import load_own_dataset
from federated.seeding import seeded_init
from federated.server import Defence, FederationConfig, NonIIDCheck
from models import build_model

__all__ = [
    "build_defence",
    "build_global_model",
    "dataset_info_of",
    "federation_config",
    "local_training",
    "read_dataset",
    "resolve_device",
]


def resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "train.device is 'cuda' but no CUDA device is available; use auto or cpu"
        )
    return torch.device(choice)


def dataset_info_of(data: DataParams) -> DatasetInfo:
    """What the model and the sites need to know of the run's dataset (image size,
    channels, classes, task), from params alone: no data file is opened, so a hub that
    holds no images can build its model and its sites' task from it."""
    own = data.own
    if own is None:
        return dataset_info(data.dataset, data.size)
    return DatasetInfo(
        flag=data.dataset,
        task="multi-label, binary-class" if own.task == "multi-label" else own.task,
        n_channels=own.channels,
        n_classes=len(own.classes),
        labels=tuple(own.classes),
        url=own.path or "",
        md5="",  # the images' SHA-256 is taken where they are read
        n_samples={},
        size=data.size,
        mean=own.mean,
        std=own.std,
        resample=own.resample,
    )


def read_dataset(
    data: DataParams, *, medmnist_root: Path, workdir: Path, progress: bool = False
) -> MedMNISTData:
    """The run's dataset: the user's own images (``data.own.path``, relative to
    ``workdir``) read in their schema, or the md5-checked MedMNIST file under
    ``medmnist_root`` (downloaded when ``data.download`` allows)."""
    if data.own is not None:
        if data.own.path is None:
            raise DataError("data.own.path is not set: this machine holds none of the images")
        path = Path(data.own.path).expanduser()
        return load_own_dataset(
            path if path.is_absolute() else workdir / path, dataset_info_of(data)
        )
    ensure_medmnist(
        data.dataset, medmnist_root, size=data.size, download=data.download, progress=progress
    )
    return load_medmnist(data.dataset, medmnist_root, data.size)


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


def federation_config(params: Params) -> FederationConfig:
    """The server's settings: rounds, sampling, the fail-closed bound, evaluation."""
    train = params.train
    return FederationConfig(
        rounds=train.rounds,
        client_fraction=train.client_fraction,
        server_lr=train.server_lr,
        min_clients=train.min_clients,
        seed=params.seed,
        eval_batch_size=eval_batch_size(params),
        select=params.eval.select,
        max_excluded=train.max_excluded,
        site_every=params.eval.every,
        target_acc=params.eval.target_acc,
        round_scores=params.eval.round_scores,
    )


def build_defence(
    params: Params,
    *,
    noniid: NonIIDCheck | None = None,
    root: ClientData | None = None,
    server_batch: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Defence:
    """The rule, filters, pre-aggregators and central or local DP of ``params``, with the
    server's own data where a rule needs it (``root``: FLTrust; ``server_batch``: Zeno)."""
    return Defence(
        rule=build_aggregator(params.aggregate.name, **params.aggregate.params()),
        filters=tuple(build_filter(f.name, **f.params()) for f in params.filters),
        preaggregators=tuple(
            build_preaggregator(p.name, **p.params()) for p in params.preaggregators
        ),
        noniid=noniid,
        privacy=None if params.privacy.mode == "off" else privacy_budget(params),
        root=root,
        server_batch=server_batch,
    )
