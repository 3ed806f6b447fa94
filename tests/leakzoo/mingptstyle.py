"""A GPT in the manner of minGPT: separate key / query / value projections, a `mask` buffer, a
`NewGELU`, and the parameter count printed whenever a GPT is built (minGPT always prints it).

Correct: `gpt`. Bugs: `head_split_reshape` (heads split by a view across time) and
`last_layer_unmasked`, each on the line marked `# BUG: name`. The mutant generator edits the
text of `CausalSelfAttention.forward`.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn as nn
from torch.nn import functional as F

from leakzoo import N_EMBD, N_LAYER, VOCAB, seeded


class NewGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.key = nn.Linear(config.n_embd, config.n_embd)
        self.query = nn.Linear(config.n_embd, config.n_embd)
        self.value = nn.Linear(config.n_embd, config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_drop = nn.Dropout(config.attn_pdrop)
        self.resid_drop = nn.Dropout(config.resid_pdrop)
        self.register_buffer("mask", torch.tril(torch.ones(config.block_size, config.block_size))  # SITE: min-build
                             .view(1, 1, config.block_size, config.block_size))
        self.n_head = config.n_head

    def heads(self, t, B, T, C):
        return t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

    def forward(self, x):
        B, T, C = x.size()
        k = self.heads(self.key(x), B, T, C)
        q = self.heads(self.query(x), B, T, C)
        v = self.heads(self.value(x), B, T, C)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float('-inf'))  # SITE: min-mask
        att = F.softmax(att, dim=-1)  # SITE: min-softmax
        att = self.attn_drop(att)
        y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)  # SITE: min-av
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, config, attention):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.attn = attention(config)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd),
            NewGELU(),
            nn.Linear(4 * config.n_embd, config.n_embd),
            nn.Dropout(config.resid_pdrop),
        )

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config, attention=CausalSelfAttention):
        super().__init__()
        self.block_size = config.block_size
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Parameter(torch.randn(1, config.block_size, config.n_embd) * 0.5)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.blocks = nn.Sequential(*[Block(config, attention) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        n_params = sum(p.numel() for p in self.parameters())
        print("number of parameters: %.2fM" % (n_params / 1e6,))

    def forward(self, idx):
        b, t = idx.size()
        assert t <= self.block_size, "Cannot forward, model block size is exhausted."
        x = self.drop(self.tok_emb(idx) + self.pos_emb[:, :t, :])
        x = self.blocks(x)
        return self.head(self.ln_f(x))


class ReshapeHeads(CausalSelfAttention):
    def heads(self, t, B, T, C):
        return t.view(B, self.n_head, T, C // self.n_head)  # BUG: head_split_reshape (across time, no transpose)


class LastLayerUnmasked(GPT):
    def __init__(self, config):
        super().__init__(config)
        self.blocks[-1].attn.mask.fill_(1.0)  # BUG: last_layer_unmasked (its mask opened after the build)


def config(**overrides):
    """minGPT's CfgNode, as a namespace."""
    values = dict(vocab_size=VOCAB, block_size=16, n_layer=N_LAYER, n_head=2, n_embd=N_EMBD,
                  embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0)
    return SimpleNamespace(**{**values, **overrides})


def gpt():
    seeded()
    return GPT(config()).eval()


def head_split_reshape():
    seeded()
    return GPT(config(), ReshapeHeads).eval()


def last_layer_unmasked():
    seeded()
    return LastLayerUnmasked(config()).eval()
