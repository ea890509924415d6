"""Text side: the `bytes` tokenizer and a UMT5-style encoder (Wan's T5Encoder layout).

Parameter names follow Wan2.1's `T5Encoder` (umt5: a relative position bias per layer), so a
UMT5 checkpoint with a matching config loads; without one the weights are seeded random.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import TextConfig


def tokenize_bytes(prompt: str, text_len: int):
    """UTF-8 bytes + 1 (0 is padding), truncated/padded to text_len.  Returns int64 ids and mask [1, L]."""
    raw = list(prompt.encode("utf-8"))[:text_len]
    ids = np.zeros((1, text_len), dtype=np.int64)
    mask = np.zeros((1, text_len), dtype=np.int64)
    ids[0, : len(raw)] = np.asarray(raw, dtype=np.int64) + 1
    mask[0, : len(raw)] = 1
    return ids, mask


class T5RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def relative_buckets(length: int, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5 bidirectional relative-position buckets for key - query offsets ([L, L] int64)."""
    rel = torch.arange(length)[None, :] - torch.arange(length)[:, None]
    nb = num_buckets // 2
    buckets = (rel > 0).long() * nb
    rel = rel.abs()
    max_exact = nb // 2
    large = max_exact + (
        torch.log(rel.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact) * (nb - max_exact)
    ).long()
    large = torch.minimum(large, torch.full_like(large, nb - 1))
    return buckets + torch.where(rel < max_exact, rel, large)


class T5RelativeEmbedding(nn.Module):
    def __init__(self, cfg: TextConfig, length: int):
        super().__init__()
        self.embedding = nn.Embedding(cfg.num_buckets, cfg.heads)
        # The text length is fixed by the bundle, so the bucket table is a constant.
        self.register_buffer("buckets", relative_buckets(length, cfg.num_buckets, cfg.max_distance), persistent=False)

    def forward(self):
        return self.embedding(self.buckets).permute(2, 0, 1).unsqueeze(0).float()  # [1, H, L, L]


class T5Attention(nn.Module):
    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.heads = cfg.heads
        self.q = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.k = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.v = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.o = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x, bias):
        b, n, d = x.shape
        hd = d // self.heads
        q = self.q(x).view(b, n, self.heads, hd).transpose(1, 2).float()
        k = self.k(x).view(b, n, self.heads, hd).transpose(1, 2).float()
        v = self.v(x).view(b, n, self.heads, hd).transpose(1, 2).float()
        # T5 does not scale by 1/sqrt(hd) (it is folded into the q weights).  Plain ops here:
        # the text encoder runs once per prompt, outside the timed region.
        attn = torch.softmax(q @ k.transpose(-1, -2) + bias, dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, n, d).type_as(x)
        return self.o(out)


class T5FeedForward(nn.Module):
    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.gate = nn.Sequential(nn.Linear(cfg.dim, cfg.ffn_dim, bias=False), nn.GELU(approximate="tanh"))
        self.fc1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.fc2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x):
        return self.fc2(self.fc1(x) * self.gate(x))


class T5Block(nn.Module):
    def __init__(self, cfg: TextConfig, length: int):
        super().__init__()
        self.norm1 = T5RMSNorm(cfg.dim)
        self.attn = T5Attention(cfg)
        self.norm2 = T5RMSNorm(cfg.dim)
        self.ffn = T5FeedForward(cfg)
        self.pos_embedding = T5RelativeEmbedding(cfg, length)

    def forward(self, x, mask_bias):
        x = x + self.attn(self.norm1(x), self.pos_embedding() + mask_bias)
        return x + self.ffn(self.norm2(x))


class TextEncoder(nn.Module):
    def __init__(self, cfg: TextConfig, length: int):
        super().__init__()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList([T5Block(cfg, length) for _ in range(cfg.layers)])
        self.norm = T5RMSNorm(cfg.dim)

    def init_random(self, seed: int) -> "TextEncoder":
        """T5-style init: q gets (d*hd)^-1/2 because attention is unscaled."""
        g = torch.Generator().manual_seed(seed)
        d, hd = self.cfg.dim, self.cfg.dim // self.cfg.heads
        for name, p in self.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "norm.weight":
                p.data = torch.ones_like(p)
            elif name == "token_embedding.weight":
                p.data = torch.randn(p.shape, generator=g)
            elif name.endswith("attn.q.weight"):
                p.data = torch.randn(p.shape, generator=g) * (d * hd) ** -0.5
            elif name.endswith("pos_embedding.embedding.weight"):
                p.data = torch.randn(p.shape, generator=g) * 0.5
            else:
                p.data = torch.randn(p.shape, generator=g) * p.shape[1] ** -0.5
        return self

    def forward(self, input_ids, attention_mask):
        x = self.token_embedding(input_ids)
        # Additive key mask in float32; -1e9 (not -inf) keeps an all-padding prompt finite.
        mask_bias = (1.0 - attention_mask.float())[:, None, None, :] * -1e9
        for blk in self.blocks:
            x = blk(x, mask_bias)
        x = self.norm(x)
        # Wan pads the context with zeros after the text encoder; do the same here.
        return x * attention_mask.unsqueeze(-1).to(x.dtype)
