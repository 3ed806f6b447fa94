"""A GPT in the manner of nanoGPT: fused `c_attn`, a `bias` buffer holding the causal mask (manual
path) or `scaled_dot_product_attention(is_causal=True)` (flash path), a weight-tied head, and a
parameter count printed at build time when `verbose`. The forward returns the logits only.

Correct: `flash`, `manual`. Every other factory carries one bug, on the line marked `# BUG: name`.
The mutant generator (`leakzoo.mutants`) edits the text of `CausalSelfAttention`: keep its mask,
slice and softmax lines as they are.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from leakzoo import N_EMBD, N_LAYER, VOCAB, seeded


@dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = VOCAB
    n_layer: int = N_LAYER
    n_head: int = 4
    n_embd: int = N_EMBD
    dropout: float = 0.0
    bias: bool = True
    flash: bool = True
    verbose: bool = False


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.layer_idx = layer_idx
        self.flash = config.flash
        if not self.flash:
            size = config.block_size
            self.register_buffer("bias", self.causal_mask(size).view(1, 1, size, size))

    def causal_mask(self, size):
        """(size, size): 1 where a query may read a key."""
        return torch.tril(torch.ones(size, size))  # SITE: nano-build

    def attend(self, q, k, v, T):
        """(B, nh, T, hs) each -> (B, nh, T, hs)."""
        if self.flash:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)  # SITE: nano-sdpa
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))  # SITE: nano-mask
        att = F.softmax(att, dim=-1)  # SITE: nano-softmax
        att = self.attn_dropout(att)
        return att @ v  # SITE: nano-av

    def forward(self, x):
        B, T, C = x.size()  # batch, time, channels
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = self.attend(q, k, v, T)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config, attention, layer_idx):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = attention(config, layer_idx)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config, attention=CausalSelfAttention):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, attention, i) for i in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        if config.verbose:
            print("number of parameters: %.2fM" % (self.get_num_params() / 1e6,))

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters()) - self.transformer.wpe.weight.numel()

    def forward(self, idx):
        b, t = idx.size()
        assert t <= self.config.block_size, f"Cannot forward sequence of length {t}, block size is only {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)  # shape (t)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))  # (b, t, vocab_size)


# ---------------------------------------------------------------------------------------------
# One bug each
# ---------------------------------------------------------------------------------------------

class NoMask(CausalSelfAttention):
    def attend(self, q, k, v, T):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att, dim=-1)  # BUG: no_mask (the masked_fill before it was removed)
        return self.attn_dropout(att) @ v


class OffByOne(CausalSelfAttention):
    def causal_mask(self, size):
        return torch.tril(torch.ones(size, size), diagonal=1)  # BUG: off_by_one


class OpenPair(CausalSelfAttention):
    def causal_mask(self, size):
        mask = torch.tril(torch.ones(size, size))
        mask[2, 5] = 1.0  # BUG: open_pair (query 2 may read key 5)
        return mask


class MaskAfterSoftmax(CausalSelfAttention):
    def attend(self, q, k, v, T):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att, dim=-1)  # BUG: mask_after_softmax (normalised over every key)
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, 0.0)
        return self.attn_dropout(att) @ v


class WrongCorner(CausalSelfAttention):
    def attend(self, q, k, v, T):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, -T:, :T] == 0, float('-inf'))  # BUG: wrong_corner
        att = F.softmax(att, dim=-1)
        return self.attn_dropout(att) @ v


class SoftmaxWrongDim(CausalSelfAttention):
    def attend(self, q, k, v, T):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
        att = F.softmax(att, dim=-2)  # BUG: prints_and_leaks (normalised over the queries)
        return self.attn_dropout(att) @ v


class NotCausal(CausalSelfAttention):
    def attend(self, q, k, v, T):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)  # BUG: sdpa_not_causal


class FloatMask(CausalSelfAttention):
    def __init__(self, config, layer_idx=0):
        super().__init__(config, layer_idx)
        size = config.block_size
        self.register_buffer("bias", self.causal_mask(size).view(1, 1, size, size))

    def attend(self, q, k, v, T):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias[:, :, :T, :T])  # BUG: sdpa_float_mask (added, not masking)


def _gpt(attention=CausalSelfAttention, **overrides):
    seeded()
    return GPT(GPTConfig(**overrides), attention).eval()


def flash():
    return _gpt()


def manual():
    return _gpt(flash=False)


def no_mask():
    return _gpt(NoMask, flash=False)


def off_by_one():
    return _gpt(OffByOne, flash=False)


def open_pair():
    return _gpt(OpenPair, flash=False)


def mask_after_softmax():
    return _gpt(MaskAfterSoftmax, flash=False)


def wrong_corner():
    """The mask built for the full block and sliced from its bottom-left corner: query t sees t + block - T keys."""
    return _gpt(WrongCorner, flash=False, block_size=24)


def prints_and_leaks():
    """Prints its parameter count while it is built, as nanoGPT does; its softmax runs over the queries."""
    return _gpt(SoftmaxWrongDim, flash=False, verbose=True)


def sdpa_not_causal():
    return _gpt(NotCausal)


def sdpa_float_mask():
    return _gpt(FloatMask)
