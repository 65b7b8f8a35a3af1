"""Training tasks: assemble a federation from validated params, run one round."""

from __future__ import annotations

import numpy as np
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from aggregation import build_aggregator, build_filter
from federated.client import ClientData, LocalTraining
from federated.data import MedMNISTData, to_tensors
from federated.seeding import seeded_init
from federated.server import Federation, FederationConfig, RoundReport, ServerState
from fedsieve.config import Params
from models import build_model

__all__ = ["build_federation", "resolve_device", "train_round"]


def resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "train.device is 'cuda' but no CUDA device is available; use auto or cpu"
        )
    return torch.device(choice)


@task(name="build-federation", cache_policy=NO_CACHE)
def build_federation(params: Params, data: MedMNISTData, parts: list[np.ndarray]) -> Federation:
    device = resolve_device(params.train.device)
    images, targets = to_tensors(data.train, data.info, device=device)
    clients = [
        ClientData(
            client_id,
            images[torch.as_tensor(idx, device=device)],
            targets[torch.as_tensor(idx, device=device)],
        )
        for client_id, idx in enumerate(parts)
    ]
    model = seeded_init(
        params.seed,
        lambda: build_model(
            params.model.name, in_channels=data.info.n_channels, num_classes=data.info.n_classes
        ),
    ).to(device)
    train = params.train
    return Federation(
        model=model,
        clients=clients,
        test=to_tensors(data.test, data.info, device=device),
        rule=build_aggregator(params.aggregate.name, **params.aggregate.params()),
        filters=[build_filter(f.name, **f.params()) for f in params.filters],
        local=LocalTraining(
            epochs=train.local_epochs,
            lr=train.lr,
            momentum=train.momentum,
            weight_decay=train.weight_decay,
            batch_size=train.batch_size,
            prox_mu=train.prox_mu,
        ),
        config=FederationConfig(
            rounds=train.rounds,
            client_fraction=train.client_fraction,
            server_lr=train.server_lr,
            min_clients=train.min_clients,
            seed=params.seed,
            eval_batch_size=params.eval.batch_size,
        ),
        multi_label=data.info.multi_label,
    )


@task(name="train-round", cache_policy=NO_CACHE)
def train_round(federation: Federation, state: ServerState) -> tuple[ServerState, RoundReport]:
    return federation.run_round(state)
