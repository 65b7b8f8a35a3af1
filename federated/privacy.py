"""Client-level differential privacy: DP-FedAvg and its privacy accounting.

DP-FedAvg (McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private Recurrent
Language Models", ICLR 2018, https://arxiv.org/abs/1710.06963), flat clipping with equal
client weights and the fixed-denominator estimator: each sampled client's update is
clipped to L2 norm ``clip`` (C); the server adds Gaussian noise of standard deviation
``noise_multiplier × C`` (z C) to the sum of the clipped updates and divides by the number
of clients sampled per round ``m`` (not by the number that arrived, so one client moves
the average by at most C / m whatever the others do).

- ``central``: the (trusted) server clips what it receives and adds the noise once.
- ``local``: every client clips its own update and adds N(0, (z C)²) before sending; the
  server only averages. The server never sees an un-noised update, and the released
  model carries at least the central mode's noise, so the ε below holds for it too;
  against the server itself a client's guarantee has no sampling amplification
  (:meth:`ClientPrivacy.site_epsilon`: the rounds the client sent an update in, q = 1).
  A simulation draws each client's noise from a seed of the run; a real site draws its
  own (:meth:`ClientPrivacy.privatised_by_site`), which the server cannot know or subtract.

Accounting is Opacus's RDP accountant (Mironov 2017; Mironov, Talwar and Zhang 2019 for
the subsampled Gaussian), never by hand: after t rounds at sampling rate q = m / N with
noise multiplier z, ε(t) at ``delta``. The accountant assumes Poisson sampling of clients
at rate q; the federation samples exactly m of N each round, the approximation TensorFlow
Federated's and Opacus's users make for fixed-size batches (docs/privacy.md).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from registry.constraints import POSITIVE, Interval, Options, allowed, check_fields

__all__ = ["ClientPrivacy", "epsilon_after", "released_rounds", "site_privacy"]


@functools.lru_cache(maxsize=4096)
def epsilon_after(
    rounds: int, *, noise_multiplier: float, sample_rate: float, delta: float
) -> float:
    """ε after ``rounds`` subsampled Gaussian releases (Opacus's RDP accountant), over
    Opacus's default RDP orders widened at both ends: federations run few rounds at
    sampling rates near 1, where the best order can lie below 1.1 (little noise) or above
    63 (much noise) and the default range would give a looser ε and a warning each round."""
    if rounds == 0:
        return 0.0
    from opacus.accountants import RDPAccountant

    orders = [1 + x / 100 for x in range(1, 10)] + RDPAccountant.DEFAULT_ALPHAS
    orders += [64, 80, 96, 128, 192, 256, 512, 1024]
    accountant = RDPAccountant()
    accountant.history = [(noise_multiplier, sample_rate, rounds)]  # (z, q, steps)
    return float(accountant.get_epsilon(delta, alphas=orders))


Mode = Literal["central", "local"]  # who adds the noise: the server, or each client


@dataclass(frozen=True, kw_only=True)
class ClientPrivacy:
    """DP-FedAvg's clipping and noise for a federation of ``population`` clients of which
    ``per_round`` are sampled each round, and its budget (``target_epsilon``)."""

    clip: float = field(metadata=allowed(POSITIVE))  # L2 norm each update is clipped to
    # noise std = noise_multiplier x clip
    noise_multiplier: float = field(metadata=allowed(POSITIVE))
    population: int = field(metadata=allowed(Interval(int, 1)))
    per_round: int = field(metadata=allowed(Interval(int, 1)))
    mode: Mode = field(default="central", metadata=allowed(Options.of(Mode)))
    delta: float = field(default=1e-5, metadata=allowed(Interval(float, 0, 1, closed="neither")))
    # no round may take ε past it (None: no budget)
    target_epsilon: float | None = field(default=None, metadata=allowed(POSITIVE, None))

    def __post_init__(self) -> None:
        check_fields(self)
        if self.per_round > self.population:
            raise ValueError(
                f"per_round must be at most the population ({self.population}), got {self.per_round}"
            )

    @property
    def sample_rate(self) -> float:
        """q: the share of the clients sampled in a round."""
        return self.per_round / self.population

    def epsilon(self, rounds: int) -> float:
        """ε at ``delta`` after ``rounds`` rounds."""
        return epsilon_after(
            rounds, noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate,
            delta=self.delta,
        )  # fmt: skip

    def admits(self, rounds: int) -> bool:
        """Whether ``rounds`` rounds stay within ``target_epsilon`` (always, without one)."""
        return self.target_epsilon is None or self.epsilon(rounds) <= self.target_epsilon

    def site_epsilon(self, updates_sent: int) -> float:
        """``local`` mode: one client's ε at ``delta`` against the server itself after it
        sent ``updates_sent`` noised updates. The server knows who was sampled, so there is
        no sampling amplification (q = 1): the guarantee a site holds whatever the server
        does, larger than the released model's :meth:`epsilon`."""
        return epsilon_after(
            updates_sent, noise_multiplier=self.noise_multiplier, sample_rate=1.0,
            delta=self.delta,
        )  # fmt: skip

    def site_admits(self, updates_sent: int) -> bool:
        """Whether a client's ``updates_sent`` updates stay within ``target_epsilon``."""
        return self.target_epsilon is None or self.site_epsilon(updates_sent) <= self.target_epsilon

    def clipped(self, updates: Tensor) -> Tensor:
        """Each row scaled down to L2 norm at most ``clip`` (rows within it unchanged)."""
        norms = torch.linalg.vector_norm(updates, dim=1, keepdim=True)
        return updates * torch.clamp(self.clip / norms.clamp_min(1e-12), max=1.0)

    def noise(self, shape: tuple[int, ...], like: Tensor, generator: torch.Generator) -> Tensor:
        """N(0, (z C)²) noise of ``shape``, ``like``'s dtype and device."""
        std = self.noise_multiplier * self.clip
        return std * torch.randn(shape, generator=generator, device=like.device, dtype=like.dtype)

    def privatised_by_clients(self, updates: Tensor, generators: list[torch.Generator]) -> Tensor:
        """``local`` mode: each client's clipped update plus its own noise (one generator
        per row: a client's noise does not depend on who else was sampled)."""
        clipped = self.clipped(updates)
        noise = [self.noise(row.shape, row, g) for row, g in zip(clipped, generators, strict=True)]
        return clipped + torch.stack(noise)

    def privatised_by_site(self, update: Tensor) -> Tensor:
        """``local`` mode at a real site: its clipped update plus noise from a generator
        seeded from the operating system's randomness, never from a seed the server
        knows (with it, the server could draw the same noise and subtract it)."""
        generator = torch.Generator(device=update.device)
        generator.manual_seed(secrets.randbits(63))
        return self.privatised_by_clients(update[None], [generator])[0]

    def released(self, total: Tensor, generator: torch.Generator) -> Tensor:
        """The fixed-denominator average the server releases from the ``total`` of the
        kept (clipped, or in local mode privatised) updates: central mode adds the noise."""
        if self.mode == "central":
            total = total + self.noise(tuple(total.shape), total, generator)
        return total / self.per_round


def site_privacy(
    *, clip: float, noise_multiplier: float, delta: float, target_epsilon: float | None
) -> ClientPrivacy:
    """A real site's local DP (``local`` mode, as the plan pins it): the site knows only
    itself, so its population is one; it clips, noises and accounts its own updates."""
    return ClientPrivacy(
        clip=clip, noise_multiplier=noise_multiplier, population=1, per_round=1,
        mode="local", delta=delta, target_epsilon=target_epsilon,
    )  # fmt: skip


def released_rounds(history: Sequence[Mapping[str, float]]) -> int:
    """The rounds of a run's ``history`` that released a model (aggregated; a skipped
    round keeps the last model and releases nothing): the rounds DP's ε counts."""
    return sum(1 for metrics in history if not metrics.get("round_skipped"))
