"""ResNet-18/34/50 for MedMNIST at every size, as in the MedMNIST v2 / MedMNIST+ benchmarks,
and ResNet-18/50 for MedMNIST's 3-D volumes.

He et al. 2016, "Deep Residual Learning for Image Recognition". At 28 px, the adaptation of
Yang et al. 2023, "MedMNIST v2" (https://arxiv.org/abs/2110.14795): a 3x3 stride-1 stem
and no max-pool, so the four stages see 28, 14, 7 and 4 pixels. At 64 px and above (the
MedMNIST+ sizes), the standard ImageNet stem as MedMNIST+ trains it: a 7x7 stride-2
convolution and a 3x3 stride-2 max-pool. Written here compactly (torchvision is not a
dependency).

The 3-D models (``resnet18_3d``, ``resnet50_3d``) are MedMNIST v2's 3-D baselines as its
code builds them (github.com/MedMNIST/experiments, ``MedMNIST3D/models.py``): the 2-D
ResNet with the 3x3 stride-1 stem and no max-pool, every ``Conv2d``, ``BatchNorm2d`` and
average pool turned into its 3-D counterpart (ACSConv's ``Conv3dConverter``: a k x k kernel
becomes k x k x k), at 28 and at 64 voxels alike. This is not torchvision's video
``r3d_18`` (a 3x7x7 stem, stride 1x2x2, and a max-pool).

``norm``: ``batch`` (BatchNorm, the benchmark's choice) or ``group`` (GroupNorm with
``groups`` groups: no running statistics, so per-client models are pure functions of
their weights — the batched-client backend's choice).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import Tensor, nn

from models.registry import register_model, register_volume_model

__all__ = ["ResNet"]


def _norm_factory(norm: str, groups: int, dims: int = 2) -> Callable[[int], nn.Module]:
    if norm == "batch":
        return nn.BatchNorm3d if dims == 3 else nn.BatchNorm2d
    if norm == "group":
        return lambda channels: nn.GroupNorm(min(groups, channels), channels)
    raise ValueError(f"norm must be 'batch' or 'group', got {norm!r}")


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(
        self,
        in_planes: int,
        planes: int,
        stride: int,
        norm: Callable[[int], nn.Module],
        conv: type[nn.Conv2d] | type[nn.Conv3d] = nn.Conv2d,
    ) -> None:
        super().__init__()
        self.conv1 = conv(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = conv(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = norm(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(in_planes, planes * self.expansion, stride, norm, conv)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(
        self,
        in_planes: int,
        planes: int,
        stride: int,
        norm: Callable[[int], nn.Module],
        conv: type[nn.Conv2d] | type[nn.Conv3d] = nn.Conv2d,
    ) -> None:
        super().__init__()
        self.conv1 = conv(in_planes, planes, 1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = conv(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = norm(planes)
        self.conv3 = conv(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = norm(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _shortcut(in_planes, planes * self.expansion, stride, norm, conv)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


def _shortcut(
    in_planes: int,
    out_planes: int,
    stride: int,
    norm: Callable[[int], nn.Module],
    conv: type[nn.Conv2d] | type[nn.Conv3d],
) -> nn.Module:
    if stride == 1 and in_planes == out_planes:
        return nn.Identity()
    return nn.Sequential(
        conv(in_planes, out_planes, 1, stride=stride, bias=False), norm(out_planes)
    )


class ResNet(nn.Module):
    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        blocks_per_stage: tuple[int, int, int, int],
        *,
        in_channels: int,
        num_classes: int,
        norm: str = "batch",
        groups: int = 32,
        image_size: int = 28,
        dims: int = 2,
    ) -> None:
        super().__init__()
        if in_channels < 1 or num_classes < 1 or image_size < 1:
            raise ValueError("in_channels, num_classes and image_size must be >= 1")
        if dims not in (2, 3):
            raise ValueError(f"dims must be 2 (images) or 3 (volumes), got {dims}")
        make_norm = _norm_factory(norm, groups, dims)
        conv = nn.Conv3d if dims == 3 else nn.Conv2d
        # volumes: MedMNIST3D's stride-1 stem at every size
        self.stem = _stem(in_channels, make_norm, conv, standard=dims == 2 and image_size >= 64)
        stages: list[nn.Module] = []
        in_planes = 64
        for index, (planes, count) in enumerate(
            zip((64, 128, 256, 512), blocks_per_stage, strict=True)
        ):
            layers: list[nn.Module] = []
            for block_index in range(count):
                stride = 2 if index > 0 and block_index == 0 else 1
                layers.append(block(in_planes, planes, stride, make_norm, conv))
                in_planes = planes * block.expansion
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)  # (B, 512*expansion, 4, 4) at 28 and 128 px
        self.pool = nn.AdaptiveAvgPool3d(1) if dims == 3 else nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, size, size[, size]) -> (B, num_classes)
        out = self.stages(self.stem(x))
        return self.fc(self.pool(out).flatten(1))


def _stem(
    in_channels: int,
    make_norm: Callable[[int], nn.Module],
    conv: type[nn.Conv2d] | type[nn.Conv3d],
    *,
    standard: bool,
) -> nn.Module:
    """The 3x3 stride-1 MedMNIST stem, or the standard 7x7 stride-2 stem with max-pool."""
    if not standard:
        return nn.Sequential(
            conv(in_channels, 64, 3, stride=1, padding=1, bias=False),
            make_norm(64),
            nn.ReLU(inplace=True),
        )
    return nn.Sequential(
        nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False),
        make_norm(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    )


def _resnet(
    block: type[BasicBlock] | type[Bottleneck],
    layers: tuple[int, int, int, int],
    dims: int,
    *,
    in_channels: int,
    num_classes: int,
    norm: str = "batch",
    groups: int = 32,
    image_size: int = 28,
) -> ResNet:
    return ResNet(
        block,
        layers,
        in_channels=in_channels,
        num_classes=num_classes,
        norm=norm,
        groups=groups,
        image_size=image_size,
        dims=dims,
    )


# the three depths differ only in their block and how many of them each stage stacks
DEPTHS: dict[str, tuple[type[BasicBlock] | type[Bottleneck], tuple[int, int, int, int]]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet34": (BasicBlock, (3, 4, 6, 3)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
}
for _name, (_block, _layers) in DEPTHS.items():
    register_model(_name)(partial(_resnet, _block, _layers, 2))
for _name in ("resnet18", "resnet50"):  # MedMNIST v2's two 3-D baselines
    register_volume_model(f"{_name}_3d")(partial(_resnet, *DEPTHS[_name], 3))
