"""A language model behind a Hugging Face-style interface: `forward(input_ids, attention_mask=None)`
returning a `CausalLMOutput`, its attention masking padded keys with a boolean `attn_mask` to SDPA.

Correct: `wrapped` (passes the mask down). Bug: `drops_mask` accepts `attention_mask` and ignores it,
so left padding is visible to the real tokens after it.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F
from transformers.modeling_outputs import CausalLMOutput

from leakzoo import N_EMBD, N_LAYER, VOCAB, seeded

CONTEXT = 16


class PaddedAttention(nn.Module):
    def __init__(self, width: int, n_heads: int):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.n_heads = n_heads

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """x (batch, pos, width); keep (batch, pos) bool, False at padding, or None."""
        batch, n_pos, width = x.shape
        q, k, v = (t.view(batch, n_pos, self.n_heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        allowed = torch.ones(n_pos, n_pos, dtype=torch.bool, device=x.device).tril()  # (query, key)
        if keep is not None:  # a padded query still reads itself, so no row is empty (no NaN)
            eye = torch.eye(n_pos, dtype=torch.bool, device=x.device)
            allowed = allowed & (keep[:, None, None, :] | eye)  # (batch, 1, query, key)
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # SITE: wrap-sdpa
        return self.out(z.transpose(1, 2).reshape(batch, n_pos, width))


class Layer(nn.Module):
    def __init__(self, width: int, n_heads: int):
        super().__init__()
        self.ln_attn, self.ln_mlp = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = PaddedAttention(width, n_heads)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x), keep)
        return x + self.mlp(self.ln_mlp(x))


class Backbone(nn.Module):
    def __init__(self, vocab: int, width: int, n_layers: int, n_heads: int, context: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.layers = nn.ModuleList([Layer(width, n_heads) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(width)

    def forward(self, input_ids: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        if keep is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        else:  # positions count real tokens only, so left padding does not shift them
            positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
        x = self.wte(input_ids) + self.wpe(positions)
        for layer in self.layers:
            x = layer(x, keep)
        return self.ln_f(x)


class WrappedLM(nn.Module):
    """The Hugging Face-style face: a config with vocab_size / max_position_embeddings, logits in an output object."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(vocab_size=VOCAB, max_position_embeddings=CONTEXT, is_decoder=True)
        self.model = Backbone(VOCAB, N_EMBD, N_LAYER, 4, CONTEXT)
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs) -> CausalLMOutput:
        keep = None if attention_mask is None else attention_mask.bool()
        return CausalLMOutput(logits=self.lm_head(self.model(input_ids, keep)))


class MaskDroppingLM(WrappedLM):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs) -> CausalLMOutput:
        return CausalLMOutput(logits=self.lm_head(self.model(input_ids, None)))  # BUG: drops_mask (attention_mask ignored)


def wrapped() -> WrappedLM:
    seeded()
    return WrappedLM().eval()


def drops_mask() -> WrappedLM:
    seeded()
    return MaskDroppingLM().eval()
