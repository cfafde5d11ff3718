"""Residual networks (He et al. 2016) with an ImageNet or a CIFAR stem and optional atrous stages.

One implementation serves both the classifiers in :mod:`hpcdl.models.vision` and the
DeepLabv3+ backbone in :mod:`hpcdl.models.climate`. Layer layout, strides (on the 3x3
convolution, "ResNet v1.5") and initialisation follow torchvision, so the parameter
counts at ``width=64`` match the published ResNet-18 (11.7 M) and ResNet-50 (25.6 M).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def conv3x3(in_channels: int, out_channels: int, stride: int = 1, dilation: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=dilation, dilation=dilation, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, in_channels: int, channels: int, stride: int = 1, dilation: int = 1):
        super().__init__()
        self.conv1 = conv3x3(in_channels, channels, stride, dilation)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = conv3x3(channels, channels, dilation=dilation)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(in_channels, channels * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided/dilated), 1x1 expand by 4, with a residual connection (ResNet-50+)."""

    expansion = 4

    def __init__(self, in_channels: int, channels: int, stride: int = 1, dilation: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = conv3x3(channels, channels, stride, dilation)
        self.bn2 = nn.BatchNorm2d(channels)
        self.conv3 = nn.Conv2d(channels, channels * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(channels * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(in_channels, channels * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


def _shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Module | None:
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels))


BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}
STEMS = ("imagenet", "cifar")


class ResNetBackbone(nn.Module):
    """Stem and four residual stages; ``forward`` returns (stage-1 features, stage-4 features).

    ``output_stride`` (32, 16 or 8) is the input-to-output downsampling: below 32 the
    last stages keep their resolution and dilate their 3x3 convolutions instead of
    striding (atrous convolution, as DeepLab does), so the receptive field still grows.
    The ``cifar`` stem is one 3x3 convolution without pooling (for 32x32 inputs); the
    ``imagenet`` stem is a strided 7x7 convolution and a max-pool (a factor 4).
    """

    def __init__(
        self,
        block: str = "bottleneck",
        layers: tuple[int, int, int, int] = (3, 4, 6, 3),
        in_channels: int = 3,
        width: int = 64,
        stem: str = "imagenet",
        output_stride: int = 32,
    ):
        super().__init__()
        if block not in BLOCKS:
            raise ValueError(f"unknown residual block {block!r}; choose one of {', '.join(BLOCKS)}")
        if stem not in STEMS:
            raise ValueError(f"unknown stem {stem!r}; choose one of {', '.join(STEMS)}")
        if len(layers) != 4 or min(layers) < 1:
            raise ValueError(f"layers must be four positive block counts, got {layers!r}")
        block_class = BLOCKS[block]
        stem_stride = 4 if stem == "imagenet" else 1
        if output_stride % stem_stride or output_stride // stem_stride not in (2, 4, 8):
            raise ValueError(
                f"output_stride {output_stride} is not reachable with the {stem} stem; "
                f"choose one of {', '.join(str(stem_stride * s) for s in (2, 4, 8))}"
            )
        if stem == "imagenet":
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, stride=2, padding=1),
            )
        else:
            self.stem = nn.Sequential(conv3x3(in_channels, width), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        # Stages 2-4 each halve the resolution unless the output stride is already reached.
        stride_left = output_stride // stem_stride
        self._in_channels = width
        dilation = 1
        stages = []
        for index, count in enumerate(layers):
            stride = 1
            if index > 0:
                if stride_left > 1:
                    stride, stride_left = 2, stride_left // 2
                else:
                    dilation *= 2
            stages.append(self._stage(block_class, width * 2**index, count, stride, dilation))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.out_channels = self._in_channels
        self.low_level_channels = width * block_class.expansion
        _init_weights(self)

    def _stage(self, block_class, channels: int, count: int, stride: int, dilation: int) -> nn.Sequential:
        # The first block of a dilated stage keeps the previous dilation (as in torchvision / DeepLab).
        first_dilation = max(1, dilation // 2) if stride == 1 and dilation > 1 else dilation
        blocks = [block_class(self._in_channels, channels, stride, first_dilation)]
        self._in_channels = channels * block_class.expansion
        blocks += [block_class(self._in_channels, channels, 1, dilation) for _ in range(count - 1)]
        return nn.Sequential(*blocks)

    def checkpoint_blocks(self) -> list[nn.Module]:
        """The stem and every residual block, in execution order."""
        return [self.stem, *self.layer1, *self.layer2, *self.layer3, *self.layer4]

    def forward(
        self, x: torch.Tensor, low_level: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(stage-1 features, stage-4 features); ``low_level`` (if given) maps the stage-1 features first.

        The blocks run one by one with ``x`` rebound, so each block's input is dropped once the next block
        has it: under a compressing session autograd's copy is packed, and a Python reference held over
        several blocks (a Sequential's argument, a skip connection in a local) would keep the original
        alive beside it. ``low_level`` lets a decoder shrink the stage-1 features (DeepLabv3+'s 1x1
        reduction) before the deeper stages run, instead of holding them at full width meanwhile.
        """
        x = self.stem(x)
        for block in self.layer1:
            x = block(x)
        low = x if low_level is None else low_level(x)
        for block in (*self.layer2, *self.layer3, *self.layer4):
            x = block(x)
        return low, x


class ResNet(nn.Module):
    """A ResNet classifier: backbone, global average pooling, one linear layer -> logits (N, classes)."""

    def __init__(
        self,
        block: str = "bottleneck",
        layers: tuple[int, int, int, int] = (3, 4, 6, 3),
        num_classes: int = 1000,
        in_channels: int = 3,
        width: int = 64,
        stem: str = "imagenet",
    ):
        super().__init__()
        self.backbone = ResNetBackbone(block, layers, in_channels, width, stem, output_stride=32 if stem == "imagenet" else 8)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(self.backbone.out_channels, num_classes))

    def checkpoint_blocks(self) -> list[nn.Module]:
        return [*self.backbone.checkpoint_blocks(), self.head]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x)[1])


def _init_weights(module: nn.Module) -> None:
    """He-normal convolutions, unit BatchNorm, and zero last-BN gamma in each residual branch.

    The zero gamma makes every residual block start as the identity, which lets deep
    ResNets train from the first step at large batch (Goyal et al. 2017).
    """
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    for m in module.modules():
        if isinstance(m, Bottleneck):
            nn.init.zeros_(m.bn3.weight)
        elif isinstance(m, BasicBlock):
            nn.init.zeros_(m.bn2.weight)
