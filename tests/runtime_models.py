"""Small models and picklable factories for the runtime and memory tests.

They live here (not in the model zoo) so the tests pin exactly the layers the
runtime must handle; hpcdl.memory's subprocesses import this module by name,
with tests/ on their path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ResidualCNN(nn.Module):
    """Conv, batch norm, in-place and out-of-place ReLU, max/avg pool, dropout, a residual add, a transposed conv."""

    def __init__(self, channels: int = 8, classes: int = 5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(inplace=True))
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.drop = nn.Dropout(0.3)
        self.up = nn.ConvTranspose2d(channels, channels, 2, stride=2)
        self.avg = nn.AdaptiveAvgPool2d(2)
        self.head = nn.Linear(channels * 4, classes)

    def forward(self, x):
        x = self.stem(x)
        y = F.relu(self.bn1(self.conv1(x)))
        x = x + self.conv2(y)
        x = self.drop(self.pool(x))
        x = torch.relu(self.up(x))
        return self.head(self.avg(x).flatten(1))


class TransformerBlock(nn.Module):
    """Embedding, LayerNorm, Linear, GELU, dropout, and two causal attentions: masked softmax and scaled_dot_product."""

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.2)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * dim, dim))
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
        causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).triu(1)
        weights = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        explicit = self.drop(weights) @ v
        fused = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
        x = x + self.proj((explicit + fused).transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.norm2(x))
        return self.out(x)


class Recurrent(nn.Module):
    """A two-layer LSTM with a linear head."""

    def __init__(self, features: int = 6, hidden: int = 16, classes: int = 3):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class WideCNN(nn.Module):
    """Activations dominate: full-resolution 3x3 convs with few channels, so parameters are tiny."""

    def __init__(self, channels: int = 16, depth: int = 12, classes: int = 4):
        super().__init__()
        layers = [nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
        for _ in range(depth - 1):
            layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def wide_cnn(**options) -> nn.Module:
    return WideCNN(**options)


def wide_cnn_batch(batch_size: int, generator: torch.Generator, size: int = 64):
    """Smooth random images (activations of real images compress; white noise would not) and labels."""
    coarse = torch.randn(batch_size, 3, size // 8, size // 8, generator=generator)
    x = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    return x, torch.randint(0, 4, (batch_size,), generator=generator)


def allocating_setup(mebibytes: int):
    """A setup for hpcdl.memory.peak whose step allocates ``mebibytes`` MiB, touches it, and frees it."""

    def step() -> dict:
        block = torch.ones(mebibytes * 2**18)  # float32: 4 bytes each
        return {"sum": float(block.sum())}

    return step


class SaveForBackward(torch.autograd.Function):
    """Saves its second argument for backward as it is: the pack hook sees exactly that tensor or view."""

    @staticmethod
    def forward(ctx, x, saved):
        ctx.save_for_backward(saved)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None
