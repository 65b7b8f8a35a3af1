"""Model state <-> flat vector: the one place where a state_dict becomes an update row.

Every floating-point entry of ``model.state_dict()`` (parameters and float buffers such
as BatchNorm running statistics) is part of the vector, in ``state_dict`` order. Integer
buffers (``num_batches_tracked``) are not: they are counters, not weights, and are left
as the global model has them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["StateLayout", "layout_of", "model_to_vector", "vector_to_model_"]


@dataclass(frozen=True)
class StateLayout:
    """Names, shapes and offsets of the floating entries of a model's state_dict."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(int(torch.Size(s).numel()) for s in self.shapes)

    @property
    def size(self) -> int:
        return sum(self.numels)

    def slices(self) -> dict[str, slice]:
        """``name -> slice`` into the flat vector."""
        out: dict[str, slice] = {}
        start = 0
        for name, numel in zip(self.names, self.numels, strict=True):
            out[name] = slice(start, start + numel)
            start += numel
        return out


def layout_of(model: nn.Module) -> StateLayout:
    entries = [(k, v) for k, v in model.state_dict().items() if v.is_floating_point()]
    return StateLayout(
        names=tuple(k for k, _ in entries), shapes=tuple(tuple(v.shape) for _, v in entries)
    )


def model_to_vector(model: nn.Module) -> Tensor:
    """A detached copy of the model's floating state as one 1-D float32 tensor."""
    state = model.state_dict()
    parts = [v.detach().reshape(-1).float() for v in state.values() if v.is_floating_point()]
    return torch.cat(parts)


@torch.no_grad()
def vector_to_model_(model: nn.Module, vector: Tensor) -> None:
    """Write ``vector`` into the model's floating state in place (the inverse of
    :func:`model_to_vector`)."""
    targets = [v for v in model.state_dict().values() if v.is_floating_point()]
    expected = sum(v.numel() for v in targets)
    if expected != vector.numel():
        raise ValueError(f"vector has {vector.numel()} entries, the model's state has {expected}")
    offset = 0
    for value in targets:
        value.copy_(vector[offset : offset + value.numel()].view_as(value))
        offset += value.numel()
