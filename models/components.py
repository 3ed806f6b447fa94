"""Building blocks shared by `HookedGPT` and `HookedEncoder`.

Vocabulary, used the same way everywhere in the toolkit:
- `attn_scores`: q k^T / sqrt(d_head) after the mask (masked entries are -inf), before softmax;
- `pattern`: softmax(attn_scores) over the key axis, rows summing to one;
- `z`: pattern @ v, one vector per head and position;
- `result`: each head's write to the residual stream, z @ W_O[head] (the heads sum, plus b_O,
  to the attention output).
Heads are labelled `L{layer}H{head}`.

Weights are stored per head, as TransformerLens stores them: `W_Q[h]` is one head's
(d_model, d_head) query map, so hand-set ("constructed") heads are one assignment each.
"""
from __future__ import annotations

import math

import einops
import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from models.config import GPTConfig


def hook_is_live(hook: HookPoint) -> bool:
    """Whether anything (a TransformerLens hook or a raw torch hook) watches this point."""
    return bool(hook.fwd_hooks or hook.bwd_hooks or hook._forward_hooks or hook._forward_pre_hooks)


class Embed(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.W_E[tokens]  # (batch, pos, d_model)


class PosEmbed(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.W_pos[positions]  # (batch, pos, d_model)


class Unembed(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab))

    def forward(self, residual: torch.Tensor) -> torch.Tensor:
        return residual @ self.W_U + self.b_U  # (batch, pos, d_vocab)


class LayerNorm(nn.Module):
    """LayerNorm with TransformerLens's hooks, so the scale can be read or frozen."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.eps = cfg.layer_norm_eps
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))
        self.hook_scale = HookPoint()  # (batch, pos, 1)
        self.hook_normalized = HookPoint()  # (batch, pos, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (hook_is_live(self.hook_scale) or hook_is_live(self.hook_normalized)):
            # fused, same maths; the hand-written steps made the whole forward ~1.3x slower (bench_forward)
            return F.layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps)
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale) * self.w + self.b


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        self.act_fn = {"gelu": F.gelu, "relu": F.relu, "silu": F.silu}[cfg.act_fn]
        self.hook_pre = HookPoint()  # (batch, pos, d_mlp)
        self.hook_post = HookPoint()  # (batch, pos, d_mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.hook_pre(x @ self.W_in + self.b_in)
        return self.hook_post(self.act_fn(pre)) @ self.W_out + self.b_out


def rotary_tables(n_ctx: int, d_head: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (n_ctx, d_head), for rotating halves of each head vector."""
    inv_freq = 1.0 / base ** (torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)
    angles = torch.outer(torch.arange(n_ctx, dtype=torch.float32), inv_freq)  # (pos, d_head/2)
    angles = torch.cat([angles, angles], dim=-1)  # (pos, d_head)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x of shape (batch, pos, head, d_head) by its positions (GPT-NeoX convention)."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    cos = einops.rearrange(cos[positions], "batch pos d_head -> batch pos 1 d_head")
    sin = einops.rearrange(sin[positions], "batch pos d_head -> batch pos 1 d_head")
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Multi-head attention written out as in the lesson, with a hook at every step.

    The explicit path (scores, mask, softmax, pattern @ v) runs when a hook on q, k, v,
    attn_scores or pattern is live; otherwise `F.scaled_dot_product_attention` computes the
    same thing fused. Per-head results (d_model wide per head) are materialised only when
    `hook_result` is live.
    """

    def __init__(self, cfg: GPTConfig, causal: bool):
        super().__init__()
        self.cfg = cfg
        self.causal = causal
        n_heads, d_model, d_head = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_K = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_V = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_O = nn.Parameter(torch.empty(n_heads, d_head, d_model))
        self.b_Q = nn.Parameter(torch.zeros(n_heads, d_head))
        self.b_K = nn.Parameter(torch.zeros(n_heads, d_head))
        self.b_V = nn.Parameter(torch.zeros(n_heads, d_head))
        self.b_O = nn.Parameter(torch.zeros(d_model))
        self.scale = 1.0 / math.sqrt(d_head)
        if cfg.positional_embedding_type == "rotary":
            cos, sin = rotary_tables(cfg.n_ctx, d_head, cfg.rotary_base)
            self.register_buffer("rotary_cos", cos, persistent=False)
            self.register_buffer("rotary_sin", sin, persistent=False)
        self.hook_q = HookPoint()  # (batch, pos, head, d_head)
        self.hook_k = HookPoint()  # (batch, pos, head, d_head)
        self.hook_v = HookPoint()  # (batch, pos, head, d_head)
        self.hook_attn_scores = HookPoint()  # (batch, head, query, key)
        self.hook_pattern = HookPoint()  # (batch, head, query, key)
        self.hook_z = HookPoint()  # (batch, pos, head, d_head)
        self.hook_result = HookPoint()  # (batch, pos, head, d_model)

    def explicit_needed(self) -> bool:
        watched = (self.hook_q, self.hook_k, self.hook_v, self.hook_attn_scores, self.hook_pattern)
        return any(hook_is_live(h) for h in watched)

    def mask(self, n_query: int, n_key: int, key_mask: torch.Tensor | None, device) -> torch.Tensor | None:
        """Boolean mask, True where a query may attend to a key; broadcasts to (batch, head, query, key)."""
        allowed = None
        if self.causal:
            allowed = torch.ones(n_query, n_key, dtype=torch.bool, device=device).tril()
        if key_mask is not None:
            keys = einops.rearrange(key_mask.bool(), "batch key -> batch 1 1 key")
            allowed = keys if allowed is None else allowed & keys
        return allowed

    def forward(
        self, x: torch.Tensor, key_mask: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x: (batch, pos, d_model); key_mask: (batch, pos), 1 for real tokens, 0 for padding;
        positions: (batch, pos) position ids, used by rotary embeddings."""
        if self.explicit_needed():
            z = self.explicit_z(x, key_mask, positions)
        else:
            z = self.fused_z(x, key_mask, positions)
        if hook_is_live(self.hook_z) or hook_is_live(self.hook_result):
            z = self.hook_z(einops.rearrange(z, "batch head pos d_head -> batch pos head d_head"))
            if hook_is_live(self.hook_result):
                result = self.hook_result(einops.einsum(
                    z, self.W_O, "batch pos head d_head, head d_head d_model -> batch pos head d_model"
                ))
                return result.sum(dim=2) + self.b_O
            return einops.einsum(z, self.W_O, "batch pos head d_head, head d_head d_model -> batch pos d_model") + self.b_O
        return einops.einsum(z, self.W_O, "batch head pos d_head, head d_head d_model -> batch pos d_model") + self.b_O

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor | None, head_major: bool):
        if self.cfg.positional_embedding_type != "rotary":
            return q, k
        if positions is None:
            n_pos = q.shape[2] if head_major else q.shape[1]
            positions = torch.arange(n_pos, device=q.device).expand(q.shape[0], n_pos)
        if head_major:
            to_pos = "batch head pos d_head -> batch pos head d_head"
            q, k = einops.rearrange(q, to_pos), einops.rearrange(k, to_pos)
        q = apply_rotary(q, positions, self.rotary_cos, self.rotary_sin)
        k = apply_rotary(k, positions, self.rotary_cos, self.rotary_sin)
        if head_major:
            to_head = "batch pos head d_head -> batch head pos d_head"
            q, k = einops.rearrange(q, to_head), einops.rearrange(k, to_head)
        return q, k

    def explicit_z(self, x, key_mask, positions) -> torch.Tensor:
        """The lesson's steps, each hooked; returns z as (batch, head, pos, d_head)."""
        q = einops.einsum(x, self.W_Q, "batch pos d_model, head d_model d_head -> batch pos head d_head") + self.b_Q
        k = einops.einsum(x, self.W_K, "batch pos d_model, head d_model d_head -> batch pos head d_head") + self.b_K
        v = einops.einsum(x, self.W_V, "batch pos d_model, head d_model d_head -> batch pos head d_head") + self.b_V
        q, k = self.rotate(q, k, positions, head_major=False)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        scores = einops.einsum(q, k, "batch query head d_head, batch key head d_head -> batch head query key") * self.scale
        allowed = self.mask(x.shape[1], x.shape[1], key_mask, x.device)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        scores = self.hook_attn_scores(scores)
        pattern = torch.softmax(scores, dim=-1)
        if key_mask is not None:
            # a query whose every key is padding attends to nothing, rather than to NaN
            pattern = pattern.nan_to_num(0.0)
        pattern = self.hook_pattern(pattern)
        return einops.einsum(pattern, v, "batch head query key, batch key head d_head -> batch head query d_head")

    def fused_z(self, x, key_mask, positions) -> torch.Tensor:
        """Same maths through one QKV projection and `scaled_dot_product_attention`; (batch, head, pos, d_head)."""
        w_qkv = torch.cat([self.W_Q, self.W_K, self.W_V])  # (3 * head, d_model, d_head)
        b_qkv = einops.rearrange(torch.cat([self.b_Q, self.b_K, self.b_V]), "head d_head -> head 1 d_head")
        qkv = einops.einsum(x, w_qkv, "batch pos d_model, head d_model d_head -> batch head pos d_head") + b_qkv
        q, k, v = qkv.chunk(3, dim=1)  # each (batch, head, pos, d_head)
        q, k = self.rotate(q, k, positions, head_major=True)
        if key_mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        allowed = self.mask(x.shape[1], x.shape[1], key_mask, x.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed).nan_to_num(0.0)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: GPTConfig, causal: bool):
        super().__init__()
        self.cfg = cfg
        norm = LayerNorm if cfg.normalization_type == "LN" else lambda _cfg: nn.Identity()
        self.ln1 = norm(cfg)
        self.attn = Attention(cfg, causal=causal)
        if not cfg.attn_only:
            self.ln2 = norm(cfg)
            self.mlp = MLP(cfg)
        self.hook_resid_pre = HookPoint()  # (batch, pos, d_model)
        self.hook_attn_out = HookPoint()  # (batch, pos, d_model)
        self.hook_resid_mid = HookPoint()  # (batch, pos, d_model)
        self.hook_mlp_out = HookPoint()  # (batch, pos, d_model)
        self.hook_resid_post = HookPoint()  # (batch, pos, d_model)

    def forward(
        self, resid: torch.Tensor, key_mask: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(self.attn(self.ln1(resid), key_mask, positions))
        resid = self.hook_resid_mid(resid + attn_out)
        if not self.cfg.attn_only:
            resid = resid + self.hook_mlp_out(self.mlp(self.ln2(resid)))
        return self.hook_resid_post(resid)


def init_weights(model: nn.Module, cfg: GPTConfig) -> None:
    """Normal(0, init_range) for matrices, zeros for biases, ones for LayerNorm gains; seeded."""
    generator = torch.Generator().manual_seed(cfg.seed) if cfg.seed is not None else None
    for name, param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        with torch.no_grad():
            if leaf.startswith("W_"):
                param.copy_(torch.randn(param.shape, generator=generator) * cfg.init_range)
            elif leaf == "w":
                param.fill_(1.0)
            else:
                param.zero_()
