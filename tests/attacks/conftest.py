"""Fixtures shared by the attack tests (no global settings: fixtures only)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor

Round = tuple[Tensor, Tensor]


def gaussian_round(seed: int, *, n: int = 20, f: int = 4, d: int = 200) -> Round:
    """``n`` float64 updates ``1 + N(0, 1)`` per coordinate; the first ``f`` are malicious."""
    generator = torch.Generator().manual_seed(seed)
    updates = 1.0 + torch.randn(n, d, generator=generator, dtype=torch.float64)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[:f] = True
    return updates, mask


@pytest.fixture
def synthetic_round() -> Callable[..., Round]:
    return gaussian_round


@pytest.fixture
def damage() -> Callable[[Callable[[Tensor], Tensor], Tensor, Tensor], float]:
    """How far a rule's aggregate of an attacked round lands from the honest mean (L2)."""

    def distance(rule: Callable[[Tensor], Tensor], attacked: Tensor, mask: Tensor) -> float:
        return float(torch.linalg.vector_norm(rule(attacked) - attacked[~mask].mean(dim=0)))

    return distance


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Run a tiny model on one intra-op thread (restored after): at width 8 a second thread
    buys nothing, and on a shared, loaded machine its OpenMP barriers slowed the backdoor's
    federation more than tenfold."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
