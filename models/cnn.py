"""A small CNN for MedMNIST images: fast on CPU, the default federated model.

Two 3x3 conv blocks (conv-ReLU-maxpool) and a two-layer head; about 0.42M parameters at
the defaults. No normalisation layer, so every client's model is a pure function of its
weights (no running statistics to aggregate). At 28 px the blocks end on a 7x7 map; at the
MedMNIST+ sizes (64, 128, 224 px) an adaptive average pool brings the map to 7x7 too, so the
head and the parameter count are the same at every size.
"""

from __future__ import annotations

from torch import Tensor, nn

from models.registry import register_model

__all__ = ["SmallCNN"]


@register_model("small_cnn")
class SmallCNN(nn.Module):
    def __init__(
        self,
        *,
        in_channels: int,
        num_classes: int,
        width: int = 32,
        hidden: int = 128,
        image_size: int = 28,
    ) -> None:
        super().__init__()
        if in_channels < 1 or num_classes < 1 or width < 1 or hidden < 1:
            raise ValueError("in_channels, num_classes, width and hidden must be >= 1")
        if image_size < 28:
            raise ValueError(f"image_size must be >= 28, got {image_size}")
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # (B, width, 14, 14)
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # (B, 2*width, size/4, size/4)
        ]
        if image_size > 28:
            layers.append(nn.AdaptiveAvgPool2d(7))  # (B, 2*width, 7, 7)
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 7 * 7, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:  # (B, C, size, size) -> (B, num_classes)
        return self.head(self.features(x))
