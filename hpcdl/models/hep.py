"""Jet taggers for high-energy physics: a jet-image CNN and a particle-cloud transformer.

Both separate hadronically decaying W-boson jets (signal) from QCD jets and output
logits (N, 2).

* :class:`JetImageCNN` reads calorimeter-like images (eta x phi, pT-weighted), in the
  style of the HEP-CNN benchmark (Kurth et al., "Deep learning at 15PF", SC'17):
  stacked 3x3 convolutions with 2x2 max-pooling, then a fully connected layer. Unlike
  the benchmark it normalises each convolution with BatchNorm, which lets it train at
  large batch without a warm-up.
* :class:`ParticleTransformer` reads the jet's constituents as a set (N, particles,
  features), in the style of ParT (Qu et al., ICML'22): a per-particle embedding, self-
  attention blocks that ignore padding, and class-attention blocks that pool the set
  into a class token. It omits ParT's pairwise-interaction attention bias.
"""

from __future__ import annotations

import torch
from torch import nn

from hpcdl.models.transformer import ClassAttentionBlock, TransformerBlock


class JetImageCNN(nn.Module):
    """Conv(3x3)-BN-ReLU-MaxPool(2) stages, flatten, one hidden layer, logits (N, classes).

    The head flattens instead of pooling globally because a preprocessed jet image is
    centred and rotated, so where energy lies carries the physics (prong separation).
    """

    def __init__(
        self,
        in_channels: int = 1,
        image_size: int | tuple[int, int] = 40,
        num_classes: int = 2,
        channels: tuple[int, ...] = (32, 64, 128),
        hidden: int = 128,
    ):
        super().__init__()
        height, width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if not channels:
            raise ValueError("channels must name at least one convolution stage, e.g. (32, 64, 128)")
        if min(height, width) < 2 ** len(channels):
            raise ValueError(
                f"a {height}x{width} image is too small for {len(channels)} pooling stages; "
                f"use at most {max(1, min(height, width).bit_length() - 1)} stages or a larger image"
            )
        stages, previous = [], in_channels
        for width_out in channels:
            stages.append(
                nn.Sequential(
                    nn.Conv2d(previous, width_out, 3, padding=1, bias=False),
                    nn.BatchNorm2d(width_out),
                    nn.ReLU(inplace=True),
                    nn.MaxPool2d(2),
                )
            )
            previous = width_out
            height, width = height // 2, width // 2
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(previous * height * width, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, num_classes)
        )

    def checkpoint_blocks(self) -> list[nn.Module]:
        return [*self.stages, self.head]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(x))


class ParticleTransformer(nn.Module):
    """Transformer over a zero-padded particle set (N, particles, features) -> logits (N, classes).

    Padding is recognised as all-zero feature rows (a real particle always has a
    non-zero pT), so the model is called as ``model(x)`` like every other model. Padded
    particles are masked out of every attention; the output does not depend on how much
    padding there is or on the order of the particles. Features should arrive on a
    unit scale; hpcdl.data gives (delta eta, delta phi, log pT, log E, mask) per
    particle, normalised over real particles only, so padding rows stay exactly zero.
    """

    def __init__(
        self,
        num_features: int = 5,
        num_classes: int = 2,
        dim: int = 128,
        heads: int = 8,
        depth: int = 8,
        class_depth: int = 2,
        mlp_ratio: float = 4.0,
    ):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(num_features, dim), nn.GELU(), nn.Linear(dim, dim))
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, mlp_ratio) for _ in range(depth))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.normal_(self.cls_token, std=0.02)
        self.class_blocks = nn.ModuleList(ClassAttentionBlock(dim, heads, mlp_ratio) for _ in range(class_depth))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes))

    @staticmethod
    def particle_mask(x: torch.Tensor) -> torch.Tensor:
        """(N, particles) bool, True for real particles (rows with any non-zero feature).

        A jet with no particles keeps its first (zero) row, so attention always has a
        key and never produces NaN.
        """
        mask = (x != 0).any(dim=-1)
        mask[:, 0] |= ~mask.any(dim=1)
        return mask

    def checkpoint_blocks(self) -> list[nn.Module]:
        return [self.embed, *self.blocks, *self.class_blocks, self.head]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError(f"ParticleTransformer takes (N, particles, features), got shape {tuple(x.shape)}")
        mask = self.particle_mask(x)
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, mask)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        for block in self.class_blocks:
            cls = block(cls, h, mask)
        return self.head(cls[:, 0])
