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
from transformer_lens import ActivationCache, HookedRootModule
from transformer_lens.hook_points import HookPoint

from models.config import GPTConfig


class CachingRoot(HookedRootModule):
    """A TransformerLens hook root whose `run_with_cache` returns an `ActivationCache` by default
    (the base class returns a plain dict), so `cache["pattern", 0]` works on every hooked model."""

    def run_with_cache(self, *model_args, return_cache_object: bool = True, remove_batch_dim: bool = False, **kwargs):
        names = self.cached_hook_names(kwargs.get("names_filter"))
        tokens = model_args[0] if model_args else kwargs.get("tokens")
        if isinstance(tokens, torch.Tensor) and tokens.ndim == 2:
            self.check_cache_size(names, *tokens.shape)
        out, cache_dict = super().run_with_cache(*model_args, remove_batch_dim=remove_batch_dim, **kwargs)
        if not return_cache_object:
            return out, cache_dict
        return out, ActivationCache(cache_dict, self, has_batch_dim=not remove_batch_dim)


    def cached_hook_names(self, names_filter) -> list[str]:
        """The hook names `names_filter` selects (None: all); a misspelt name is an error naming close
        matches, and a filter that selects nothing is refused rather than giving an empty cache."""
        import difflib

        every = list(self.hook_dict)
        if names_filter is None:
            return every
        if isinstance(names_filter, str):
            names_filter = [names_filter]
        if callable(names_filter):
            chosen = [name for name in every if names_filter(name)]
            if not chosen:
                raise ValueError(f"names_filter selects none of this model's {len(every)} hooks (e.g. {every[:3]}); "
                                 "check it, or pass a list of hook names.")
            return chosen
        chosen = list(names_filter)
        unknown = [name for name in chosen if name not in self.hook_dict]
        if unknown:
            close = difflib.get_close_matches(unknown[0], every, n=3)
            raise ValueError(f"names_filter names unknown hook {unknown[0]!r}" + (f"; did you mean {close}?" if close else
                             f"; hook names look like {every[:3]}") + " (model.hook_dict lists them all).")
        return chosen

    def check_cache_size(self, names: list[str], batch: int, n_pos: int) -> int:
        """Estimate the bytes a cache of `names` takes for (batch, n_pos) tokens, before running (0 when the
        root has no `cfg` with n_heads / d_head / d_model to estimate from); refuse
        (naming the size and how to narrow it) when it exceeds the memory available."""
        cfg = getattr(self, "cfg", None)
        if not all(hasattr(cfg, name) for name in ("n_heads", "d_head", "d_model")):
            return 0  # a root without our config: nothing to estimate from
        d_mlp = getattr(cfg, "d_mlp", None) or 4 * cfg.d_model
        per_token = {"q": cfg.n_heads * cfg.d_head, "k": cfg.n_heads * cfg.d_head, "v": cfg.n_heads * cfg.d_head,
                     "z": cfg.n_heads * cfg.d_head, "result": cfg.n_heads * cfg.d_model, "pre": d_mlp, "post": d_mlp,
                     "scale": 1, "attn_scores": cfg.n_heads * n_pos, "pattern": cfg.n_heads * n_pos}
        elements = sum(per_token.get(name.rsplit("hook_", 1)[-1], cfg.d_model) for name in names) * batch * n_pos
        size = elements * torch.finfo(next(self.parameters()).dtype).bits // 8
        available = _available_bytes(next(self.parameters()).device)
        if available is not None and size > available:
            gib = 2**30
            raise ValueError(
                f"run_with_cache would cache about {size / gib:.1f} GiB ({len(names)} hooks, batch {batch} x {n_pos} "
                f"positions), more than the {available / gib:.1f} GiB available; pass names_filter=[...] with only the "
                "hooks you need (attention patterns grow with positions squared), a smaller batch, or stream the "
                "prompts through interp.stream, which reduces each batch inside the hook."
            )
        return size


def _available_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on `device` (None when it cannot be told)."""
    import os

    try:
        if device.type == "cuda":
            return torch.cuda.mem_get_info(device)[0]
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, RuntimeError, AttributeError):
        return None


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
    """Rotate x of shape (batch, head, pos, d_head) by its positions (batch, pos) (GPT-NeoX convention)."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    cos = einops.rearrange(cos[positions], "batch pos d_head -> batch 1 pos d_head")
    sin = einops.rearrange(sin[positions], "batch pos d_head -> batch 1 pos d_head")
    return x * cos + rotated * sin


TO_POS = "batch head pos d_head -> batch pos head d_head"  # the layout hooks see
TO_HEAD = "batch pos head d_head -> batch head pos d_head"  # the layout matmuls use


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
        if causal:
            mask = torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool).tril()
            self.register_buffer("causal_mask", mask, persistent=False)
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

    def mask(self, n_pos: int, key_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Boolean mask, True where a query may attend to a key; broadcasts to (batch, head, query, key)."""
        allowed = self.causal_mask[:n_pos, :n_pos] if self.causal else None
        if key_mask is not None:
            keys = einops.rearrange(key_mask.bool(), "batch key -> batch 1 1 key")
            allowed = keys if allowed is None else allowed & keys
        return allowed

    def forward(
        self, x: torch.Tensor, key_mask: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x: (batch, pos, d_model); key_mask: (batch, pos), 1 for real tokens, 0 for padding;
        positions: (batch, pos) position ids, used by rotary embeddings."""
        q, k, v = self.project_qkv(x, positions)  # each (batch, head, pos, d_head)
        if self.explicit_needed():
            z = self.explicit_z(q, k, v, key_mask)
        elif key_mask is None:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            # a query whose every key is padding attends to nothing (the kernel gives NaN there)
            allowed = self.mask(x.shape[1], key_mask)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
            z = z.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
        # z: (batch, head, pos, d_head)
        if not (hook_is_live(self.hook_z) or hook_is_live(self.hook_result)):
            return einops.einsum(z, self.W_O, "batch head pos d_head, head d_head d_model -> batch pos d_model") + self.b_O
        z = einops.rearrange(self.hook_z(einops.rearrange(z, TO_POS)), TO_HEAD)
        if not hook_is_live(self.hook_result):
            return einops.einsum(z, self.W_O, "batch head pos d_head, head d_head d_model -> batch pos d_model") + self.b_O
        result = self.hook_result(einops.rearrange(z @ self.W_O, TO_POS))  # (batch, pos, head, d_model)
        return result.sum(dim=2) + self.b_O

    def project_qkv(self, x: torch.Tensor, positions: torch.Tensor | None):
        """q, k, v through one fused projection, each (batch, head, pos, d_head); rotary applied."""
        w_qkv = torch.cat([self.W_Q, self.W_K, self.W_V])  # (3 * head, d_model, d_head)
        b_qkv = einops.rearrange(torch.cat([self.b_Q, self.b_K, self.b_V]), "head d_head -> head 1 d_head")
        qkv = einops.einsum(x, w_qkv, "batch pos d_model, head d_model d_head -> batch head pos d_head") + b_qkv
        q, k, v = qkv.chunk(3, dim=1)
        if self.cfg.positional_embedding_type == "rotary":
            if positions is None:
                positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], x.shape[1])
            q = apply_rotary(q, positions, self.rotary_cos, self.rotary_sin)
            k = apply_rotary(k, positions, self.rotary_cos, self.rotary_sin)
        return q, k, v

    def explicit_z(self, q, k, v, key_mask) -> torch.Tensor:
        """The lesson's steps, each hooked. Hooks see q, k, v as (batch, pos, head, d_head) views,
        and whatever a hook returns is what the next step uses."""
        q = einops.rearrange(self.hook_q(einops.rearrange(q, TO_POS)), TO_HEAD)
        k = einops.rearrange(self.hook_k(einops.rearrange(k, TO_POS)), TO_HEAD)
        v = einops.rearrange(self.hook_v(einops.rearrange(v, TO_POS)), TO_HEAD)
        scores = (q @ k.transpose(-1, -2)) * self.scale  # (batch, head, query, key)
        allowed = self.mask(q.shape[2], key_mask)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        scores = self.hook_attn_scores(scores)
        pattern = torch.softmax(scores, dim=-1)
        if key_mask is not None:
            # a query whose every key is padding attends to nothing, rather than to NaN
            pattern = pattern.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
        pattern = self.hook_pattern(pattern)
        return pattern @ v  # (batch, head, query, d_head)


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
