"""An incremental forward for HookedGPT: one position at a time, keys and values cached.

Position t is computed from positions <= t only, by construction: every module is called on
the new position alone (so a norm or mixer that looked across positions would see just this
one) and attention reads the cached keys and values of earlier positions, with no mask to get
wrong. For a correct causal model it equals the full forward up to float rounding; where the
full forward reads later tokens, the two differ. The leakage audit compares them
(`interp.analyses.leakage.fast`), at the cost of about one forward instead of T forwards of prefixes.

Supported: exactly `HookedGPT` built from `interp.models.components` blocks, i.e. every block the
native converter builds: LayerNorm, RMSNorm or no norm; learned or rotary positions (partial
rotary and Llama 3's scaled frequencies: the attention's own `rotate`); multi-head or grouped-query
attention; plain, gated or no MLP; sequential or parallel (GPT-NeoX) pre-norm blocks and post-norm
blocks; sliding windows (a query reads its last `window_size` keys, as the mask does).
`supports_incremental(model)` says so; anything else (subclasses, replaced modules) is not claimed.

`incremental_outputs(model, tokens, output=...)` yields, per position, the logits or the final
hidden state (`ln_final` applied, the unembedding's input): the audit compares hidden states,
since the unembedding is position-wise and a 49,152-wide logit vector per position costs memory
without telling more.
"""
from __future__ import annotations

from typing import Generator, Literal

import einops
import torch
from torch import nn

from interp.models.components import (
    MLP,
    UNEMBED_CLASSES,
    Attention,
    Embed,
    GatedMLP,
    GroupedQueryAttention,
    LayerNorm,
    PosEmbed,
    RMSNorm,
    TransformerBlock,
)
from interp.models.gpt import HookedGPT

ATTENTION_CLASSES = (Attention, GroupedQueryAttention)  # whose project_qkv / per_query_head / W_O / scale this reuses
NORM_CLASSES = (LayerNorm, RMSNorm, nn.Identity)  # position-wise by construction
MLP_CLASSES = (MLP, GatedMLP)
Output = Literal["logits", "hidden"]


REUSED = ("forward", "project_qkv", "rotate", "per_query_head", "kv_weights")  # methods the reference calls


def supports_incremental(model: nn.Module) -> bool:
    """True for an exact HookedGPT whose blocks are the standard components (see the module docstring), with no
    hook attached and no method replaced on an instance: what the reference calls is then position-wise."""
    if type(model) is not HookedGPT or type(model.embed) is not Embed or type(model.unembed) not in UNEMBED_CLASSES:
        return False
    cfg = model.cfg
    if cfg.positional_embedding_type not in ("standard", "rotary"):
        return False
    if cfg.positional_embedding_type == "standard" and type(getattr(model, "pos_embed", None)) is not PosEmbed:
        return False
    if type(model.ln_final) not in NORM_CLASSES or not all(_standard_block(block) for block in model.blocks):
        return False
    return not any(_altered(module) for module in model.modules())


def _altered(module: nn.Module) -> bool:
    """A torch hook on the module, or one of the reference's methods replaced on the instance."""
    hooked = module._forward_hooks or module._forward_pre_hooks or getattr(module, "fwd_hooks", None)
    return bool(hooked) or any(name in vars(module) for name in REUSED)


def _standard_block(block: nn.Module) -> bool:
    if type(block) is not TransformerBlock or type(block.attn) not in ATTENTION_CLASSES or type(block.ln1) not in NORM_CLASSES:
        return False
    return block.cfg.attn_only or (type(block.mlp) in MLP_CLASSES and type(block.ln2) in NORM_CLASSES)


class _Cache:
    """Keys and values of one layer, preallocated for the whole sequence (no copy per step)."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def extend(self, k: torch.Tensor, v: torch.Tensor, start: int, n_pos: int,
               window: int | None) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The new keys and values (batch, kv_head, new, d_head) stored at start..; every key a new position may
        read (none after the last new position exists yet), and the position of the first."""
        if self.keys is None or self.values is None:  # (batch, kv_head, pos, d_head), filled block by block
            self.keys = k.new_empty(k.shape[0], k.shape[1], n_pos, k.shape[3])
            self.values = v.new_empty(v.shape[0], v.shape[1], n_pos, v.shape[3])
        end = start + k.shape[2]
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        first = 0 if window is None else max(0, start + 1 - window)  # a window reads its last `window` keys
        return self.keys[:, :, first:end], self.values[:, :, first:end], first


def _attend(attn: Attention, x: torch.Tensor, start: int, cache: _Cache, n_pos: int) -> torch.Tensor:
    """New positions start.. (x: (batch, new, d_model)) through `attn`, reading and extending `cache`; the causal
    (and window) mask is the reference's own, built from the positions, never the model's."""
    new = x.shape[1]
    positions = torch.arange(start, start + new, device=x.device).expand(x.shape[0], new)
    q, k, v = attn.project_qkv(x, positions)  # q (batch, head, new, d_head); k, v (batch, kv_head, new, d_head)
    keys, values, first = cache.extend(k, v, start, n_pos, attn.cfg.window_size)  # (batch, kv_head, key, d_head)
    keys, values = attn.per_query_head(keys), attn.per_query_head(values)  # one per query head
    scores = (q @ keys.transpose(-1, -2)) * attn.scale  # (batch, head, new, key)
    query = torch.arange(start, start + new, device=x.device)[:, None]  # (new, 1)
    key = torch.arange(first, start + new, device=x.device)[None]  # (1, key)
    visible = key <= query
    if attn.cfg.window_size is not None:
        visible &= key > query - attn.cfg.window_size
    at_least_float32 = torch.promote_types(scores.dtype, torch.float32)  # half precision: softmax in float32
    scores = scores.to(at_least_float32).masked_fill(~visible, float("-inf"))
    z = torch.softmax(scores, dim=-1).to(values.dtype) @ values  # (batch, head, new, d_head)
    return einops.einsum(z, attn.W_O, "batch head pos d_head, head d_head d_model -> batch pos d_model") + attn.b_O


def _block_step(block: TransformerBlock, resid: torch.Tensor, start: int, cache: _Cache, n_pos: int) -> torch.Tensor:
    """New positions (batch, new, d_model) through `block`, in the block's own layout (see `TransformerBlock`)."""
    cfg = block.cfg
    if cfg.post_norm:
        resid = block.ln1(resid + _attend(block.attn, resid, start, cache, n_pos))
        return resid if cfg.attn_only else block.ln2(resid + block.mlp(resid))
    attn_out = _attend(block.attn, block.ln1(resid), start, cache, n_pos)
    if cfg.parallel_attn_mlp:
        return resid + attn_out + block.mlp(block.ln2(resid))
    resid = resid + attn_out
    return resid if cfg.attn_only else resid + block.mlp(block.ln2(resid))


@torch.no_grad()
def incremental_outputs(model: HookedGPT, tokens: torch.Tensor, output: Output = "logits",
                        chunk: int = 1) -> Generator[torch.Tensor, None, None]:
    """Blocks of `chunk` positions in turn (the last may be shorter), position t computed from tokens[:, :t + 1]
    only: the logits (batch, new, d_vocab), or with output="hidden" the final hidden states (batch, new, d_model),
    `ln_final` applied. With chunk=1 every module sees one position; with more, the modules (position-wise by
    construction: `supports_incremental`) see a block, and attention reads the cache through the reference's own
    causal mask, so output t still depends on tokens <= t alone, at a fraction of the weight reads per position."""
    if not supports_incremental(model):
        raise TypeError(f"{type(model).__name__} has no incremental path here; see interp.models.kv_cache.supports_incremental.")
    if output not in ("logits", "hidden"):
        raise ValueError(f"output={output!r}; expected 'logits' or 'hidden'.")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk={chunk!r}; expected a positive number of positions per step.")
    tokens = model.check_tokens(tokens)
    n_pos = tokens.shape[1]
    caches = [_Cache() for _ in model.blocks]
    for start in range(0, n_pos, chunk):
        new = tokens[:, start: start + chunk]  # (batch, new)
        resid = model.embed(new)  # (batch, new, d_model)
        if model.cfg.positional_embedding_type == "standard":
            resid = resid + model.pos_embed(torch.arange(start, start + new.shape[1], device=new.device).expand_as(new))
        for block, cache in zip(model.blocks, caches):
            resid = _block_step(block, resid, start, cache, n_pos)
        hidden = model.ln_final(resid)  # (batch, new, d_model)
        yield hidden if output == "hidden" else model.unembed(hidden)
