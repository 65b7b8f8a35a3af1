"""PyTorch models, looked up by name: ``build_model("resnet18", in_channels=1, num_classes=2)``."""

from models import cnn, logreg, resnet  # noqa: F401  (registers the models)
from models.registry import build_model, list_models, register_model

__all__ = ["build_model", "list_models", "register_model"]
