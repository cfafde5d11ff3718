"""Small models, picklable factories and a failing codec for the runtime and memory tests.

They live here (not in the model zoo) so the tests pin exactly the layers the
runtime must handle; hpcdl.memory's subprocesses import this module by name,
with tests/ on their path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import hpcdl
from hpcdl.compress import Codec, register_codec
from hpcdl.compress.cast import Cast


@register_codec
class ExplodingCodec(Codec):
    """``{"id": "test-exploding"}``: raises on every encode, so the runtime's fallback path runs."""

    codec_id = "test-exploding"
    modes = ("lossless",)
    dtypes = frozenset({torch.float32})
    lossless = True

    def get_config(self):
        return {"id": self.codec_id}

    def _encode(self, tensor):
        raise RuntimeError("boom")

    def _decode(self, packed):
        raise AssertionError("never packed")


@register_codec
class LyingCodec(Cast):
    """``{"id": "test-lying"}``: claims an abs bound, then adds far more error than it allows (stored as fp16, so
    it packs and can join an arena): verify mode must catch it."""

    codec_id = "test-lying"
    modes = ("abs",)
    dtypes = frozenset({torch.float32})
    error_bounded = True

    def __init__(self, mode="abs", bound=1e-3):
        super().__init__("fp16", mode)
        self.mode, self.bound = mode, bound

    def get_config(self):
        return {"id": self.codec_id, "mode": self.mode, "bound": self.bound}

    def _encode(self, tensor):
        return super()._encode(tensor + 1.0)

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


def wide_cnn_step(model: nn.Module, policy, seed: int = 0):
    """One compressed forward/backward of a WideCNN on a fixed batch of 8 (``seed`` picks it), feeding the
    policy its gradients as train_step does; the session's statistics."""
    x, y = wide_cnn_batch(8, torch.Generator().manual_seed(seed), size=32)
    model.zero_grad(set_to_none=True)
    with hpcdl.compressed(model, policy) as session:
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    if policy.wants_gradients():
        policy.record_gradients(model)
    return session.stats


class RecurrentTagger(nn.Module):
    """Tags every token: embedding, a 2-layer GRU (or LSTM), a linear head per step; logits (batch, tags, steps).

    On the CPU a GRU's recurrence saves its gates and hidden states step by step: over 50 steps ~800 tensors
    of batch x hidden floats (16 KiB at 32 x 128), each under the session's 64 KiB threshold.
    """

    def __init__(self, cell: str = "gru", vocab: int = 1000, embedding: int = 64, hidden: int = 128, tags: int = 10):
        super().__init__()
        self.embed = nn.Embedding(vocab, embedding)
        self.rnn = {"gru": nn.GRU, "lstm": nn.LSTM}[cell](embedding, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, tags)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out).transpose(1, 2)


class LSTMCellTagger(nn.Module):
    """The same tagger written as a loop over two ``LSTMCell`` s, as per-token models are: small saves every step."""

    def __init__(self, vocab: int = 1000, embedding: int = 64, hidden: int = 128, tags: int = 10):
        super().__init__()
        self.embed = nn.Embedding(vocab, embedding)
        self.cells = nn.ModuleList([nn.LSTMCell(embedding, hidden), nn.LSTMCell(hidden, hidden)])
        self.head = nn.Linear(hidden, tags)

    def forward(self, tokens):
        x = self.embed(tokens)
        states: list = [None, None]
        outputs = []
        for step in range(x.shape[1]):
            h = x[:, step]
            for i, cell in enumerate(self.cells):
                states[i] = cell(h, states[i])
                h = states[i][0]
            outputs.append(self.head(h))
        return torch.stack(outputs, dim=2)


def recurrent_tagger(**options) -> nn.Module:
    return RecurrentTagger(**options)


def tagger_batch(batch_size: int, generator: torch.Generator, steps: int = 50, vocab: int = 1000, tags: int = 10):
    """Random token ids and per-token tags."""
    tokens = torch.randint(0, vocab, (batch_size, steps), generator=generator)
    return tokens, torch.randint(0, tags, (batch_size, steps), generator=generator)


def allocating_setup(mebibytes: int):
    """A setup for hpcdl.memory.peak whose step allocates ``mebibytes`` MiB, touches it, and frees it."""

    def step() -> dict:
        block = torch.ones(mebibytes * 2**18)  # float32: 4 bytes each
        return {"sum": float(block.sum())}

    return step


def killed_setup():
    """A setup for hpcdl.memory.peak whose process is killed with SIGKILL, as the out-of-memory killer does."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


class TwoArgumentError(Exception):
    """An exception pickle cannot rebuild: its ``__init__`` takes two arguments, its ``args`` hold one message."""

    def __init__(self, what, why):
        super().__init__(f"{what}: {why}")


def failing_setup(kind):
    """A setup for hpcdl.memory.peak that raises in its measuring process: an hpcdl error (``"hpcdl"``) or an
    exception pickle cannot rebuild (``"unpicklable"``)."""
    from hpcdl.train.config import ConfigError

    if kind == "hpcdl":
        raise ConfigError("model.depth must be >= 1, got 0")
    raise TwoArgumentError("the step", "failed")


def learning_then_usual_setup():
    """A setup for hpcdl.memory.peak whose step allocates 64 MiB and says it observed gradients (as a probe
    step does) for its first three calls (the warm-up and two measured steps), then allocates 8 MiB."""
    calls = []

    def step() -> dict:
        calls.append(1)
        learning = len(calls) <= 3
        block = torch.ones((64 if learning else 8) * 2**18)
        return {"observed_gradients": learning, "sum": float(block.sum())}

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
