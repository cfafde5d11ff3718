"""A GPT-style decoder-only language model (Radford et al. 2019) on ``F.scaled_dot_product_attention``.

``vocab_size=50257, context=1024, dim=768, depth=12, heads=12`` is GPT-2 small
(124.4 M parameters, output projection tied to the token embedding). Input: token ids
(N, T) int64 with T <= context; output: next-token logits (N, T, vocab).
"""

from __future__ import annotations

import torch
from torch import nn

from hpcdl.models.transformer import TransformerBlock


class GPT(nn.Module):
    def __init__(
        self,
        vocab_size: int = 50257,
        context: int = 1024,
        dim: int = 768,
        depth: int = 12,
        heads: int = 12,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.context = context
        self.token_embed = nn.Embedding(vocab_size, dim)
        self.position_embed = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, mlp_ratio, dropout) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, vocab_size, bias=False))
        self.head[1].weight = self.token_embed.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def checkpoint_blocks(self) -> list[nn.Module]:
        return [*self.blocks, self.head]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.dtype != torch.int64:
            raise ValueError(f"GPT takes int64 token ids (N, T), got {tuple(tokens.shape)} {tokens.dtype}")
        if tokens.shape[1] > self.context:
            raise ValueError(f"sequence length {tokens.shape[1]} exceeds the model's context of {self.context}")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.token_embed(tokens) + self.position_embed(positions)
        for block in self.blocks:
            h = block(h, causal=True)
        return self.head(h)
