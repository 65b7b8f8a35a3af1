"""PyTorch models, looked up by name: ``build_model("resnet18", in_channels=1, num_classes=2)``
(volumes: ``small_cnn3d``, ``resnet18_3d``, ``resnet50_3d``)."""

from models import cnn, cnn3d, logreg, resnet  # noqa: F401  (registers the models)
from models.registry import (
    build_model,
    list_models,
    model_spatial_dims,
    register_model,
    register_volume_model,
)

__all__ = [
    "build_model",
    "list_models",
    "model_spatial_dims",
    "register_model",
    "register_volume_model",
]
