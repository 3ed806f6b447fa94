"""An incremental forward for HookedGPT: one position at a time, keys and values cached.

Position t is computed from positions <= t only, by construction: every module is called on
the new position alone (so a norm or mixer that looked across positions would see just this
one) and attention reads the cached keys and values of earlier positions, with no mask to get
wrong. For a correct causal model it equals the full forward up to float rounding; where the
full forward reads later tokens, the two differ. The leakage audit compares them
(`interp.analyses.leakage.fast`), at the cost of about one forward instead of T forwards of prefixes.

Supported: exactly `HookedGPT` built from `interp.models.components` blocks (LayerNorm or no norm,
learned or rotary positions, grouped-query attention, MLP or attention-only, pre-norm and
sequential; no sliding window). `supports_incremental(model)` says so;
anything else (subclasses, replaced modules) is not claimed.
"""
from __future__ import annotations

from typing import Generator

import einops
import torch
from torch import nn

from interp.models import components
from interp.models.components import MLP, Attention, Embed, LayerNorm, PosEmbed, TransformerBlock, Unembed

# attention classes whose project_qkv / per_query_head / W_O / b_O / scale this path reuses
ATTENTION_CLASSES = tuple(c for c in (Attention, getattr(components, "GroupedQueryAttention", None)) if c is not None)
from interp.models.gpt import HookedGPT


def supports_incremental(model: nn.Module) -> bool:
    """True for an exact HookedGPT whose blocks are the standard components (see the module docstring)."""
    if type(model) is not HookedGPT or type(model.embed) is not Embed or type(model.unembed) is not Unembed:
        return False
    cfg = model.cfg
    if cfg.positional_embedding_type not in ("standard", "rotary"):
        return False
    if getattr(cfg, "window_size", None) is not None or getattr(cfg, "parallel_attn_mlp", False) or getattr(cfg, "post_norm", False):
        return False  # sliding windows and other block layouts are not reproduced here
    if model.cfg.positional_embedding_type == "standard" and type(getattr(model, "pos_embed", None)) is not PosEmbed:
        return False
    norms = (LayerNorm, nn.Identity)
    if type(model.ln_final) not in norms:
        return False
    for block in model.blocks:
        if type(block) is not TransformerBlock or type(block.attn) not in ATTENTION_CLASSES or type(block.ln1) not in norms:
            return False
        if not block.cfg.attn_only and (type(block.mlp) is not MLP or type(block.ln2) not in norms):
            return False
    return True


class _Cache:
    """Keys and values of one layer, preallocated for the whole sequence (no copy per step)."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def extend(self, k: torch.Tensor, v: torch.Tensor, position: int, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is None or self.values is None:  # (batch, head, pos, d_head), filled one position per step
            self.keys = k.new_empty(k.shape[0], k.shape[1], n_pos, k.shape[3])
            self.values = v.new_empty(v.shape[0], v.shape[1], n_pos, v.shape[3])
        self.keys[:, :, position] = k[:, :, 0]
        self.values[:, :, position] = v[:, :, 0]
        return self.keys[:, :, : position + 1], self.values[:, :, : position + 1]  # only past keys exist


def _attend(attn: Attention, x: torch.Tensor, position: int, cache: _Cache, n_pos: int) -> torch.Tensor:
    """One new position x (batch, 1, d_model) through `attn`, reading and extending `cache`."""
    positions = torch.full((x.shape[0], 1), position, dtype=torch.long, device=x.device)
    q, k, v = attn.project_qkv(x, positions)  # each (batch, head, 1, d_head)
    keys, values = cache.extend(k, v, position, n_pos)  # (batch, kv_head, key, d_head)
    if hasattr(attn, "per_query_head"):  # grouped-query attention: one key / value head per group
        keys, values = attn.per_query_head(keys), attn.per_query_head(values)
    scores = (q @ keys.transpose(-1, -2)) * attn.scale  # (batch, head, 1, key)
    z = torch.softmax(scores.float(), dim=-1).to(values.dtype) @ values  # (batch, head, 1, d_head)
    return einops.einsum(z, attn.W_O, "batch head pos d_head, head d_head d_model -> batch pos d_model") + attn.b_O


@torch.no_grad()
def incremental_outputs(model: HookedGPT, tokens: torch.Tensor) -> Generator[torch.Tensor, None, None]:
    """Logits (batch, d_vocab) of each position t = 0..T-1 in turn, computed from tokens[:, :t + 1] only."""
    if not supports_incremental(model):
        raise TypeError(f"{type(model).__name__} has no incremental path here; see interp.models.kv_cache.supports_incremental.")
    tokens = model.check_tokens(tokens)
    n_pos = tokens.shape[1]
    caches = [_Cache() for _ in model.blocks]
    for t in range(n_pos):
        resid = model.embed(tokens[:, t : t + 1])  # (batch, 1, d_model)
        if model.cfg.positional_embedding_type == "standard":
            resid = resid + model.pos_embed(torch.full_like(tokens[:, t : t + 1], t))
        for i, block in enumerate(model.blocks):
            resid = resid + _attend(block.attn, block.ln1(resid), t, caches[i], n_pos)
            if not block.cfg.attn_only:
                resid = resid + block.mlp(block.ln2(resid))
        yield model.unembed(model.ln_final(resid))[:, 0]  # (batch, d_vocab)
