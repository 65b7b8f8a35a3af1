"""What both sides of the race share, for Flower's own environment (numpy and torch only).

The pieces that must be identical for Flower to train on exactly the batches fedsieve
does are imported from the engine itself, whose modules need only torch and numpy (the
repository root is put on the path; fedsieve is not installed there): the small CNN of
``models/cnn.py`` built under the same seed (``federated.seeding.seeded_init``), the IID
partition of ``federated/partition.py``, and the per-(round, client) shuffle seeds and
batch order of ``federated/client.py`` (a trailing 1-sample batch merged into the
previous one). The data loading, training loop (``torch.optim.SGD``) and evaluation are
written as a Flower user writes them. The race checks the equality (initial weights,
partition) by digest.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the engine's torch-only modules

from federated.client import batch_order, batches
from federated.partition import build_partitioner
from federated.seeding import SHUFFLE, derive_seed, seeded_init
from models import build_model as build_registered_model

__all__ = [
    "SHUFFLE",
    "build_model",
    "derive_seed",
    "digest",
    "evaluate",
    "iid_partition",
    "load_split",
    "small_cnn",
    "train",
]


def small_cnn(in_channels: int, num_classes: int) -> nn.Module:
    """The engine's ``small_cnn`` (its weights are about to be loaded)."""
    return build_registered_model("small_cnn", in_channels=in_channels, num_classes=num_classes)


def build_model(seed: int, in_channels: int, num_classes: int) -> nn.Module:
    """The engine's ``small_cnn`` with the weights ``seeded_init(seed, ...)`` draws."""
    return seeded_init(seed, lambda: small_cnn(in_channels, num_classes))


def iid_partition(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """The engine's ``iid`` partition of the training labels."""
    return build_partitioner("iid")(labels, num_clients, seed=seed)


def load_split(path: Path, split: str) -> tuple[Tensor, Tensor]:
    """A MedMNIST split read with numpy: images (N, 1, 28, 28) in [-1, 1], labels (N,)."""
    with np.load(path) as data:
        images = torch.from_numpy(data[f"{split}_images"]).float()
        labels = torch.from_numpy(data[f"{split}_labels"].reshape(-1).astype(np.int64))
    images = images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2).contiguous()
    return (images / 255.0 - 0.5) / 0.5, labels


def train(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    *,
    seed: int,
    epochs: int,
    lr: float,
    momentum: float,
    batch_size: int,
) -> float:
    """Local SGD as a Flower user writes it (``torch.optim.SGD``) over the engine's batch
    order; the same updates as ``federated.client.train_client`` without FedProx or weight
    decay. Returns the mean loss of the last epoch."""
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_fn = nn.CrossEntropyLoss()
    epoch_loss = float("nan")
    for epoch in range(epochs):
        total, count = 0.0, 0
        for index in batches(batch_order(len(labels), derive_seed(seed, epoch)), batch_size):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(images[index]), labels[index])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(index)
            count += len(index)
        epoch_loss = total / count
    return epoch_loss


@torch.no_grad()
def evaluate(model: nn.Module, images: Tensor, labels: Tensor) -> tuple[float, float]:
    """Accuracy and mean cross-entropy (federated.metrics.evaluate, batch 512)."""
    model.eval()
    logits = torch.cat([model(images[i : i + 512]) for i in range(0, len(images), 512)])
    loss = nn.functional.cross_entropy(logits, labels).item()
    return float((logits.argmax(1) == labels).float().mean()), float(loss)


def digest(tensors: list[Tensor] | list[np.ndarray]) -> str:
    """sha256 of the arrays' bytes (float32 / int64), in order."""
    hasher = hashlib.sha256()
    for value in tensors:
        array = value.detach().cpu().numpy() if isinstance(value, Tensor) else np.asarray(value)
        hasher.update(np.ascontiguousarray(array).tobytes())
    return hasher.hexdigest()
