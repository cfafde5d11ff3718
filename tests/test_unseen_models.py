"""Architectures outside the zoo, built from torch alone as a user would bring them: the default policy keeps the
gradient cosine >= 0.99 and the adaptive policy trains them without an error or a non-finite gradient.

The 3-D CNN's ``amax`` head had NaN gradients under the default policy until equality ops kept their saves exact
(hpcdl/runtime/exact_saves.py); the others are here so that the next such fault shows on a model nobody tuned for.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hpcdl.bench.gradients import COSINE_FLOOR, measure_policies
from hpcdl.runtime.policy import DEFAULT_POLICY_SPEC

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.one_thread


class GRUTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru, self.head = nn.GRU(16, 64, 2, batch_first=True), nn.Linear(64, 2)

    def forward(self, x):
        return self.head(self.gru(x)[0][:, -1])


class BiLSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.LSTM(16, 48, batch_first=True, bidirectional=True), nn.Linear(96, 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0].mean(1))


class MobileSE(nn.Module):
    """Depthwise-separable convolutions, hard-swish, squeeze-and-excitation."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.Hardswish(inplace=True))
        self.dw = nn.Sequential(nn.Conv2d(32, 32, 3, 1, 1, groups=32, bias=False), nn.BatchNorm2d(32),
                                nn.ReLU6(inplace=True))
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(32, 8, 1), nn.ReLU(), nn.Conv2d(8, 32, 1),
                                nn.Hardsigmoid())
        self.pw, self.head = nn.Sequential(nn.Conv2d(32, 64, 1, bias=False), nn.BatchNorm2d(64)), nn.Linear(64, 10)

    def forward(self, x):
        x = self.dw(self.stem(x))
        x = self.pw(x * self.se(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class UNet1d(nn.Module):
    """Group norm, SiLU, a transposed convolution and a skip concatenation."""

    def __init__(self):
        super().__init__()
        self.down = nn.Sequential(nn.Conv1d(4, 32, 5, padding=2), nn.GroupNorm(8, 32), nn.SiLU())
        self.mid = nn.Sequential(nn.Conv1d(32, 64, 3, stride=2, padding=1), nn.GroupNorm(8, 64), nn.SiLU())
        self.up, self.out = nn.ConvTranspose1d(64, 32, 4, stride=2, padding=1), nn.Conv1d(64, 3, 1)

    def forward(self, x):
        skip = self.down(x)
        return self.out(torch.cat([skip, self.up(self.mid(skip))], 1))


class PaddedEncoder(nn.Module):
    """Pre-norm transformer layers with a key padding mask and a masked mean."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 64)
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.layers, self.head = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Linear(64, 5)

    def forward(self, tokens):
        pad = tokens == 0
        h = self.layers(self.embed(tokens), src_key_padding_mask=pad)
        return self.head(h.masked_fill(pad.unsqueeze(-1), 0).sum(1) / (~pad).sum(1, keepdim=True))


class Conv3dAmax(nn.Module):
    """3-D convolutions, instance norm, max pooling and a global max (``amax``) head."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv3d(2, 16, 3, padding=1), nn.InstanceNorm3d(16, affine=True),
                                  nn.LeakyReLU(0.1), nn.MaxPool3d(2), nn.Conv3d(16, 32, 3, padding=1), nn.ELU())
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.body(x).amax((2, 3, 4)))


class AttentionWeights(nn.Module):
    """``nn.MultiheadAttention`` asked for its weights, then a residual layer norm."""

    def __init__(self):
        super().__init__()
        self.proj, self.attention = nn.Linear(8, 32), nn.MultiheadAttention(32, 4, batch_first=True)
        self.norm, self.head = nn.LayerNorm(32), nn.Linear(32, 2)

    def forward(self, x):
        h = self.proj(x)
        attended, weights = self.attention(h, h, h, need_weights=True)
        return self.head(self.norm(h + attended).mean(1)) + 0.0 * weights.sum()


class SharedBlock(nn.Module):
    """One block called twice, pixel shuffle, bilinear resampling, a dict output."""

    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.Softplus())
        self.inp, self.up, self.out = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 64, 1), nn.Conv2d(16, 2, 1)

    def forward(self, x):
        h = self.inp(x)
        h = self.block(h + self.block(h))
        h = F.interpolate(F.pixel_shuffle(self.up(h), 2), scale_factor=0.5, mode="bilinear", align_corners=False)
        return {"segmentation": self.out(h)}


def _cases():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 100, (16, 30), generator=g)
    tokens[torch.rand(16, 30, generator=g) < 0.2] = 0
    tokens[:, 0] = 1  # every sequence has a token
    labels = torch.arange(64)
    pixels = torch.arange(8 * 32 * 32).view(8, 32, 32) % 2
    return {
        "gru-tagger": (GRUTagger, torch.randn(32, 50, 16, generator=g), labels[:32] % 2),
        "bilstm": (BiLSTM, torch.randn(16, 40, 16, generator=g), labels[:16] % 2),
        "mobile-se": (MobileSE, torch.randn(16, 3, 48, 48, generator=g), labels[:16] % 10),
        "unet1d-groupnorm": (UNet1d, torch.randn(8, 4, 256, generator=g), None),
        "transformer-padding-mask": (PaddedEncoder, tokens, labels[:16] % 5),
        "conv3d-amax": (Conv3dAmax, torch.randn(4, 2, 16, 16, 16, generator=g), labels[:4] % 3),
        "attention-weights": (AttentionWeights, torch.randn(16, 20, 8, generator=g), labels[:16] % 2),
        "shared-block-dict": (SharedBlock, torch.randn(8, 3, 32, 32, generator=g), pixels),
    }


CASES = _cases()


def _loss(target):
    def loss_fn(out):
        out = out["segmentation"] if isinstance(out, dict) else out
        return out.square().mean() if target is None else F.cross_entropy(out, target)
    return loss_fn


@pytest.mark.parametrize("name", list(CASES))
def test_an_unseen_model_keeps_its_gradient(name):
    build, x, target = CASES[name]
    torch.manual_seed(0)
    _, (default, adaptive) = measure_policies(build(), x, _loss(target), [DEFAULT_POLICY_SPEC, "adaptive"])
    assert default.error is None and default.cosine >= COSINE_FLOOR and default.ratio > 1, default
    assert adaptive.error is None and math.isfinite(adaptive.cosine) and adaptive.cosine >= 0.95, adaptive
