"""Pre-norm transformer blocks on ``F.scaled_dot_product_attention``, shared by ViT, GPT and the particle transformer.

Attention goes through PyTorch's fused ``scaled_dot_product_attention`` so that on a
GPU the flash / memory-efficient kernels are used; which tensors autograd saves then
depends on the kernel PyTorch picks, which is what the activation-compression runtime
sees in practice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    """Multi-head attention of a sequence (N, L, dim) over itself, or of queries over a separate key sequence."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        if dim % heads:
            raise ValueError(f"attention width {dim} is not divisible by {heads} heads; pick heads dividing dim")
        self.heads = heads
        self.dropout = dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        n, length, dim = x.shape
        return x.view(n, length, self.heads, dim // self.heads).transpose(1, 2)

    def forward(
        self, x: torch.Tensor, key_mask: torch.Tensor | None = None, causal: bool = False, queries: int | None = None
    ) -> torch.Tensor:
        """Attend over ``x``.

        ``key_mask`` (N, L) bool: True where a position may be attended to (padding is
        False). ``causal``: position i sees only positions <= i. ``queries``: only the
        first that many positions produce outputs (class attention uses 1).
        """
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if queries is not None:
            q = q[:, :queries]
        q, k, v = self._split(q), self._split(k), self._split(v)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=causal
        )
        return self.proj(out.transpose(1, 2).flatten(2))


class MLP(nn.Sequential):
    def __init__(self, dim: int, hidden: int, dropout: float = 0.0):
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim), nn.Dropout(dropout))


class TransformerBlock(nn.Module):
    """x + attn(LN(x)), then x + MLP(LN(x)) (the GPT-2 / ViT layout)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0, dropout: float = 0.0, eps: float = 1e-5):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = SelfAttention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = MLP(dim, int(dim * mlp_ratio), dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), key_mask, causal)
        return x + self.mlp(self.norm2(x))


class ClassAttentionBlock(TransformerBlock):
    """Updates only a class token by attending over [class token, sequence] (CaiT; used by ParT's head)."""

    def forward(self, cls: torch.Tensor, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        both = torch.cat([cls, x], dim=1)
        if key_mask is not None:
            key_mask = torch.cat([key_mask.new_ones(key_mask.shape[0], 1), key_mask], dim=1)
        cls = cls + self.attn(self.norm1(both), key_mask, queries=1)
        return cls + self.mlp(self.norm2(cls))
