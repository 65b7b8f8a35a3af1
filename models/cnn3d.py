"""A small 3-D CNN for MedMNIST's volumes, sized for a CPU: most of its work is on small maps.

Three 3x3x3 conv blocks and a two-layer head; about 0.1M parameters at the defaults. The
first convolution has stride 2 and every block ends in a 2x2x2 max-pool (the last in an
adaptive average pool to 2x2x2), so a 64³ volume is 8³ after two blocks: most of the work
is done on small maps. No normalisation layer, as :class:`~models.cnn.SmallCNN`: each
client's model is a pure function of its weights. The same layers at 28 and 64 voxels;
the adaptive pool gives the head the same input at both.
"""

from __future__ import annotations

from torch import Tensor, nn

from models.registry import register_volume_model

__all__ = ["SmallCNN3D"]


@register_volume_model("small_cnn3d")
class SmallCNN3D(nn.Module):
    def __init__(
        self,
        *,
        in_channels: int,
        num_classes: int,
        width: int = 16,
        hidden: int = 64,
        image_size: int = 28,
    ) -> None:
        super().__init__()
        if in_channels < 1 or num_classes < 1 or width < 1 or hidden < 1:
            raise ValueError("in_channels, num_classes, width and hidden must be >= 1")
        if image_size < 16:
            raise ValueError(f"image_size must be >= 16, got {image_size}")
        self.features = nn.Sequential(
            nn.Conv3d(in_channels, width, 3, stride=2, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool3d(2),  # (B, width, size/4, size/4, size/4): 16³ at 64
            nn.Conv3d(width, 2 * width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool3d(2),  # (B, 2*width, size/8, ...): 8³ at 64, 3³ at 28
            nn.Conv3d(2 * width, 4 * width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool3d(2),  # (B, 4*width, 2, 2, 2)
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(4 * width * 8, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:  # (B, C, size, size, size) -> (B, num_classes)
        return self.head(self.features(x))
