"""Multinomial logistic regression on flattened images: the model of the cross-device
benchmarks (FLUTE's LR-MNIST) and the smallest model a federation can train.

One linear layer from the ``in_channels × image_size²`` pixels to ``num_classes``
logits; about 7.9K parameters for 28×28 grey images in 10 classes.
"""

from __future__ import annotations

from torch import Tensor, nn

from models.registry import register_model

__all__ = ["LogisticRegression"]


@register_model("logreg")
class LogisticRegression(nn.Module):
    def __init__(self, *, in_channels: int, num_classes: int, image_size: int = 28) -> None:
        super().__init__()
        if in_channels < 1 or num_classes < 1 or image_size < 1:
            raise ValueError("in_channels, num_classes and image_size must be >= 1")
        self.linear = nn.Linear(in_channels * image_size * image_size, num_classes)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, num_classes)
        return self.linear(x.flatten(1))
