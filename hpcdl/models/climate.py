"""DeepCAM-style DeepLabv3+ for per-pixel segmentation of extreme weather in climate fields.

DeepCAM (Kurth et al., SC'18; MLPerf HPC) segments 16-channel CAM5 snapshots of
768 x 1152 pixels into background, tropical cyclone and atmospheric river with a
DeepLabv3+ network (Chen et al., ECCV'18). This is that architecture with a ResNet
backbone: atrous (dilated) residual stages keep the feature map at 1/``output_stride``
of the input, atrous spatial pyramid pooling (ASPP) looks at several context sizes at
once, and a light decoder fuses the upsampled result with stage-1 features to recover
sharp boundaries. Output: logits (N, classes, H, W) at the input resolution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hpcdl.models.resnet import ResNetBackbone


def _conv_bn_relu(in_channels: int, out_channels: int, kernel: int = 1, dilation: int = 1) -> nn.Sequential:
    padding = dilation * (kernel // 2)
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel, padding=padding, dilation=dilation, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling: a 1x1 branch, one 3x3 branch per rate, and image-level pooling."""

    def __init__(self, in_channels: int, channels: int, rates: tuple[int, ...]):
        super().__init__()
        self.branches = nn.ModuleList(
            [_conv_bn_relu(in_channels, channels)] + [_conv_bn_relu(in_channels, channels, 3, r) for r in rates]
        )
        # No BatchNorm on the pooled branch: it sees one value per channel and sample, so it
        # would fail at a per-device batch of 1, which DeepCAM-sized inputs often need.
        self.image_pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(in_channels, channels, 1), nn.ReLU(inplace=True))
        self.project = _conv_bn_relu(channels * (len(rates) + 2), channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.image_pool(x).expand(-1, -1, *x.shape[-2:])
        return self.project(torch.cat([branch(x) for branch in self.branches] + [pooled], dim=1))


class Decoder(nn.Module):
    """Upsample ASPP features to the stage-1 resolution, fuse with reduced stage-1 features, classify, upsample."""

    def __init__(self, low_level_in: int, low_level_channels: int, aspp_channels: int, channels: int, num_classes: int):
        super().__init__()
        self.reduce = _conv_bn_relu(low_level_in, low_level_channels)
        self.fuse = nn.Sequential(
            _conv_bn_relu(aspp_channels + low_level_channels, channels, 3),
            _conv_bn_relu(channels, channels, 3),
        )
        self.classify = nn.Conv2d(channels, num_classes, 1)

    def forward(self, high: torch.Tensor, reduced_low: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """``reduced_low``: the stage-1 features after :attr:`reduce` (the model applies it as they appear)."""
        x = torch.cat([F.interpolate(high, size=reduced_low.shape[-2:], mode="bilinear", align_corners=False),
                       reduced_low], dim=1)
        # Layer by layer with x rebound, so no full-resolution input outlives its consumer (see
        # ResNetBackbone.forward): the widest tensors of the model are here.
        for layer in [*(module for block in self.fuse for module in block.children()), self.classify]:
            x = layer(x)
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class DeepLabV3Plus(nn.Module):
    """DeepLabv3+ with a (dilated) ResNet backbone.

    ``in_channels`` must match the data's channel count (16 for DeepCAM's CAM5 variables);
    ``output_stride`` 16 or 8 sets how much of the resolution the backbone keeps, and the
    ASPP ``rates`` should scale with it (DeepLab uses 6, 12, 18 at stride 16).
    """

    def __init__(
        self,
        in_channels: int = 16,
        num_classes: int = 3,
        block: str = "bottleneck",
        layers: tuple[int, int, int, int] = (3, 4, 6, 3),
        width: int = 64,
        output_stride: int = 16,
        aspp_channels: int = 256,
        aspp_rates: tuple[int, ...] = (6, 12, 18),
        low_level_channels: int = 48,
        decoder_channels: int = 256,
    ):
        super().__init__()
        self.backbone = ResNetBackbone(block, layers, in_channels, width, "imagenet", output_stride)
        self.aspp = ASPP(self.backbone.out_channels, aspp_channels, tuple(aspp_rates))
        self.decoder = Decoder(
            self.backbone.low_level_channels, low_level_channels, aspp_channels, decoder_channels, num_classes
        )

    def checkpoint_blocks(self) -> list[nn.Module]:
        """Backbone stem and residual blocks, then ASPP and the decoder."""
        return [*self.backbone.checkpoint_blocks(), self.aspp, self.decoder]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        reduced_low, high = self.backbone(x, low_level=self.decoder.reduce)
        return self.decoder(self.aspp(high), reduced_low, x.shape[-2:])
