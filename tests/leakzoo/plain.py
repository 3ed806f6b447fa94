"""A plain PyTorch language model, as one writes it without a template: pre-norm blocks around
`F.scaled_dot_product_attention(is_causal=True)`, learned positions, `context_len` stored on the
model's `config`.

Correct: `lm`, `writes_fd1` (writes a line to file descriptor 1 on every forward, bypassing
sys.stdout, as a C extension's printf would). Bugs, each on its `# BUG: name` line: `ln_over_time`,
`tiny_mean`, `packed_batch`, `positions_from_right`.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

from leakzoo import N_EMBD, N_LAYER, VOCAB, seeded

CONTEXT = 16
TINY = 1e-4  # weight of the sequence mean in `tiny_mean`


class SelfAttention(nn.Module):
    def __init__(self, width: int, n_heads: int):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.n_heads = n_heads

    def split(self, t: torch.Tensor) -> torch.Tensor:
        batch, n_pos, width = t.shape
        return t.reshape(batch, n_pos, self.n_heads, width // self.n_heads).transpose(1, 2)  # (batch, head, pos, d_head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, n_pos, width = x.shape
        q, k, v = (self.split(t) for t in self.qkv(x).chunk(3, dim=-1))
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # SITE: plain-sdpa
        return self.out(z.transpose(1, 2).reshape(batch, n_pos, width))


class Block(nn.Module):
    def __init__(self, width: int, n_heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = SelfAttention(width, n_heads)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm1(x)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(self.normalise(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mix(x)
        return x + self.ff(self.norm2(x))


class TinyLM(nn.Module):
    block = Block

    def __init__(self, vocab: int = VOCAB, width: int = N_EMBD, n_layers: int = N_LAYER, n_heads: int = 4,
                 context: int = CONTEXT):
        super().__init__()
        self.config = SimpleNamespace(vocab_size=vocab, context_len=context, n_positions=context)
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.layers = nn.ModuleList([self.block(width, n_heads) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(width)
        self.unembed = nn.Linear(width, vocab)

    def positions(self, n_pos: int, device: torch.device) -> torch.Tensor:
        return torch.arange(n_pos, device=device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos(self.positions(tokens.shape[1], tokens.device))  # SITE: plain-pos (batch, pos, width)
        for layer in self.layers:
            x = layer(x)
        return self.unembed(self.norm(x))  # (batch, pos, vocab)


class TimeNormBlock(Block):
    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.transpose(1, 2), (x.shape[1],)).transpose(1, 2)  # BUG: ln_over_time


class TinyMeanBlock(Block):
    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(self.norm1(x)) + TINY * x.mean(dim=1, keepdim=True)  # BUG: tiny_mean


class PackedAttention(SelfAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, n_pos, width = x.shape
        packed = x.reshape(1, batch * n_pos, width)  # BUG: packed_batch (rows concatenated along time)
        q, k, v = (self.split(t) for t in self.qkv(packed).chunk(3, dim=-1))
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(z.transpose(1, 2).reshape(batch, n_pos, width))


class PackedBlock(Block):
    def __init__(self, width: int, n_heads: int):
        super().__init__(width, n_heads)
        self.attn = PackedAttention(width, n_heads)


class TimeNormLM(TinyLM):
    block = TimeNormBlock


class TinyMeanLM(TinyLM):
    block = TinyMeanBlock


class PackedLM(TinyLM):
    block = PackedBlock


class RightPositionsLM(TinyLM):
    def positions(self, n_pos: int, device: torch.device) -> torch.Tensor:
        return torch.arange(n_pos - 1, -1, -1, device=device)  # BUG: positions_from_right


class ChattyLM(TinyLM):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        os.write(1, b"forward pass\n")  # bypasses sys.stdout
        return super().forward(tokens)


def _build(cls: type[TinyLM]) -> TinyLM:
    seeded()
    return cls().eval()


def lm() -> TinyLM:
    return _build(TinyLM)


def writes_fd1() -> TinyLM:
    return _build(ChattyLM)


def ln_over_time() -> TinyLM:
    return _build(TimeNormLM)


def tiny_mean() -> TinyLM:
    return _build(TinyMeanLM)


def packed_batch() -> TinyLM:
    return _build(PackedLM)


def positions_from_right() -> TinyLM:
    return _build(RightPositionsLM)
