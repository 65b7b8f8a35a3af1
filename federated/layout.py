"""The memory layout convolution weights are trained and evaluated in.

On a CPU, PyTorch sends convolutions whose weights are channels-last to oneDNN; with the
default (contiguous) weights of these small models it takes a slower path (measured by
``python -m benchmarks.speed.round_speed --device cpu``; docs/results.md). Only the layout
changes: state_dicts and the flat vectors of :mod:`federated.vectors` are read in logical
order, so the numbers differ from the contiguous layout by float rounding only. On CUDA
the layout is left alone: channels-last did not speed up rounds there
(``python -m benchmarks.speed.round_speed --device cuda --channels-last``). Models of
volumes (3-D convolutions, 5-D weights) are left alone too: channels-last is a layout of
4-D tensors, and its 3-D counterpart has not been measured here.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["use_fast_layout_"]


def use_fast_layout_(model: nn.Module, device: torch.device | str) -> nn.Module:
    """``model`` (changed in place) in the layout its convolutions run fastest in on
    ``device``."""
    volumes = any(p.dim() == 5 for p in model.parameters())
    if torch.device(device).type == "cpu" and not volumes:
        model.to(memory_format=torch.channels_last)  # 4-D weights only
    return model
