"""Local training of one client: start from the global model, run SGD on the client's own
data, return the update Δ = w_local − w_global and the sample count.

FedProx (Li et al. 2020, https://arxiv.org/abs/1812.06127) is the option ``prox_mu``: the
local objective gains μ/2·‖w − w_global‖² over the trainable parameters.

The SGD step is :func:`sgd_step_`, shared with the batched backend: ``torch.optim.SGD``'s
arithmetic on lists of tensors (:mod:`federated.foreach_sgd` says why it is not
``torch.optim`` itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from federated.foreach_sgd import sgd_step_ as foreach_sgd_step_
from federated.seeding import LOCAL_WORK, derive_seed, torch_generator
from federated.vectors import layout_of, model_to_vector, vector_to_model_
from registry.constraints import POSITIVE, Interval, allowed, check_fields

__all__ = [
    "ClientData",
    "ClientUpdate",
    "ControlVariates",
    "LocalTraining",
    "LocalWork",
    "RegisteredClient",
    "client_gradient",
    "local_steps",
    "parameter_mask",
    "round_epochs",
    "scaffold_control_delta",
    "sgd_step_",
    "train_client",
]


@dataclass(frozen=True, kw_only=True)
class LocalTraining:
    """Hyperparameters of one client's local SGD."""

    epochs: int = field(default=1, metadata=allowed(Interval(int, 1)))  # passes over its data
    lr: float = field(default=0.01, metadata=allowed(POSITIVE))
    # SGD's momentum: 1 or more never forgets a step
    momentum: float = field(default=0.9, metadata=allowed(Interval(float, 0, 1, closed="left")))
    weight_decay: float = field(default=0.0, metadata=allowed(Interval(float, 0)))
    batch_size: int = field(default=32, metadata=allowed(Interval(int, 1)))
    # FedProx proximal weight; 0 is plain FedAvg local training
    prox_mu: float = field(default=0.0, metadata=allowed(Interval(float, 0)))

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class LocalWork:
    """Heterogeneous local work (what FedNova is for): each client draws its local epochs
    for a round uniformly from ``epochs`` = (low, high), both included, seeded by (run
    seed, round, client), so a resumed run and either backend draw the same."""

    epochs: tuple[int, int]

    def __post_init__(self) -> None:
        low, high = self.epochs
        if not 1 <= low <= high:
            raise ValueError(
                f"local_work epochs must be [low, high] with 1 <= low <= high, got {list(self.epochs)}"
            )

    def epochs_of(self, seed: int, round_number: int, client_id: int) -> int:
        """The client's local epochs in the round."""
        generator = np.random.default_rng(derive_seed(seed, round_number, client_id, LOCAL_WORK))
        return int(generator.integers(self.epochs[0], self.epochs[1] + 1))


def round_epochs(
    local: LocalTraining | None, work: LocalWork | None, seed: int, round_number: int,
    client_id: int,
) -> int:  # fmt: skip
    """A client's local epochs in a round: drawn by ``work``, else ``local.epochs``."""
    if work is not None:
        return work.epochs_of(seed, round_number, client_id)
    assert local is not None  # asked only where clients train by ``local``
    return local.epochs


def local_steps(num_samples: int, batch_size: int, epochs: int) -> int:
    """The SGD steps :func:`train_client` takes on ``num_samples`` samples: its batches per
    epoch (a trailing one-sample batch joins the previous one) times ``epochs``."""
    per_epoch = math.ceil(num_samples / batch_size)
    if per_epoch > 1 and num_samples % batch_size == 1:
        per_epoch -= 1
    return per_epoch * epochs


@dataclass(frozen=True)
class ClientData:
    """One client's training data, already on the training device."""

    client_id: int
    images: Tensor  # (N, C, H, W) float32
    targets: Tensor  # (N,) int64, or (N, L) float32 for multi-label tasks

    def __len__(self) -> int:
        return int(self.targets.shape[0])


@dataclass(frozen=True)
class RegisteredClient:
    """A client whose data lives elsewhere (a site): its id and the training-sample count
    registered for it at the server, the count its update is weighted by (a site's own
    report is not trusted where it could tip a weighted mean)."""

    client_id: int
    num_samples: int
    name: str = ""  # the site's name (its Flower node is the executor's business)

    def __len__(self) -> int:
        return self.num_samples


@dataclass(frozen=True)
class ClientUpdate:
    client_id: int
    delta: Tensor  # (d,) float32, w_local - w_global over the model's floating state
    num_samples: int
    train_loss: float  # mean loss over the last local epoch
    # SCAFFOLD: Δc_i = c_i⁺ − c_i, the change of the client's control variate (d,)
    control_delta: Tensor | None = None


@dataclass(frozen=True)
class ControlVariates:
    """SCAFFOLD's control variates a client trains with (Karimireddy et al. 2020,
    Algorithm 1): the server's ``c`` and the client's own ``c_i``, each ``(d,)`` over the
    model's floating state (0 on entries that are not trainable parameters)."""

    server: Tensor
    client: Tensor


def batch_order(num_samples: int, seed: int) -> Tensor:
    """The epoch's sample order, drawn on the CPU so every device sees the same batches."""
    return torch.randperm(num_samples, generator=torch_generator(seed))


def batches(order: Tensor, batch_size: int) -> list[Tensor]:
    """Consecutive batches of ``order``; a trailing batch of one sample joins the previous
    one (BatchNorm cannot train on a single sample)."""
    chunks = list(order.split(batch_size))
    if len(chunks) > 1 and len(chunks[-1]) == 1:
        chunks[-2:] = [torch.cat(chunks[-2:])]
    return chunks


def train_client(
    model: nn.Module,
    global_vector: Tensor,
    data: ClientData,
    config: LocalTraining,
    loss_fn: nn.Module,
    *,
    seed: int,
    control: ControlVariates | None = None,
) -> ClientUpdate:
    """Train ``model`` (used as a workspace: its state is overwritten with
    ``global_vector`` first) on ``data`` and return the client's update. ``seed`` drives
    the batch order of every epoch. With SCAFFOLD's ``control``, every step's gradient is
    corrected by ``c − c_i`` and the update carries Δc_i (option II)."""
    vector_to_model_(model, global_vector)
    model.train()
    weights = [p for p in model.parameters() if p.requires_grad]
    corrections = _corrections(model, control) if control is not None else []
    anchors = [w.detach().clone() for w in weights] if config.prox_mu > 0 else []
    momenta = [torch.zeros_like(w) for w in weights] if config.momentum else []
    device = data.images.device
    epoch_loss = float("nan")
    for epoch in range(config.epochs):
        order = batch_order(len(data), derive_seed(seed, epoch)).to(device)
        total, count = 0.0, 0
        for index in batches(order, config.batch_size):
            loss = loss_fn(model(data.images[index]), data.targets[index])
            grads = torch.autograd.grad(loss, weights, allow_unused=True)
            if corrections:  # y ← y − η(g − c_i + c)
                grads = tuple(
                    g if g is None else g + k for g, k in zip(grads, corrections, strict=True)
                )
            used = [i for i, g in enumerate(grads) if g is not None]  # torch.optim skips the rest
            with torch.no_grad():
                sgd_step_(
                    [weights[i] for i in used],
                    [grads[i] for i in used],
                    [anchors[i] for i in used] if anchors else [],
                    [momenta[i] for i in used] if momenta else [],
                    config,
                )
            total += loss.item() * len(index)
            count += len(index)
        epoch_loss = total / count
    delta = model_to_vector(model) - global_vector
    control_delta = None
    if control is not None:
        steps = local_steps(len(data), config.batch_size, config.epochs)
        on_parameters = parameter_mask(model).to(delta.device)
        control_delta = scaffold_control_delta(delta, control, steps, config.lr, on_parameters)
    return ClientUpdate(
        client_id=data.client_id, delta=delta, num_samples=len(data), train_loss=epoch_loss,
        control_delta=control_delta,
    )  # fmt: skip


def _corrections(model: nn.Module, control: ControlVariates) -> list[Tensor]:
    """``c − c_i`` shaped as each trainable parameter, in ``model.parameters()`` order."""
    difference = control.server - control.client
    slices = layout_of(model).slices()
    return [
        difference[slices[name]].view(p.shape).to(p.dtype)
        for name, p in model.named_parameters()
        if p.requires_grad
    ]


def parameter_mask(model: nn.Module) -> Tensor:
    """``(d,)`` bool: the entries of the model's vector that are trainable parameters
    (not buffers such as BatchNorm's running statistics)."""
    slices = layout_of(model).slices()
    mask = torch.zeros(layout_of(model).size, dtype=torch.bool)
    for name, p in model.named_parameters():
        if p.requires_grad:
            mask[slices[name]] = True
    return mask


def scaffold_control_delta(
    delta: Tensor, control: ControlVariates, steps: int, lr: float, on_parameters: Tensor
) -> Tensor:
    """SCAFFOLD's option II: c_i⁺ = c_i − c + (x − y_i)/(K·η_l), so Δc_i = c_i⁺ − c_i =
    −c − Δy_i/(K·η_l), on the trainable parameters' entries (``on_parameters``; the
    buffers' stay 0: no gradient is corrected there)."""
    return torch.where(on_parameters, -control.server - delta / (steps * lr), 0.0)


def sgd_step_(
    weights: list[Tensor],
    grads: list[Tensor],
    anchors: list[Tensor],
    momenta: list[Tensor],
    config: LocalTraining,
) -> None:
    """One ``torch.optim.SGD`` step with ``config``'s settings (see
    :func:`federated.foreach_sgd.sgd_step_`); works on single models and on the batched
    backend's stacks ``(G, ...)`` alike."""
    foreach_sgd_step_(
        weights, grads, anchors, momenta, lr=config.lr, momentum=config.momentum,
        weight_decay=config.weight_decay, prox_mu=config.prox_mu,
    )  # fmt: skip


def client_gradient(
    model: nn.Module,
    global_vector: Tensor,
    data: ClientData,
    loss_fn: nn.Module,
    *,
    batch_size: int = 256,
) -> Tensor:
    """The gradient ``(d,)`` of the client's mean loss over all its data at
    ``global_vector`` (one pass, no update): what EMA's pre-test examines. Entries of the
    state that are not trainable parameters (BatchNorm buffers) are 0."""
    vector_to_model_(model, global_vector)
    model.train()
    model.zero_grad(set_to_none=False)
    for start in range(0, len(data), batch_size):
        images = data.images[start : start + batch_size]
        weight = len(images) / len(data)  # mean over all samples, whatever the batching
        (loss_fn(model(images), data.targets[start : start + batch_size]) * weight).backward()
    grads = dict(model.named_parameters())
    parts = []
    for name, value in model.state_dict().items():
        if not value.is_floating_point():
            continue
        parameter = grads.get(name)
        grad = parameter.grad if parameter is not None and parameter.grad is not None else None
        parts.append(
            grad.reshape(-1).float()
            if grad is not None
            else torch.zeros(value.numel(), device=value.device)
        )
    model.zero_grad(set_to_none=True)
    return torch.cat(parts)
