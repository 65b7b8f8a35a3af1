"""The model registry: ``build_model(name, in_channels=..., num_classes=...)``.

A model takes images ``(B, C, H, W)`` or volumes ``(B, C, D, H, W)``; a volume model is
registered with :func:`register_volume_model`, so that a run pairing a model with data of
the other kind is refused before anything is built (:func:`model_spatial_dims`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from registry import Registry

__all__ = [
    "MODELS",
    "build_model",
    "list_models",
    "model_spatial_dims",
    "register_model",
    "register_volume_model",
]

MODELS: Registry[nn.Module] = Registry("model")
register_model = MODELS.register
VOLUME_MODELS: set[str] = set()  # names of the models that take (B, C, D, H, W)


def register_volume_model(
    name: str,
) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """``register_model`` for a model of volumes ``(B, C, D, H, W)``."""
    VOLUME_MODELS.add(name)
    return MODELS.register(name)


def build_model(name: str, *, in_channels: int, num_classes: int, **params: Any) -> nn.Module:
    """Build the model registered as ``name`` for images with ``in_channels`` channels."""
    return MODELS.build(name, in_channels=in_channels, num_classes=num_classes, **params)


def model_spatial_dims(name: str) -> int:
    """2 for a model of images ``(B, C, H, W)``, 3 for one of volumes ``(B, C, D, H, W)``."""
    MODELS.factory(name)  # an unknown name raises, listing the models
    return 3 if name in VOLUME_MODELS else 2


def list_models(spatial_dims: int | None = None) -> list[str]:
    """Every model's name, or only those taking 2-D images or 3-D volumes."""
    return [n for n in MODELS.names() if spatial_dims in (None, model_spatial_dims(n))]
