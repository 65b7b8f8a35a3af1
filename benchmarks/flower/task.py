"""What both sides of the race share, rebuilt for Flower's own environment (numpy and
torch only; fedsieve is not installed there).

Each piece mirrors fedsieve's engine so that Flower trains on exactly the batches
fedsieve does: the small CNN of ``models/cnn.py`` built under the same seed
(``federated.seeding.seeded_init``), the IID partition of ``federated/partition.py``, the
per-(round, client) shuffle seeds and batch order of ``federated/client.py`` (a trailing
1-sample batch merged into the previous one), and MedMNIST's [-1, 1] normalisation.
The race checks the equality (initial weights, partition) by digest.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

SAMPLING, SHUFFLE, INIT = 1, 2, 4  # federated.seeding purposes


def derive_seed(seed: int, *keys: int) -> int:
    """federated.seeding.derive_seed: numpy SeedSequence hashing to 63 bits."""
    state = np.random.SeedSequence([int(seed), *(int(k) for k in keys)]).generate_state(
        2, np.uint32
    )
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


class SmallCNN(nn.Module):
    """models/cnn.py ``small_cnn`` (width 32, hidden 128)."""

    def __init__(self, *, in_channels: int, num_classes: int, width: int = 32, hidden: int = 128):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # (B, width, 14, 14)
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # (B, 2*width, 7, 7)
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 7 * 7, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:  # (B, C, 28, 28) -> (B, num_classes)
        return self.head(self.features(x))


def build_model(seed: int, in_channels: int, num_classes: int) -> SmallCNN:
    """federated.seeding.seeded_init: the constructor's draws under derive_seed(seed, INIT)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, INIT))
        return SmallCNN(in_channels=in_channels, num_classes=num_classes)


def load_split(path: Path, split: str) -> tuple[Tensor, Tensor]:
    """A MedMNIST split read with numpy: images (N, 1, 28, 28) in [-1, 1], labels (N,)."""
    with np.load(path) as data:
        images = torch.from_numpy(data[f"{split}_images"]).float()
        labels = torch.from_numpy(data[f"{split}_labels"].reshape(-1).astype(np.int64))
    images = images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2).contiguous()
    return (images / 255.0 - 0.5) / 0.5, labels


def iid_partition(num_samples: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """federated.partition ``iid``: a seeded permutation split into near-equal parts."""
    order = np.random.default_rng(seed).permutation(num_samples)
    return [np.sort(part) for part in np.array_split(order, num_clients)]


def batches(num_samples: int, seed: int, batch_size: int) -> list[Tensor]:
    """federated.client.batch_order + batches."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    chunks = list(torch.randperm(num_samples, generator=generator).split(batch_size))
    if len(chunks) > 1 and len(chunks[-1]) == 1:
        chunks[-2:] = [torch.cat(chunks[-2:])]
    return chunks


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
    """federated.client.train_client without FedProx/weight decay; mean loss of the
    last epoch."""
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_fn = nn.CrossEntropyLoss()
    epoch_loss = float("nan")
    for epoch in range(epochs):
        total, count = 0.0, 0
        for index in batches(len(labels), derive_seed(seed, epoch), batch_size):
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
