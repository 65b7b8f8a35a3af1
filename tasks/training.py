"""Training tasks: assemble a federation from validated params, run one round."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from aggregation import build_aggregator, build_filter
from federated.attacks import DataAttack, ModelAttack, build_attack, choose_malicious, client_seed
from federated.client import ClientData, LocalTraining
from federated.data import DatasetInfo, MedMNISTData, to_tensors
from federated.seeding import seeded_init, torch_generator
from federated.server import Federation, FederationConfig, NonIIDCheck, RoundReport, ServerState
from fedsieve.config import Params
from models import build_model

__all__ = [
    "build_federation",
    "build_global_model",
    "malicious_clients",
    "resolve_device",
    "train_round",
]


def resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "train.device is 'cuda' but no CUDA device is available; use auto or cpu"
        )
    return torch.device(choice)


def malicious_clients(params: Params) -> frozenset[int]:
    """The run's malicious set (empty without an attack): seeded, fixed for the run."""
    attack = params.attack
    if attack.name == "none":
        return frozenset()
    if attack.ids is not None:
        return choose_malicious(params.partition.num_clients, ids=attack.ids, seed=params.seed)
    return choose_malicious(
        params.partition.num_clients, fraction=attack.fraction, seed=params.seed
    )


def build_global_model(params: Params, info: DatasetInfo) -> torch.nn.Module:
    """The seeded initial global model: the same weights wherever it is built."""
    return seeded_init(
        params.seed,
        lambda: build_model(
            params.model.name, in_channels=info.n_channels, num_classes=info.n_classes
        ),
    )


@task(name="build-federation", cache_policy=NO_CACHE)
def build_federation(params: Params, data: MedMNISTData, parts: list[np.ndarray]) -> Federation:
    device = resolve_device(params.train.device)
    images, targets = to_tensors(data.train, data.info, device=device)
    attack = build_attack(params.attack.name, **params.attack.params())
    malicious = malicious_clients(params)
    clients = []
    for client_id, idx in enumerate(parts):
        index = torch.as_tensor(idx, device=device)
        client_targets = targets[index]
        if isinstance(attack, DataAttack) and client_id in malicious:
            client_targets = attack.poison_labels(
                client_targets,
                num_classes=data.info.n_classes,
                seed=client_seed(params.seed, client_id),
            )
        clients.append(ClientData(client_id, images[index], client_targets))
    update_attack = None
    if isinstance(attack, ModelAttack):

        def update_attack(
            round_number: int, updates: torch.Tensor, mask: torch.Tensor, seed: int
        ) -> torch.Tensor:
            return attack.apply(updates, mask, torch_generator(seed, updates.device))

    model = build_global_model(params, data.info).to(device)
    train = params.train
    noniid = params.noniid
    val = to_tensors(data.val, data.info, device=device)
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
            select=params.eval.select,
        ),
        multi_label=data.info.multi_label,
        malicious=malicious,
        update_attack=update_attack,
        noniid=None
        if data.info.multi_label or (noniid.every == 0 and not noniid.exclude)
        else NonIIDCheck(
            every=noniid.every,
            loss=noniid.loss,
            threshold=noniid.threshold,
            exclude=noniid.exclude,
            z=noniid.z,
        ),
        server_batch=val,  # Zeno's held-out batch
        val=val,  # evaluated every round; eval.select=best_val picks the final model by it
        backend=train.backend,
        max_parallel=train.max_parallel,
    )


@task(name="train-round", cache_policy=NO_CACHE)
def train_round(
    federation: Federation,
    state: ServerState,
    on_client: Callable[[int], None] | None = None,
) -> tuple[ServerState, RoundReport]:
    return federation.run_round(state, on_client=on_client)
