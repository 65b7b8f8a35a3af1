"""The model registry: ``build_model(name, in_channels=..., num_classes=...)``."""

from __future__ import annotations

from typing import Any

from torch import nn

from registry import Registry

__all__ = ["MODELS", "build_model", "list_models", "register_model"]

MODELS: Registry[nn.Module] = Registry("model")
register_model = MODELS.register


def build_model(name: str, *, in_channels: int, num_classes: int, **params: Any) -> nn.Module:
    """Build the model registered as ``name`` for images with ``in_channels`` channels."""
    return MODELS.build(name, in_channels=in_channels, num_classes=num_classes, **params)


def list_models() -> list[str]:
    return MODELS.names()
