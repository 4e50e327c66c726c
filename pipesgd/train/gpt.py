"""A small GPT (nanoGPT's decoder) for the character-level language-model task: tokens in, next-token logits out.

Token and learned position embeddings, ``n_layers`` pre-LayerNorm blocks of causal self-attention
(``F.scaled_dot_product_attention(is_causal=True)``) and a GELU MLP four times as wide, a final LayerNorm and an untied linear
head. Inputs are int64 ``(B, T)`` with T at most ``context``; the output is ``(B, T, vocab_size)`` logits.
No dropout: runs are short and every rank must compute the same function of its batch.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

INIT_STD = 0.02  # GPT-2's initialisation, as nanoGPT: normal(0, 0.02) weights, zero biases


class CausalSelfAttention(nn.Module):
    """Multi-head attention in which position t sees positions 0..t only."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} must be divisible by n_heads {n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (part.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)
                   for part in self.qkv(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """x + attention(LN(x)), then x + MLP(LN(x)) (pre-LayerNorm, as GPT-2)."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The decoder: embeddings, ``n_layers`` blocks, LayerNorm, linear head to the vocabulary."""

    def __init__(self, vocab_size: int, context: int, n_layers: int = 2, n_heads: int = 4, d_model: int = 128):
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.Sequential(*(Block(d_model, n_heads) for _ in range(n_layers)))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(_init)
        # GPT-2: the layers that write into the residual stream start smaller, so its variance does not grow
        # with depth.
        for block in self.blocks:
            for out in (block.attn.proj, block.mlp[2]):
                nn.init.normal_(out.weight, 0.0, INIT_STD / math.sqrt(2 * n_layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.context:
            raise ValueError(f"sequence of {t} tokens is longer than the model's context of {self.context}")
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        return self.head(self.ln(self.blocks(x)))


def _init(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, 0.0, INIT_STD)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
