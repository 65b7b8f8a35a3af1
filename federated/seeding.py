"""Seeds derived from (run seed, round, client, purpose): reproducible without stored RNGs.

Every random draw in a federation (client sampling, a client's batch order, an attack's
noise) takes its own seed from :func:`derive_seed`. A run resumed from round t therefore
draws exactly what an uninterrupted run would, and a client's batches do not depend on
which other clients were sampled or on the training backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

__all__ = [
    "SAMPLERS",
    "clients_per_round",
    "derive_seed",
    "sample_clients",
    "sample_clients_stream",
    "seeded_init",
    "torch_generator",
]

T = TypeVar("T")

# Purposes, so that two draws for the same (round, client) never share a stream.
SAMPLING, SHUFFLE, ATTACK, INIT, PREAGGREGATION, PRIVACY, LOCAL_WORK = 1, 2, 3, 4, 5, 6, 7
CLIENT_STREAM = 0xC11E  # the key of "stream" sampling's one generator (FedStNN's records)


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed from the run seed and integer keys (numpy's SeedSequence hashing)."""
    state = np.random.SeedSequence([int(seed), *(int(k) for k in keys)]).generate_state(
        2, np.uint32
    )
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def torch_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def seeded_init(seed: int, build: Callable[[], T]) -> T:
    """Run ``build`` (e.g. a model constructor, which draws from torch's global RNG) under
    ``seed`` without disturbing the caller's global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, INIT))
        return build()


def clients_per_round(fraction: float, population: int) -> int:
    """Clients sampled each round: ``ceil(fraction * population)``, at least one (the one
    definition the server, the preflight check and the privacy accountant share)."""
    return max(1, math.ceil(fraction * population - 1e-9))


def sample_clients(seed: int, round_number: int, population: int, count: int) -> list[int]:
    """The ``count`` client positions of ``population`` sampled for a round, sorted: a
    seeded draw without replacement, the same whichever clients were drawn before."""
    if count >= population:
        return list(range(population))
    rng = np.random.default_rng(derive_seed(seed, round_number, SAMPLING))
    return sorted(int(i) for i in rng.choice(population, size=count, replace=False))


def sample_clients_stream(seed: int, round_number: int, population: int, count: int) -> list[int]:
    """The ``count`` client positions sampled for a round, sorted, from one generator that
    draws round after round (``sampling="stream"``, FedStNN's rule, with which its
    committed records were made): a round's draw depends on the rounds before it, so it is
    replayed from round 1, and a resumed run still draws what an uninterrupted one does."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, CLIENT_STREAM]))
    for _ in range(round_number - 1):
        rng.choice(population, size=count, replace=False)
    return sorted(int(i) for i in rng.choice(population, size=count, replace=False))


# FederationConfig.sampling -> the rule
SAMPLERS: dict[str, Callable[[int, int, int, int], list[int]]] = {
    "per_round": sample_clients,
    "stream": sample_clients_stream,
}
