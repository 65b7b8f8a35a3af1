"""Many clients trained at once on one device: the batched client-training backend.

Every client's copy of the model is one slice of stacked parameters ``(P, *shape)``; a
local SGD step of ``P`` clients is one ``torch.func.vmap(grad(functional_call(...)))``
call (convolutions become grouped convolutions, linear layers batched matmuls) followed
by a hand-written SGD update on the stacks. The result equals :func:`train_client` run
client by client, up to float rounding:

- Batches: each client draws its epoch order exactly as the sequential backend does
  (:func:`~federated.client.batch_order` with ``derive_seed(seed, epoch)`` on the CPU,
  then :func:`~federated.client.batches`, a trailing 1-sample batch merged). Step ``t`` of
  an epoch trains every client that has a ``t``-th batch; a client whose batches are used
  up is frozen (parameters and momentum untouched) until the epoch ends. Clients whose
  ``t``-th batches differ in size (last batches) are trained in separate vmap calls, one
  per size, so no padding sample ever enters a loss or a BatchNorm statistic and the loss
  is ``loss_fn`` itself (the mean over the client's real samples).
- SGD: ``torch.optim.SGD`` semantics (no dampening, no Nesterov): ``g ← ∇loss +
  μ(w − w_g)`` (FedProx's ``μ/2‖w − w_g‖²``), ``g ← g + λw`` (weight decay), ``b ← m·b +
  g`` (``b ← g`` at the first step), ``w ← w − lr·b``.
- BatchNorm: supported, with per-client running statistics kept functionally. In the
  vmapped forward each BatchNorm layer normalises with the batch statistics (as
  ``nn.BatchNorm*d`` does in train mode) and returns that batch's mean and unbiased
  variance; the running mean/var stacks ``(P, C)`` are then updated outside the
  transform exactly as the train-mode layer does in place, ``r ← (1 − momentum)·r +
  momentum·stat``. They are part of each client's Δ, as in the sequential backend;
  ``num_batches_tracked`` is an integer counter outside the update vector in both.
  Layers with ``momentum=None`` (cumulative averages), dropout (a random mask per call)
  and instance norm with running statistics are not supported: see
  :func:`batched_unsupported_reason`.
- Memory: clients are trained in chunks of at most ``max_parallel`` (default: sized to
  the free device memory); a chunk holds its stacked parameters, momenta and gradients
  (``3·P·n_params`` floats) plus ``P`` batches' activations, and the returned deltas are
  the only ``O(n_clients·n_params)`` tensor kept across chunks.

Exactness: in float64 both backends return the same update to the last float32 bit. In
float32 each step agrees to rounding (~1e-6 relative: grouped and plain convolutions sum
in different orders), and short runs stay within 1e-5; over many steps, deep ReLU and
max-pool networks can turn rounding into 1e-4..1e-3 drift (a pre-activation near zero
flips sign and the gradient jumps), exactly as two sequential float32 runs with
different convolution kernels (oneDNN on or off) drift apart. On a GPU, cuDNN's TF32
convolutions (``torch.backends.cudnn.allow_tf32``, on by default) add ~1e-3 per step to
either backend; disable TF32 to compare them.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional

from federated.client import (
    ClientData,
    ClientUpdate,
    ControlVariates,
    LocalTraining,
    batch_order,
    batches,
    local_steps,
    parameter_mask,
    scaffold_control_delta,
    sgd_step_,
)
from federated.seeding import derive_seed
from federated.vectors import StateLayout, layout_of, vector_to_model_

__all__ = [
    "auto_max_parallel",
    "batched_pays",
    "batched_unsupported_reason",
    "supports_batched",
    "train_clients_batched",
]


DROPOUT = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)
BATCH_NORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
INSTANCE_NORM = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)


def batched_unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model`` cannot be trained by the batched backend exactly as by the
    sequential one, or ``None`` when it can."""
    for name, module in model.named_modules():
        where = name or type(model).__name__
        if isinstance(module, DROPOUT) and module.p > 0:
            return f"{where} is a dropout layer (a random mask per call differs per backend)"
        if isinstance(module, INSTANCE_NORM) and module.track_running_stats:
            return f"{where} is an instance norm with running statistics"
        if (
            isinstance(module, BATCH_NORM)
            and module.track_running_stats
            and module.momentum is None
        ):
            return f"{where} is a BatchNorm with momentum=None (cumulative average)"
    seen: dict[int, str] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) in seen:
            return f"{name} and {seen[id(value)]} share one tensor (tied weights)"
        seen[id(value)] = name
        if not value.is_floating_point() and not name.endswith("num_batches_tracked"):
            return f"{name} is a non-floating buffer the batched backend does not update"
    return None


CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def batched_pays(model: nn.Module, device: torch.device) -> bool:
    """Whether training clients together is faster than one by one here: on CUDA, always
    (many clients' small steps fill the GPU); on a CPU only for models without
    convolutions, whose steps are small matrix products dominated by per-step overhead
    (a CPU's convolutions are already compute-bound one client at a time, and vmapped
    they run slower). Measured by ``python -m benchmarks.speed.grid_throughput`` (backend sweep:
    docs/results.md)."""
    if device.type == "cuda":
        return True
    return not any(isinstance(module, CONVOLUTIONS) for module in model.modules())


def supports_batched(model: nn.Module) -> bool:
    """Whether :func:`train_clients_batched` trains ``model`` exactly as sequentially."""
    return batched_unsupported_reason(model) is None


class _BatchStatsNorm(nn.Module):
    """A train-mode BatchNorm for the vmapped forward: normalises with the batch's
    statistics and records them (mean, unbiased variance) for the running averages."""

    def __init__(
        self,
        source: nn.BatchNorm2d,
        name: str,
        sink: dict[str, tuple[Tensor, Tensor]],
    ):
        super().__init__()
        self.weight = source.weight
        self.bias = source.bias
        self.eps = source.eps
        self.name = name
        self.record = source.track_running_stats
        self.sink = sink

    def forward(self, x: Tensor) -> Tensor:  # (N, C, ...) per client
        if self.record:
            if self.name in self.sink:
                raise RuntimeError(f"BatchNorm {self.name} is called twice in one forward")
            detached = x.detach()
            dims = [0, *range(2, x.dim())]
            self.sink[self.name] = (detached.mean(dims), detached.var(dims, correction=1))
        return functional.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)


@dataclass(frozen=True)
class _Workspace:
    module: nn.Module  # a copy of the model in train mode, BatchNorms replaced
    sink: dict[str, tuple[Tensor, Tensor]]
    trainable: tuple[str, ...]  # parameter names that SGD updates
    norms: dict[str, float]  # BatchNorm prefix -> momentum, for layers with running stats
    layout: StateLayout  # the original model's floating state, the order of a delta


def _workspace(model: nn.Module, global_vector: Tensor) -> _Workspace:
    module = copy.deepcopy(model)
    vector_to_model_(module, global_vector)
    module.train()
    sink: dict[str, tuple[Tensor, Tensor]] = {}
    norms: dict[str, float] = {}
    for name, child in list(module.named_modules()):
        if isinstance(child, BATCH_NORM):
            if child.track_running_stats:
                norms[name] = float(child.momentum)  # type: ignore[arg-type]
            parent_name, _, attribute = name.rpartition(".")
            parent = module.get_submodule(parent_name)
            setattr(parent, attribute, _BatchStatsNorm(child, name, sink))
            if child.track_running_stats:  # keep the stats in the workspace's state
                stats = module.get_submodule(name)
                stats.register_buffer("running_mean", child.running_mean)
                stats.register_buffer("running_var", child.running_var)
    trainable = tuple(n for n, p in module.named_parameters() if p.requires_grad)
    return _Workspace(
        module=module, sink=sink, trainable=trainable, norms=norms, layout=layout_of(model)
    )


def auto_max_parallel(
    model: nn.Module,
    sample: Tensor,
    batch_size: int,
    *,
    budget_fraction: float = 0.5,
    budget_bytes: int | None = None,
) -> int:
    """How many clients fit in one chunk: ``budget_fraction`` of the free memory of
    ``sample``'s device (at most ``budget_bytes``) over an estimate per client: 4 copies
    of the parameters (weights, momenta, gradients, a gathered copy) and every module
    output of one batch kept twice for the backward pass."""
    device = sample.device
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            free = 8 << 30
    budget = budget_fraction * free
    if budget_bytes is not None:
        budget = min(budget, budget_bytes)
    outputs: list[int] = []
    hooks = [
        m.register_forward_hook(
            lambda _m, _i, out: outputs.append(out.numel() if isinstance(out, Tensor) else 0)
        )
        for m in model.modules()
        if not list(m.children())
    ]
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()(sample[:1])
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    n_params = sum(p.numel() for p in model.parameters())
    per_client = 4 * (4 * n_params + 2 * sum(outputs) * (batch_size + 1))
    return max(1, int(budget // per_client))


@dataclass(frozen=True)
class _Step:
    members: Tensor  # (G,) positions in the chunk, on the device
    index: Tensor  # (G, B) rows of the chunk's concatenated data, on the device
    full: bool  # all clients of the chunk, in order: no gather/scatter


def _schedule(
    sizes: Sequence[int], offsets: Sequence[int], seeds: Sequence[int], epoch: int, batch_size: int
) -> list[list[tuple[list[int], Tensor]]]:
    """Per step of one epoch: (member positions, (G, B) data rows) per batch size."""
    per_client = [
        batches(batch_order(n, derive_seed(seed, epoch)), batch_size)
        for n, seed in zip(sizes, seeds, strict=True)
    ]
    steps: list[list[tuple[list[int], Tensor]]] = []
    for t in range(max(len(b) for b in per_client)):
        groups: dict[int, list[int]] = {}
        for position, client_batches in enumerate(per_client):
            if t < len(client_batches):
                groups.setdefault(len(client_batches[t]), []).append(position)
        steps.append(
            [
                (members, torch.stack([per_client[p][t] + offsets[p] for p in members]))
                for _, members in sorted(groups.items())
            ]
        )
    return steps


def _to_device(
    steps: list[list[tuple[list[int], Tensor]]], count: int, device: torch.device
) -> list[list[_Step]]:
    """One host-to-device copy per epoch for all index tensors."""
    flat = [(members, index) for step in steps for members, index in step]
    blob = torch.cat(
        [torch.tensor(m, dtype=torch.long) for m, _ in flat] + [i.reshape(-1) for _, i in flat]
    ).to(device)
    pieces = iter(blob.split([len(m) for m, _ in flat] + [i.numel() for _, i in flat]))
    members_on_device = [next(pieces) for _ in flat]
    index_on_device = [next(pieces).view_as(index) for _, index in flat]
    out: list[list[_Step]] = []
    position = 0
    for step in steps:
        row = []
        for members, _ in step:
            row.append(
                _Step(
                    members=members_on_device[position],
                    index=index_on_device[position],
                    full=members == list(range(count)),
                )
            )
            position += 1
        out.append(row)
    return out


@dataclass(frozen=True)
class _ChunkData:
    """A chunk's clients' samples one after another, so a batch is a set of row indices."""

    images: Tensor  # (sum N, C, H, W)
    targets: Tensor  # (sum N,)
    sizes: list[int]  # N per client
    offsets: list[int]  # each client's first row


def _chunk_data(clients: Sequence[ClientData]) -> _ChunkData:
    """The clients' data concatenated; a client without samples is an error."""
    sizes = [len(c) for c in clients]
    for client, size in zip(clients, sizes, strict=True):
        if size == 0:
            raise ValueError(f"client {client.client_id} has no samples")
    offsets = [0]
    for size in sizes[:-1]:
        offsets.append(offsets[-1] + size)
    return _ChunkData(
        images=torch.cat([c.images for c in clients]),
        targets=torch.cat([c.targets for c in clients]),
        sizes=sizes,
        offsets=offsets,
    )


@dataclass(frozen=True)
class _Stacks:
    """Every client's training state, one row per client of the chunk (``P`` rows),
    updated in place step by step."""

    count: int  # P
    params: dict[str, Tensor]  # trainable parameter -> (P, *shape)
    momenta: dict[str, Tensor]  # the same keys (empty without momentum) -> (P, *shape)
    running: dict[str, Tensor]  # "<BatchNorm>.running_mean" / "...running_var" -> (P, C)
    anchors: list[Tensor]  # the global weights, in the order of params (FedProx)
    # SCAFFOLD: each client's c − c_i added to its every gradient (empty without) -> (P, *shape)
    corrections: dict[str, Tensor]


def _corrections(
    space: _Workspace, params: dict[str, Tensor], controls: Sequence[ControlVariates]
) -> dict[str, Tensor]:
    """SCAFFOLD's ``c − c_i`` of each client, shaped as each trainable stack."""
    difference = torch.stack([c.server - c.client for c in controls])  # (P, d)
    slices = space.layout.slices()
    return {
        k: difference[:, slices[k]].reshape(stack.shape).to(stack.dtype)
        for k, stack in params.items()
    }


def _stacks(
    space: _Workspace,
    count: int,
    config: LocalTraining,
    controls: Sequence[ControlVariates] | None = None,
) -> _Stacks:
    """``count`` copies of the workspace's (global) state; momenta start at zero."""
    named = dict(space.module.named_parameters())
    params = {
        k: named[k].detach().unsqueeze(0).repeat(count, *([1] * named[k].dim()))
        for k in space.trainable
    }
    running = {
        f"{prefix}.{stat}": space.module.get_buffer(f"{prefix}.{stat}")
        .detach()
        .unsqueeze(0)
        .repeat(count, 1)
        for prefix in space.norms
        for stat in ("running_mean", "running_var")
    }
    return _Stacks(
        count=count,
        params=params,
        momenta={k: torch.zeros_like(v) for k, v in params.items()} if config.momentum else {},
        running=running,
        anchors=[named[k].detach() for k in space.trainable],
        corrections=_corrections(space, params, controls) if controls else {},
    )


_BatchStats = dict[str, tuple[Tensor, Tensor]]  # BatchNorm -> a batch's (mean, unbiased var)
# (weights, x, y) -> (loss, (loss, stats)); its vmapped gradient -> (grads, (losses, stats))
_Objective = Callable[
    [dict[str, Tensor], Tensor, Tensor], tuple[Tensor, tuple[Tensor, _BatchStats]]
]
_StepFn = Callable[
    [dict[str, Tensor], Tensor, Tensor], tuple[dict[str, Tensor], tuple[Tensor, _BatchStats]]
]


def _objective(space: _Workspace, loss_fn: nn.Module) -> _Objective:
    """One client's loss at ``weights`` on a batch, with (the loss, the batch statistics of
    each BatchNorm with running statistics) as auxiliary outputs."""
    module, sink = space.module, space.sink

    def objective(
        weights: dict[str, Tensor], x: Tensor, y: Tensor
    ) -> tuple[Tensor, tuple[Tensor, _BatchStats]]:
        sink.clear()
        loss = loss_fn(functional_call(module, weights, (x,)), y)
        stats = {name: sink[name] for name in space.norms}
        sink.clear()
        return loss, (loss.detach(), stats)

    return objective


def _gather(stack: Tensor, group: _Step) -> Tensor:
    """The group's rows of a ``(P, ...)`` stack: the stack itself when the group is the
    whole chunk in order."""
    return stack if group.full else stack.index_select(0, group.members)


def _scatter_(stack: Tensor, group: _Step, rows: Tensor) -> None:
    """Write the group's ``rows`` back into ``stack`` (nothing to do when they are it)."""
    if rows is stack:
        return
    if group.full:
        stack.copy_(rows)
    else:
        stack.index_copy_(0, group.members, rows)


def _update_running_(
    stacks: _Stacks, norms: dict[str, float], stats: _BatchStats, group: _Step
) -> None:
    """nn.BatchNorm's in-place train-mode update of the group's running statistics:
    ``r ← (1 − momentum)·r + momentum·stat``."""
    for prefix, momentum in norms.items():
        mean, var = stats[prefix]  # (G, C)
        for stat, value in (("running_mean", mean), ("running_var", var)):
            buffer = stacks.running[f"{prefix}.{stat}"]
            rows = _gather(buffer, group).mul(1 - momentum).add_(value, alpha=momentum)
            _scatter_(buffer, group, rows)


def _train_group_(
    step_fn: _StepFn,
    space: _Workspace,
    stacks: _Stacks,
    data: _ChunkData,
    group: _Step,
    config: LocalTraining,
) -> Tensor:
    """One local SGD step of the group's clients, each on its own batch; their losses (G,)."""
    x, y = data.images[group.index], data.targets[group.index]  # (G, B, ...)
    names = list(stacks.params)
    weights = [_gather(stacks.params[k], group) for k in names]
    buffers = [_gather(stacks.momenta[k], group) for k in stacks.momenta]
    grads, (losses, stats) = step_fn(dict(zip(names, weights, strict=True)), x, y)
    with torch.no_grad():
        for k, correction in stacks.corrections.items():  # SCAFFOLD: g − c_i + c
            grads[k] = grads[k] + _gather(correction, group)
        sgd_step_(weights, [grads[k] for k in names], stacks.anchors, buffers, config)
        for k, rows in zip(names, weights, strict=True):
            _scatter_(stacks.params[k], group, rows)
        for k, rows in zip(stacks.momenta, buffers, strict=True):
            _scatter_(stacks.momenta[k], group, rows)
        _update_running_(stacks, space.norms, stats, group)
    return losses


def _mean_losses(last_losses: list[tuple[Tensor, Tensor, int]], count: int) -> list[float]:
    """Each client's mean loss over its batches ``(members, losses, batch size)`` of the
    last epoch, summed in batch order as train_client does."""
    totals = [0.0] * count
    counts = [0] * count
    for members, losses, size in last_losses:
        for position, value in zip(members.tolist(), losses.tolist(), strict=True):
            totals[position] += value * size
            counts[position] += size
    return [t / c for t, c in zip(totals, counts, strict=True)]


def _deltas(space: _Workspace, stacks: _Stacks, global_vector: Tensor) -> Tensor:
    """The clients' updates ``(P, d)`` in the order of the model's layout."""
    state = space.module.state_dict()
    columns = []
    for name in space.layout.names:
        if name in stacks.params:
            columns.append(stacks.params[name].reshape(stacks.count, -1))
        elif name in stacks.running:
            columns.append(stacks.running[name].reshape(stacks.count, -1))
        else:  # frozen parameters and untouched buffers keep the global value
            columns.append(state[name].detach().reshape(1, -1).expand(stacks.count, -1))
    return torch.cat(columns, dim=1).float().sub_(global_vector)


def _train_chunk(
    space: _Workspace,
    global_vector: Tensor,
    clients: Sequence[ClientData],
    config: LocalTraining,
    loss_fn: nn.Module,
    seeds: Sequence[int],
    controls: Sequence[ControlVariates] | None = None,
) -> tuple[Tensor, list[float]]:
    """Train one chunk of clients; their deltas ``(P, d)`` and last-epoch mean losses."""
    data = _chunk_data(clients)
    stacks = _stacks(space, len(clients), config, controls)
    step_fn = vmap(grad(_objective(space, loss_fn), has_aux=True))
    last_losses: list[tuple[Tensor, Tensor, int]] = []  # (members, losses, batch size)
    for epoch in range(config.epochs):
        order = _schedule(data.sizes, data.offsets, seeds, epoch, config.batch_size)
        schedule = _to_device(order, count=len(clients), device=global_vector.device)
        last = epoch == config.epochs - 1
        for step in schedule:
            for group in step:
                losses = _train_group_(step_fn, space, stacks, data, group, config)
                if last:
                    last_losses.append((group.members, losses, group.index.shape[1]))
    return _deltas(space, stacks, global_vector), _mean_losses(last_losses, len(clients))


def train_clients_batched(
    model: nn.Module,
    global_vector: Tensor,
    clients: Sequence[ClientData],
    config: LocalTraining,
    loss_fn: nn.Module,
    *,
    seeds: Sequence[int],
    max_parallel: int | None = None,
    controls: Sequence[ControlVariates] | None = None,
) -> list[ClientUpdate]:
    """Train ``clients`` from ``global_vector`` all at once; the same updates (up to
    rounding) as :func:`~federated.client.train_client` per client with the same seeds
    (and, SCAFFOLD, each with its ``controls``: its updates carry Δc_i).

    ``model`` is only read (a copy is the workspace). ``max_parallel`` caps the clients
    trained simultaneously (default: :func:`auto_max_parallel`). Clients are chunked in
    order of size so a chunk's clients run out of batches at about the same step.
    """
    if len(seeds) != len(clients) or (controls is not None and len(controls) != len(clients)):
        given = "" if controls is None else f" and {len(controls)} control variates"
        raise ValueError(f"{len(clients)} clients but {len(seeds)} seeds{given}")
    if not clients:
        return []
    reason = batched_unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"the batched backend cannot train this model: {reason}")
    if max_parallel is None:
        max_parallel = auto_max_parallel(model, clients[0].images, config.batch_size)
    if max_parallel < 1:
        raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")

    space = _workspace(model, global_vector)
    on_parameters = None if controls is None else parameter_mask(model).to(global_vector.device)
    order = sorted(range(len(clients)), key=lambda i: len(clients[i]))
    results: list[ClientUpdate | None] = [None] * len(clients)
    for start in range(0, len(order), max_parallel):
        chunk = order[start : start + max_parallel]
        deltas, losses = _train_chunk(
            space,
            global_vector,
            [clients[i] for i in chunk],
            config,
            loss_fn,
            [seeds[i] for i in chunk],
            None if controls is None else [controls[i] for i in chunk],
        )
        for row, (i, loss) in enumerate(zip(chunk, losses, strict=True)):
            results[i] = ClientUpdate(
                client_id=clients[i].client_id,
                delta=deltas[row],
                num_samples=len(clients[i]),
                train_loss=loss,
                control_delta=None
                if on_parameters is None
                else _control_delta(
                    deltas[row], controls[i], len(clients[i]), config, on_parameters
                ),
            )
    return [r for r in results if r is not None]


def _control_delta(
    delta: Tensor, control: ControlVariates, samples: int, config: LocalTraining,
    on_parameters: Tensor,
) -> Tensor:  # fmt: skip
    """SCAFFOLD's Δc_i of a client trained with ``control`` (option II, as
    :func:`~federated.client.train_client` computes it)."""
    steps = local_steps(samples, config.batch_size, config.epochs)
    return scaffold_control_delta(delta, control, steps, config.lr, on_parameters)
