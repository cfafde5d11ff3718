"""Image classifiers used to compare with published activation-compression results.

AlexNet, VGG-16 with BatchNorm, ResNet-18/50 (:mod:`hpcdl.models.resnet`) and a Vision
Transformer. At their ``full`` configurations the layer shapes and parameter counts
are those of the torchvision / original models (AlexNet 61.1 M, VGG-16-BN 138.4 M,
ViT-B/16 86.6 M parameters); ``width`` shrinks every layer proportionally for
CPU-sized variants. No pretrained weights are provided or downloaded.
"""

from __future__ import annotations

import torch
from torch import nn

from hpcdl.models.resnet import ResNet
from hpcdl.models.transformer import TransformerBlock

__all__ = ["AlexNet", "VGG16BN", "ResNet", "VisionTransformer"]


def _scaled(channels: int, width: int) -> int:
    return max(1, channels * width // 64)


class AlexNet(nn.Module):
    """AlexNet as in torchvision (the one-GPU variant of Krizhevsky et al. 2012); ``width=64`` is the original."""

    def __init__(
        self, num_classes: int = 1000, width: int = 64, hidden: int = 4096, pool_size: int = 6, dropout: float = 0.5
    ):
        super().__init__()
        c1, c2, c3, c4 = (_scaled(c, width) for c in (64, 192, 384, 256))
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, c1, 11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2)),
            nn.Sequential(nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2)),
            nn.Sequential(
                nn.Conv2d(c2, c3, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(c3, c4, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(c4, c4, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2),
            ),
        )
        self.classifier = nn.Sequential(
            nn.AdaptiveAvgPool2d(pool_size),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(c4 * pool_size * pool_size, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def checkpoint_blocks(self) -> list[nn.Module]:
        return [*self.features, self.classifier]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


VGG16_STAGES = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


class VGG16BN(nn.Module):
    """VGG-16 with BatchNorm after every convolution (configuration D of Simonyan & Zisserman 2015)."""

    def __init__(
        self, num_classes: int = 1000, width: int = 64, hidden: int = 4096, pool_size: int = 7, dropout: float = 0.5
    ):
        super().__init__()
        stages, previous = [], 3
        for stage in VGG16_STAGES:
            layers = []
            for channels in stage:
                channels = _scaled(channels, width)
                layers += [nn.Conv2d(previous, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
                previous = channels
            stages.append(nn.Sequential(*layers, nn.MaxPool2d(2)))
        self.features = nn.Sequential(*stages)
        self.classifier = nn.Sequential(
            nn.AdaptiveAvgPool2d(pool_size),
            nn.Flatten(),
            nn.Linear(previous * pool_size * pool_size, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )

    def checkpoint_blocks(self) -> list[nn.Module]:
        return [*self.features, self.classifier]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class VisionTransformer(nn.Module):
    """ViT (Dosovitskiy et al. 2021): patches -> linear embedding + class token + learned positions -> encoder.

    ``image_size=224, patch_size=16, dim=768, depth=12, heads=12`` is ViT-B/16.
    """

    def __init__(
        self,
        image_size: int = 224,
        patch_size: int = 16,
        num_classes: int = 1000,
        in_channels: int = 3,
        dim: int = 768,
        depth: int = 12,
        heads: int = 12,
        mlp_ratio: float = 4.0,
    ):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
        self.image_size = image_size
        self.patch_embed = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + (image_size // patch_size) ** 2, dim))
        nn.init.normal_(self.pos_embed, std=0.02)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, mlp_ratio, eps=1e-6) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, num_classes))

    def checkpoint_blocks(self) -> list[nn.Module]:
        return [self.patch_embed, *self.blocks, self.head]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(
                f"this ViT was built for {self.image_size}x{self.image_size} images, got {tuple(x.shape[-2:])}"
            )
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), tokens], dim=1) + self.pos_embed
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(tokens[:, 0])
