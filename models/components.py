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

import contextlib
import contextvars
import math
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, Iterator, TypeVar, overload

import einops
import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens import ActivationCache, HookedRootModule
from transformer_lens.hook_points import HookPoint

from interp.models.config import EncoderConfig, GPTConfig


class AliasedDict(dict):
    """A cache dict that also answers to aliases (alias -> stored key): one tensor, two names."""

    def __init__(self, data: dict, aliases: dict[str, str]):
        super().__init__(data)
        self.aliases = aliases

    def __missing__(self, key):
        if isinstance(key, str) and key in self.aliases and dict.__contains__(self, self.aliases[key]):
            return self[self.aliases[key]]
        raise KeyError(key)

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or (
            isinstance(key, str) and key in self.aliases and dict.__contains__(self, self.aliases[key]))

    def get(self, key, default=None):
        return self[key] if key in self else default


class BufferPool:
    """Output tensors of the explicit attention path kept for the next forward of the same shape.

    Why: on CPU, a tensor of a few MiB freshly allocated is fresh pages from the kernel (glibc maps
    large blocks and unmaps them when freed), and faulting them in costs more than the arithmetic
    that fills them; a cache of every attention hook is mostly such tensors. So, while
    `reuse_buffers` is on (`run_with_cache` without autograd, on CPU), `Attention` writes its
    scores, pattern, z and per-head result into tensors this pool hands out and keeps.

    A kept tensor is handed out again only when nothing else holds its memory: no cache, view,
    numpy array, storage object or autograd graph (the storage's use count and the storage object's
    references are checked), so a cache already returned is never overwritten. At most `keep` tensors
    per (module, role) are kept (two: a loop's previous cache is still alive while the next one runs);
    `clear()` lets them go."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._kept: dict[tuple[int, str], list[torch.Tensor]] = {}
        self._lock = threading.Lock()  # two threads caching on one model must not both take one free tensor

    @staticmethod
    def _holders(base: torch.Tensor) -> tuple[int, int]:
        """(uses of `base`'s storage, references to its Python object), counted the same way every time."""
        storage = base.untyped_storage()  # the storage's own Python object when someone holds it, else a new one
        return torch._C._storage_Use_Count(storage._cdata), sys.getrefcount(storage)

    _alone: tuple[int, int] | None = None  # what `_holders` counts for a tensor nothing else holds (torch's own refs)

    @classmethod
    def in_use(cls, base: torch.Tensor) -> bool:
        """Whether anything but the pool holds `base`'s memory (a view, a cache, a numpy array, its storage)."""
        if cls._alone is None:  # measured, not assumed: the counts torch itself adds vary between versions
            cls._alone = cls._holders(torch.empty(1))
        uses, references = cls._holders(base)
        return uses > cls._alone[0] or references > cls._alone[1]

    def empty(self, owner: object, role: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """An uninitialised tensor of `shape` with `like`'s dtype and device, reused when one is free."""
        with self._lock:
            return self._empty(owner, role, shape, like)

    def _empty(self, owner: object, role: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        kept = self._kept.setdefault((id(owner), role), [])
        inference = torch.is_inference_mode_enabled()
        free = [t for t in kept if not self.in_use(t)]
        for base in free:
            if base.shape == shape and base.dtype == like.dtype and base.device == like.device \
                    and base.is_inference() == inference:
                return base.view(shape)  # a new tensor object on the kept memory
        fresh = torch.empty(shape, dtype=like.dtype, device=like.device)
        if len(kept) >= self.keep and free:
            kept[:] = [t for t in kept if t is not free[0]]  # a free one of another shape makes room
        if len(kept) < self.keep:
            kept.append(fresh)
            return fresh.view(shape)
        return fresh  # every kept tensor is in use: not kept

    def clear(self) -> None:
        self._kept.clear()


_POOLS: weakref.WeakKeyDictionary[nn.Module, BufferPool] = weakref.WeakKeyDictionary()  # root model -> its pool
_ACTIVE_POOL: contextvars.ContextVar[BufferPool | None] = contextvars.ContextVar("interp_buffer_pool", default=None)


@contextlib.contextmanager
def reuse_buffers(pool: BufferPool, device: torch.device) -> Iterator[None]:
    """Let `Attention` write into `pool`'s tensors inside the block, when that is safe and useful:
    autograd off (out= tensors take no gradient) and a CPU device (CUDA's allocator caches already)."""
    if torch.is_grad_enabled() or device.type != "cpu":
        yield
        return
    token = _ACTIVE_POOL.set(pool)
    try:
        yield
    finally:
        _ACTIVE_POOL.reset(token)


_TRANSIENT = object()  # the pool's owner of tensors no hook sees: one set for every layer, not one per layer


def pooled(owner: object, role: str, shape: tuple[int, ...], like: torch.Tensor, *, watched: bool = True
           ) -> torch.Tensor | None:
    """A tensor from the active pool (None outside `reuse_buffers`: allocate as usual). `watched=False`: no hook
    sees this role's tensor, so it lives only inside this layer's step and the next layer reuses the same memory
    (kept per layer, the scores, z and projections of every layer would stay resident after the forward: on
    SmolLM2-135M at 8 x 128 tokens 330 MB beside a 141 MB pattern cache)."""
    pool = _ACTIVE_POOL.get()
    return None if pool is None else pool.empty(owner if watched else _TRANSIENT, role, shape, like)


class CachingRoot(HookedRootModule):
    """A TransformerLens hook root whose `run_with_cache` returns an `ActivationCache` by default
    (the base class returns a plain dict), so `cache["pattern", 0]` works on every hooked model.

    `hook_aliases` (alias -> hook name) gives a hook point a second name, e.g. TransformerLens's
    `blocks.0.attn.hook_pattern` for a user model's `enc.layers.0.self_attn.hook_pattern`
    (`interp.hook_attention`, `interp.hook_sdpa`): `mod_dict` holds both names for the one HookPoint,
    `hook_dict` only its own (so every loop over it visits each point once), hook names and filters may
    use either, and a cache stores its tensor once, under its own name, readable under both."""

    hook_aliases: dict[str, str] = {}  # none unless set_hook_aliases gave some

    def set_hook_aliases(self, aliases: dict[str, str]) -> None:
        """Alias -> hook name; each alias resolves to the same HookPoint (in `mod_dict`)."""
        unknown = sorted(name for name in aliases.values() if name not in self.hook_dict)
        if unknown:
            raise ValueError(f"hook aliases point at unknown hooks {unknown[:3]}; expected names in hook_dict.")
        self.hook_aliases = dict(aliases)
        for alias, name in aliases.items():
            self.mod_dict[alias] = self.hook_dict[name]

    def _with_aliases(self, names_filter):
        """A callable filter that also selects a hook when it selects one of the hook's aliases."""
        if not self.hook_aliases or not callable(names_filter):
            return names_filter
        alias_of: dict[str, list[str]] = {}
        for alias, name in self.hook_aliases.items():
            alias_of.setdefault(name, []).append(alias)
        return lambda name: bool(names_filter(name)) or any(names_filter(a) for a in alias_of.get(name, ()))

    def _enable_hook(self, name, hook, dir):
        super()._enable_hook(name if isinstance(name, str) else self._with_aliases(name), hook, dir)

    def run_with_cache(self, *model_args, return_cache_object: bool = True, remove_batch_dim: bool = False, **kwargs):
        names = self.cached_hook_names(kwargs.get("names_filter"))
        tokens = model_args[0] if model_args else kwargs.get("tokens")
        if isinstance(tokens, torch.Tensor) and tokens.ndim == 2:
            self.check_cache_size(names, *tokens.shape)
        if kwargs.get("names_filter") is None or self.hook_aliases:
            kwargs["names_filter"] = names  # aliases resolved to the hooks' own names; split inputs only when named
        with reuse_buffers(self.buffer_pool(), _device_of(self)):
            out, cache_dict = super().run_with_cache(*model_args, remove_batch_dim=remove_batch_dim, **kwargs)
        if self.hook_aliases:
            cache_dict = AliasedDict(cache_dict, self.hook_aliases)
        if not return_cache_object:
            return out, cache_dict
        return out, ActivationCache(cache_dict, self, has_batch_dim=not remove_batch_dim)

    def buffer_pool(self) -> BufferPool:
        """The tensors `run_with_cache` reuses across calls (`BufferPool`); `.clear()` frees them.
        Held beside the model, not in it: a copy, a pickle or a state dict of the model carries none."""
        pool = _POOLS.get(self)
        if pool is None:
            pool = _POOLS[self] = BufferPool()
        return pool

    def cached_hook_names(self, names_filter) -> list[str]:
        """The hook names `names_filter` selects (None: all but the split q/k/v inputs, which change the
        forward and hold a residual stream per head, `TransformerBlock`, unless `cfg.use_split_qkv_input`);
        a misspelt name is an error naming close matches, and a filter that selects nothing is refused
        rather than giving an empty cache."""
        import difflib

        every = list(self.hook_dict)
        if names_filter is None:
            if getattr(getattr(self, "cfg", None), "use_split_qkv_input", False):
                return every  # TransformerLens's switch: the split inputs are part of every cache
            return [name for name in every if not name.endswith(SPLIT_INPUTS)]
        if isinstance(names_filter, str):
            names_filter = [names_filter]
        if callable(names_filter):
            names_filter = self._with_aliases(names_filter)
            chosen = [name for name in every if names_filter(name)]
            if not chosen:
                raise ValueError(f"names_filter selects none of this model's {len(every)} hooks (e.g. {every[:3]}); "
                                 "check it, or pass a list of hook names.")
            return chosen
        chosen = list(dict.fromkeys(self.hook_aliases.get(name, name) for name in names_filter))
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
        if cfg is None or not all(hasattr(cfg, name) for name in ("n_heads", "d_head", "d_model")):
            return 0  # a root without our config: nothing to estimate from
        d_mlp = getattr(cfg, "d_mlp", None) or 4 * cfg.d_model
        per_token = {"q": cfg.n_heads * cfg.d_head, "k": cfg.n_heads * cfg.d_head, "v": cfg.n_heads * cfg.d_head,
                     "z": cfg.n_heads * cfg.d_head, "result": cfg.n_heads * cfg.d_model, "pre": d_mlp, "post": d_mlp,
                     "scale": 1, "q_input": cfg.n_heads * cfg.d_model,
                     "k_input": getattr(cfg, "n_kv_heads", cfg.n_heads) * cfg.d_model,
                     "v_input": getattr(cfg, "n_kv_heads", cfg.n_heads) * cfg.d_model, "attn_scores": cfg.n_heads * n_pos, "pattern": cfg.n_heads * n_pos}
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


def _device_of(module: nn.Module) -> torch.device:
    first = next(module.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def _available_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on `device` (None when it cannot be told)."""
    import os

    try:
        if device.type == "cuda":
            return torch.cuda.mem_get_info(device)[0]
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, RuntimeError, AttributeError):
        return None


M = TypeVar("M", bound=nn.Module)

if TYPE_CHECKING:
    class ModuleStack(nn.ModuleList, Generic[M]):
        """What the type checker sees of an `nn.ModuleList` whose items are all one module class
        (torch types every item as `Module`); at runtime it is `nn.ModuleList` itself."""

        def __init__(self, modules: Iterable[M] | None = None) -> None: ...
        @overload
        def __getitem__(self, idx: slice) -> ModuleStack[M]: ...
        @overload
        def __getitem__(self, idx: int) -> M: ...
        def __getitem__(self, idx: int | slice) -> M | ModuleStack[M]: ...
        def __iter__(self) -> Iterator[M]: ...
else:
    ModuleStack = nn.ModuleList


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
        # the bias added inside the product: one pass over the (batch, pos, d_vocab) logits, not two
        return F.linear(residual, self.W_U.T, self.b_U)  # (batch, pos, d_vocab)


class TiedUnembed(nn.Module):
    """The unembedding as the token embedding transposed (`cfg.tie_word_embeddings`): W_U reads `embed.W_E`,
    so the one tensor is held, saved and trained once (a second copy cost 113 MB on SmolLM2-135M)."""

    embed: Embed

    def __init__(self, cfg: GPTConfig, embed: Embed):
        super().__init__()
        object.__setattr__(self, "embed", embed)  # not a submodule: its W_E is saved once, as embed.W_E
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab))

    @property
    def W_U(self) -> torch.Tensor:
        """(d_model, d_vocab) a view of embed.W_E."""
        return self.embed.W_E.T

    def forward(self, residual: torch.Tensor) -> torch.Tensor:
        return F.linear(residual, self.embed.W_E, self.b_U)  # (batch, pos, d_vocab)


UNEMBED_CLASSES = (Unembed, TiedUnembed)  # our unembeddings: a linear map per position, by construction


def make_unembed(cfg: GPTConfig, embed: Embed) -> Unembed | TiedUnembed:
    """The model's unembedding: tied to `embed` when the config says so, else a W_U of its own."""
    return TiedUnembed(cfg, embed) if cfg.tie_word_embeddings else Unembed(cfg)


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
        self.act_fn = ACT_FNS[cfg.act_fn]
        self.hook_pre = HookPoint()  # (batch, pos, d_mlp)
        self.hook_post = HookPoint()  # (batch, pos, d_mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.hook_pre(F.linear(x, self.W_in.T, self.b_in))
        return F.linear(self.hook_post(self.act_fn(pre)), self.W_out.T, self.b_out)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACT_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu, "relu": F.relu, "silu": F.silu, "gelu_new": _gelu_tanh}


class GatedMLP(nn.Module):
    """SwiGLU-style MLP (Llama): out = (act(x W_gate + b_gate) * (x W_in + b_in)) W_out + b_out.

    `hook_pre` is the gate before the non-linearity, `hook_pre_linear` the linear branch,
    `hook_post` their product (TransformerLens's names)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_gate = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        self.act_fn = ACT_FNS[cfg.act_fn]
        self.hook_pre = HookPoint()  # (batch, pos, d_mlp)
        self.hook_pre_linear = HookPoint()  # (batch, pos, d_mlp)
        self.hook_post = HookPoint()  # (batch, pos, d_mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.linear adds each bias inside the matrix product (one pass over the d_mlp-wide
        # activations instead of two), as Hugging Face's nn.Linear layers do
        gate = self.hook_pre(F.linear(x, self.W_gate.T, self.b_gate))
        linear = self.hook_pre_linear(F.linear(x, self.W_in.T, self.b_in))
        return F.linear(self.hook_post(self.act_fn(gate) * linear), self.W_out.T, self.b_out)


class RMSNorm(nn.Module):
    """RMSNorm (Llama): x / sqrt(mean(x^2) + eps) * w, no centring and no bias; hooked like LayerNorm."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.eps = cfg.layer_norm_eps
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.hook_scale = HookPoint()  # (batch, pos, 1)
        self.hook_normalized = HookPoint()  # (batch, pos, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (hook_is_live(self.hook_scale) or hook_is_live(self.hook_normalized)):
            return F.rms_norm(x, (x.shape[-1],), self.w, self.eps)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale) * self.w


def make_norm(cfg: GPTConfig) -> LayerNorm | RMSNorm | nn.Identity:
    """The model's norm layer: LayerNorm, RMSNorm or none."""
    if cfg.normalization_type == "LN":
        return LayerNorm(cfg)
    if cfg.normalization_type == "RMS":
        return RMSNorm(cfg)
    return nn.Identity()


def make_mlp(cfg: GPTConfig) -> MLP | GatedMLP:
    return GatedMLP(cfg) if cfg.gated_mlp else MLP(cfg)


class TokenTypeEmbed(nn.Module):
    """Token-type (segment) embeddings, BERT's token_type_ids."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.W_token_type = nn.Parameter(torch.empty(cfg.n_token_types, cfg.d_model))

    def forward(self, token_type_ids: torch.Tensor) -> torch.Tensor:
        return self.W_token_type[token_type_ids]  # (batch, pos, d_model)


class MLMHead(nn.Module):
    """BERT's masked-LM transform before the unembedding: LayerNorm(act(resid W + b))."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.W = nn.Parameter(torch.empty(cfg.d_model, cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))
        self.act_fn = ACT_FNS[cfg.act_fn]
        self.ln = LayerNorm(cfg)

    def forward(self, resid: torch.Tensor) -> torch.Tensor:
        return self.ln(self.act_fn(resid @ self.W + self.b))  # (batch, pos, d_model)


def rotary_frequencies(rotary_dim: int, base: float) -> torch.Tensor:
    """Inverse frequencies (rotary_dim / 2,) of rotary embeddings, as GPT-NeoX and Llama compute them."""
    return 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)


def model_rotary_frequencies(cfg: GPTConfig) -> torch.Tensor:
    """The inverse frequencies a model's config asks for: plain, or Llama 3's NTK-by-parts scaling
    (low frequencies divided by the factor, high ones kept, a smooth blend between)."""
    inv_freq = rotary_frequencies(cfg.rotary_dim or cfg.d_head, cfg.rotary_base)
    if not cfg.use_NTK_by_parts_rope:
        return inv_freq
    factor, old_ctx = cfg.NTK_by_parts_factor, cfg.NTK_original_ctx_len
    low, high = cfg.NTK_by_parts_low_freq_factor, cfg.NTK_by_parts_high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > old_ctx / low, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < old_ctx / high) * ~(wavelength > old_ctx / low)
    return torch.where(medium, blended, scaled)


def rotary_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each (batch, 1, pos, rotary_dim), for position ids (batch, pos).

    Computed per call from the positions in use (never an (n_ctx, d_head) table, which for a
    converted model with a 128k context would cost gigabytes); each angle is one float product,
    the same number a precomputed table holds."""
    angles = positions.float().unsqueeze(-1) * inv_freq.float()  # (batch, pos, rotary_dim / 2): float32 in any dtype
    angles = einops.rearrange(torch.cat([angles, angles], dim=-1), "batch pos d_rot -> batch 1 pos d_rot")
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the leading rotary_dim dims of x (batch, head, pos, d_head) (GPT-NeoX convention:
    halves, not adjacent pairs); the remaining dims pass through (partial rotary). cos and sin (float32)
    are cast to x's dtype: a half-precision model stays in half precision."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    rotary_dim = cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        return torch.cat([apply_rotary(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]], dim=-1)
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return x * cos + rotated * sin


TO_POS = "batch head pos d_head -> batch pos head d_head"  # the layout hooks see
TO_HEAD = "batch pos head d_head -> batch head pos d_head"  # the layout matmuls use


class Attention(nn.Module):
    """Multi-head attention written out as in the lesson, with a hook at every step.

    The explicit path (scores, mask, softmax, pattern @ v) runs when a hook on q, k, v,
    attn_scores or pattern is live; otherwise `F.scaled_dot_product_attention` computes the
    same thing fused. Per-head results (d_model wide per head) are materialised only when
    `hook_result` is live.

    Grouped-query attention (`n_key_value_heads` < `n_heads`, Llama / Mistral / Qwen2): the
    model computes n_kv key and value heads, and query head h reads key/value head
    h // (n_heads // n_kv). `hook_k` / `hook_v` carry the n_kv heads as computed (an edit there
    reaches every query head of its group); attn_scores, pattern, z and result are per query
    head. The key/value weights are the parameters `_W_K`, `_W_V`, `_b_K`, `_b_V` (kv_head, ...);
    `W_K`, `W_V`, `b_K`, `b_V` are read-only expanded copies, one per query head, so
    `W_K[h]` is the key map query head h uses (write to `_W_K[h // group]` to change it).
    """

    # registered by name in __init__ (torch types such attributes as Tensor | Module): the key/value
    # parameters are W_K... without grouping and _W_K... with it; the buffer exists for rotary models only
    W_K: torch.Tensor
    W_V: torch.Tensor
    b_K: torch.Tensor
    b_V: torch.Tensor
    _W_K: torch.Tensor
    _W_V: torch.Tensor
    _b_K: torch.Tensor
    _b_V: torch.Tensor
    rotary_inv_freq: torch.Tensor

    def __init__(self, cfg: GPTConfig, causal: bool):
        super().__init__()
        self.cfg = cfg
        self.causal = causal
        n_heads, n_kv, d_model, d_head = cfg.n_heads, cfg.n_kv_heads, cfg.d_model, cfg.d_head
        self.n_kv_heads = n_kv
        self.group = n_heads // n_kv  # query heads per key/value head
        kv = "_" if self.group > 1 else ""  # grouped: the stored key/value weights are the kv heads
        self.W_Q = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.register_parameter(f"{kv}W_K", nn.Parameter(torch.empty(n_kv, d_model, d_head)))
        self.register_parameter(f"{kv}W_V", nn.Parameter(torch.empty(n_kv, d_model, d_head)))
        self.W_O = nn.Parameter(torch.empty(n_heads, d_head, d_model))
        self.b_Q = nn.Parameter(torch.zeros(n_heads, d_head))
        self.register_parameter(f"{kv}b_K", nn.Parameter(torch.zeros(n_kv, d_head)))
        self.register_parameter(f"{kv}b_V", nn.Parameter(torch.zeros(n_kv, d_head)))
        self.b_O = nn.Parameter(torch.zeros(d_model))
        self.scale = 1.0 / math.sqrt(d_head)
        if cfg.positional_embedding_type == "rotary":
            self.register_buffer("rotary_inv_freq", model_rotary_frequencies(cfg), persistent=False)
        self.hook_q = HookPoint()  # (batch, pos, head, d_head)
        self.hook_k = HookPoint()  # (batch, pos, kv_head, d_head); query head h reads kv head h // group
        self.hook_v = HookPoint()  # (batch, pos, kv_head, d_head); query head h reads kv head h // group
        self.hook_attn_scores = HookPoint()  # (batch, head, query, key)
        self.hook_pattern = HookPoint()  # (batch, head, query, key)
        self.hook_z = HookPoint()  # (batch, pos, head, d_head)
        self.hook_result = HookPoint()  # (batch, pos, head, d_model)
        # split inputs (TransformerLens 4's names: `TransformerBlock.attention` feeds them, see there)
        self.hook_q_input = HookPoint()  # (batch, pos, head, d_model)
        self.hook_k_input = HookPoint()  # (batch, pos, kv_head, d_model)
        self.hook_v_input = HookPoint()  # (batch, pos, kv_head, d_model)

    def head_write(self, head: int, z: torch.Tensor) -> torch.Tensor:
        """One head's write to the residual stream, z (batch, pos, d_head) -> (batch, pos, d_model):
        `hook_result[:, :, head]` for that z; the heads' writes plus `b_O` sum to the attention output."""
        return einops.einsum(z, self.W_O[head], "batch pos d_head, d_head d_model -> batch pos d_model")

    def kv_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The stored key/value weights and biases, one per key/value head."""
        if self.group > 1:
            return self._W_K, self._W_V, self._b_K, self._b_V
        return self.W_K, self.W_V, self.b_K, self.b_V

    def explicit_needed(self) -> bool:
        watched = (self.hook_q, self.hook_k, self.hook_v, self.hook_attn_scores, self.hook_pattern)
        return any(hook_is_live(h) for h in watched)

    def mask(self, n_pos: int, key_mask: torch.Tensor | None, device=None) -> torch.Tensor | None:
        """Boolean mask, True where a query may attend to a key; broadcasts to (batch, head, query, key).

        The sliding window counts sequence indices (padding included), as Hugging Face does."""
        allowed = None
        if self.causal:
            allowed = torch.ones(n_pos, n_pos, dtype=torch.bool, device=device).tril()
        window = self.cfg.window_size
        if window is not None and n_pos > window:
            recent = torch.ones(n_pos, n_pos, dtype=torch.bool, device=device).triu(1 - window)
            allowed = recent if allowed is None else allowed & recent
        if key_mask is not None:
            keys = einops.rearrange(key_mask.bool(), "batch key -> batch 1 1 key")
            allowed = keys if allowed is None else allowed & keys
        return allowed

    def forward(
        self, x: torch.Tensor, key_mask: torch.Tensor | None = None, positions: torch.Tensor | None = None, *,
        k_input: torch.Tensor | None = None, v_input: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (batch, pos, d_model); key_mask: (batch, pos), 1 for real tokens, 0 for padding;
        positions: (batch, pos) position ids, used by rotary embeddings.

        Split inputs (`hook_q_input`..., fed by `TransformerBlock.attention`): with `k_input` and `v_input`
        given, x is each query head's own input (batch, pos, head, d_model) and k_input / v_input each
        key / value head's (batch, pos, kv_head, d_model), all normalised."""
        if k_input is None or v_input is None:
            q, k, v = self.project_qkv(x, positions)  # q (batch, head, pos, d_head); k, v (batch, kv_head, pos, d_head)
        else:
            q, k, v = self.project_split(x, k_input, v_input, positions)
        if self.explicit_needed():
            z = self.explicit_z(q, k, v, key_mask)
        else:
            z = self.fused_z(q, k, v, key_mask)
        # z: (batch, head, pos, d_head)
        if not (hook_is_live(self.hook_z) or hook_is_live(self.hook_result)):
            return einops.einsum(z, self.W_O, "batch head pos d_head, head d_head d_model -> batch pos d_model") + self.b_O
        z = einops.rearrange(self.hook_z(einops.rearrange(z, TO_POS)), TO_HEAD)
        if not hook_is_live(self.hook_result):
            return einops.einsum(z, self.W_O, "batch head pos d_head, head d_head d_model -> batch pos d_model") + self.b_O
        batch, n_heads, n_pos, _ = z.shape
        out = pooled(self, "result", (batch, n_heads, n_pos, self.cfg.d_model), z)
        result = self.hook_result(einops.rearrange(torch.matmul(z, self.W_O, out=out), TO_POS))  # (batch, pos, head, d_model)
        return result.sum(dim=2) + self.b_O

    def fused_z(self, q, k, v, key_mask) -> torch.Tensor:
        """z through `F.scaled_dot_product_attention` (no hook can see its inside)."""
        # enable_gqa only when grouped (torch 2.4 lacks it); Any: typeshed cannot match a **dict to one keyword
        grouped: dict[str, Any] = {"enable_gqa": True} if self.group > 1 else {}
        n_pos = q.shape[2]
        windowed = self.cfg.window_size is not None and n_pos > self.cfg.window_size
        if key_mask is None and not windowed:
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, **grouped)
        allowed = self.mask(n_pos, key_mask, q.device)
        assert allowed is not None  # a key mask or a window applies, so mask() returns one
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, **grouped)
        # a query whose every key is padding attends to nothing (the kernel gives NaN there)
        return z.masked_fill(~allowed.any(-1, keepdim=True), 0.0)

    def project_qkv(self, x: torch.Tensor, positions: torch.Tensor | None):
        """q (batch, head, pos, d_head), k and v (batch, kv_head, pos, d_head) through one fused
        projection; rotary applied to q and k."""
        W_K, W_V, b_K, b_V = self.kv_weights()
        w_qkv = torch.cat([self.W_Q, W_K, W_V])  # (head + 2 * kv_head, d_model, d_head)
        b_qkv = einops.rearrange(torch.cat([self.b_Q, b_K, b_V]), "head d_head -> head 1 d_head")
        batch, n_pos, d_model = x.shape
        watched = any(hook_is_live(hook) for hook in (self.hook_q, self.hook_k, self.hook_v))  # their views of it
        out = pooled(self, "qkv", (batch, n_pos, w_qkv.shape[0] * w_qkv.shape[2]), x, watched=watched)
        if out is None:
            qkv = einops.einsum(x, w_qkv, "batch pos d_model, head d_model d_head -> batch head pos d_head")
        else:  # the matmul einsum makes, into the pool's tensor; the same layout (batch, pos, head, d_head) below
            torch.matmul(x, einops.rearrange(w_qkv, "head d_model d_head -> d_model (head d_head)"), out=out)
            qkv = einops.rearrange(out, "batch pos (head d_head) -> batch head pos d_head", head=w_qkv.shape[0])
        qkv += b_qkv  # in place: one large tensor fewer per layer (the matmul's backward needs no output)
        q, k, v = qkv.split([self.cfg.n_heads, self.n_kv_heads, self.n_kv_heads], dim=1)
        return (*self.rotate(q, k, positions), v)

    def project_split(self, q_input: torch.Tensor, k_input: torch.Tensor, v_input: torch.Tensor,
                      positions: torch.Tensor | None):
        """`project_qkv` from per-head inputs: q_input (batch, pos, head, d_model), k_input and v_input
        (batch, pos, kv_head, d_model); head h's query reads only q_input[:, :, h] (path patching)."""
        W_K, W_V, b_K, b_V = self.kv_weights()

        def project(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            out = einops.einsum(x, W, "batch pos head d_model, head d_model d_head -> batch head pos d_head")
            return out + einops.rearrange(b, "head d_head -> head 1 d_head")

        q, k = self.rotate(project(q_input, self.W_Q, self.b_Q), project(k_input, W_K, b_K), positions)
        return q, k, project(v_input, W_V, b_V)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor | None):
        """q and k (batch, head, pos, d_head) with rotary embeddings applied (unchanged without them)."""
        if self.cfg.positional_embedding_type != "rotary":
            return q, k
        if positions is None:
            positions = torch.arange(q.shape[2], device=q.device).expand(q.shape[0], q.shape[2])
        cos, sin = rotary_angles(positions, self.rotary_inv_freq)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def per_query_head(self, kv: torch.Tensor) -> torch.Tensor:
        """Key or value heads (batch, kv_head, pos, d_head) repeated to one per query head."""
        return kv if self.group == 1 else kv.repeat_interleave(self.group, dim=1)

    def explicit_z(self, q, k, v, key_mask) -> torch.Tensor:
        """The lesson's steps, each hooked. Hooks see q, k, v as (batch, pos, head, d_head) views,
        and whatever a hook returns is what the next step uses."""
        q = einops.rearrange(self.hook_q(einops.rearrange(q, TO_POS)), TO_HEAD)
        k = self.per_query_head(einops.rearrange(self.hook_k(einops.rearrange(k, TO_POS)), TO_HEAD))
        v = self.per_query_head(einops.rearrange(self.hook_v(einops.rearrange(v, TO_POS)), TO_HEAD))
        batch, n_heads, n_pos, d_head = q.shape
        square = (batch, n_heads, n_pos, k.shape[2])  # (batch, head, query, key)
        # the matmul's own output is scaled and masked in place (its backward needs q and k only); inside
        # `reuse_buffers`, the scores, pattern and z land in the pool's tensors: the same kernels, the same numbers
        scores = torch.matmul(q, k.transpose(-1, -2),
                              out=pooled(self, "attn_scores", square, q, watched=hook_is_live(self.hook_attn_scores)))
        scores *= self.scale
        allowed = self.mask(q.shape[2], key_mask, q.device)
        if allowed is not None:
            scores.masked_fill_(~allowed, float("-inf"))
        scores = self.hook_attn_scores(scores)
        out = pooled(self, "pattern", tuple(scores.shape), scores, watched=hook_is_live(self.hook_pattern))
        pattern = torch.softmax(scores, dim=-1) if out is None else torch.ops.aten._softmax.out(scores, -1, False, out=out)
        if key_mask is not None:
            assert allowed is not None  # mask() always masks when given a key mask
            # a query whose every key is padding attends to nothing, rather than to NaN (in place only
            # on a pool's tensor: softmax's backward needs its output)
            empty_rows = ~allowed.any(-1, keepdim=True)
            pattern = pattern.masked_fill(empty_rows, 0.0) if out is None else pattern.masked_fill_(empty_rows, 0.0)
        pattern = self.hook_pattern(pattern)
        watched = hook_is_live(self.hook_z) or hook_is_live(self.hook_result)
        z_out = pooled(self, "z", (batch, n_heads, n_pos, v.shape[-1]), v, watched=watched)
        return torch.matmul(pattern, v, out=z_out)  # (batch, head, query, d_head)


class GroupedQueryAttention(Attention):
    """`Attention` with fewer key/value heads than query heads (see `Attention`): the stored
    weights are `_W_K`, `_W_V`, `_b_K`, `_b_V`; `W_K` etc. are per-query-head expanded copies."""

    def _expanded(self, stored: torch.Tensor) -> torch.Tensor:
        return stored.repeat_interleave(self.group, dim=0)  # (head, ...): row h is kv head h // group

    # read-only views over the kv-head parameters, where Attention registers W_K... as parameters;
    # assigning W_K on a grouped model is refused at runtime too
    @property
    def W_K(self) -> torch.Tensor:  # type: ignore[override]
        return self._expanded(self._W_K)

    @property
    def W_V(self) -> torch.Tensor:  # type: ignore[override]
        return self._expanded(self._W_V)

    @property
    def b_K(self) -> torch.Tensor:  # type: ignore[override]
        return self._expanded(self._b_K)

    @property
    def b_V(self) -> torch.Tensor:  # type: ignore[override]
        return self._expanded(self._b_V)


def make_attention(cfg: GPTConfig, causal: bool) -> Attention:
    return GroupedQueryAttention(cfg, causal) if cfg.n_kv_heads < cfg.n_heads else Attention(cfg, causal)


class TransformerBlock(nn.Module):
    """One block. Pre-norm (default): resid + attn(ln1(resid)), then + mlp(ln2(resid)).
    `parallel_attn_mlp` (GPT-NeoX): resid + attn(ln1(resid)) + mlp(ln2(resid)), no resid_mid.
    `post_norm` (BERT): resid_mid = resid + attn(resid); resid_post = ln2(ln1(resid_mid) + mlp(ln1(resid_mid))),
    as TransformerLens's BERT block hooks it (hook_resid_mid before ln1).
    Attention-only blocks keep `hook_mlp_out`, and it fires (zeros: there is no MLP) whenever it is
    watched, so TransformerLens's sweeps over mlp_out (`patching.get_act_patch_block_every`) run there too.

    Split inputs (TransformerLens 4's names, for path patching): `attn.hook_q_input`, `attn.hook_k_input`,
    `attn.hook_v_input` (batch, pos, head, d_model; kv heads for k and v; `blocks.{l}.hook_q_input`... are
    aliases, as in TransformerLens's bridge) carry the residual stream each head's query, key or value
    reads, before the norm, one copy per head. They fire only when watched: then ln1 runs once per branch
    (its hooks fire three times, with a head axis) and each head projects its own copy; otherwise the
    block is unchanged. `run_with_cache` caches them only when named (or `cfg.use_split_qkv_input`).
    `hook_mlp_in` is the residual stream the MLP reads (pre-norm: before ln2); attention-only blocks keep
    it as they keep `hook_mlp_out`: watched, the absent MLP reads it and writes zeros."""

    # TransformerLens's logit lens reads hook_resid_post as the one residual stream the next block gets
    hook_out_is_single_residual_stream = True

    def __init__(self, cfg: GPTConfig, causal: bool):
        super().__init__()
        self.cfg = cfg
        self.ln1 = make_norm(cfg)
        self.attn = make_attention(cfg, causal=causal)
        if not cfg.attn_only:
            self.ln2 = make_norm(cfg)
            self.mlp = make_mlp(cfg)
        self.hook_resid_pre = HookPoint()  # (batch, pos, d_model)
        self.hook_attn_out = HookPoint()  # (batch, pos, d_model)
        if not cfg.parallel_attn_mlp:
            self.hook_resid_mid = HookPoint()  # (batch, pos, d_model)
        self.hook_mlp_out = HookPoint()  # (batch, pos, d_model)
        self.hook_resid_post = HookPoint()  # (batch, pos, d_model)
        self.hook_mlp_in = HookPoint()  # (batch, pos, d_model)

    # the split inputs live on the attention (TransformerLens 4's names); `block.hook_q_input` reads them too
    hook_q_input = property(lambda self: self.attn.hook_q_input)
    hook_k_input = property(lambda self: self.attn.hook_k_input)
    hook_v_input = property(lambda self: self.attn.hook_v_input)

    def split_inputs_live(self) -> bool:
        return any(hook_is_live(h) for h in (self.attn.hook_q_input, self.attn.hook_k_input, self.attn.hook_v_input))

    def no_mlp(self, resid: torch.Tensor) -> torch.Tensor:
        """An attention-only block's MLP output, zeros (batch, pos, d_model) through hook_mlp_in and
        hook_mlp_out when either is watched: computed from hook_mlp_in rather than made anew, so a gradient
        (zero) reaches hook_mlp_in and one reaches hook_mlp_out (TransformerLens's attribution patching reads
        both); nan_to_num keeps them zeros where the stream is not finite (inf * 0)."""
        return self.hook_mlp_out(torch.nan_to_num(self.hook_mlp_in(resid) * 0, nan=0.0))

    def mlp_watched(self) -> bool:
        return hook_is_live(self.hook_mlp_out) or hook_is_live(self.hook_mlp_in)

    def attention(self, resid: torch.Tensor, key_mask, positions, norm: Callable[[torch.Tensor], torch.Tensor]):
        """The attention output for `resid` (batch, pos, d_model) read through `norm`; per-head split
        inputs when one of them is watched (see the class)."""
        if not self.split_inputs_live():
            return self.attn(norm(resid), key_mask, positions)
        n_kv = self.attn.n_kv_heads

        def split(hook: HookPoint, n: int) -> torch.Tensor:  # (batch, pos, head, d_model), its own memory
            return norm(hook(einops.repeat(resid, "batch pos d_model -> batch pos head d_model", head=n).contiguous()))

        return self.attn(split(self.attn.hook_q_input, self.cfg.n_heads), key_mask, positions,
                         k_input=split(self.attn.hook_k_input, n_kv), v_input=split(self.attn.hook_v_input, n_kv))

    def forward(
        self, resid: torch.Tensor, key_mask: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        resid = self.hook_resid_pre(resid)
        if self.cfg.post_norm:
            return self.post_norm_forward(resid, key_mask, positions)
        attn_out = self.hook_attn_out(self.attention(resid, key_mask, positions, self.ln1))
        if self.cfg.parallel_attn_mlp:
            return self.hook_resid_post(resid + attn_out + self.hook_mlp_out(self.mlp(self.ln2(self.hook_mlp_in(resid)))))
        return self.after_attention(self.hook_resid_mid(resid + attn_out))

    @property
    def resumes_after_attention(self) -> bool:
        """Whether `after_attention(resid_mid)` finishes this block: sequential pre-norm blocks only
        (a parallel block's MLP reads resid_pre; a post-norm block normalises resid_mid first)."""
        return not (self.cfg.post_norm or self.cfg.parallel_attn_mlp)

    def after_attention(self, resid: torch.Tensor) -> torch.Tensor:
        """The rest of a sequential pre-norm block from `hook_resid_mid` (batch, pos, d_model) to
        `hook_resid_post`: what resuming a forward after an edit of this layer's attention runs."""
        if not self.cfg.attn_only:
            resid = resid + self.hook_mlp_out(self.mlp(self.ln2(self.hook_mlp_in(resid))))
        elif self.mlp_watched():
            resid = resid + self.no_mlp(resid)
        return self.hook_resid_post(resid)

    def post_norm_forward(self, resid: torch.Tensor, key_mask, positions) -> torch.Tensor:
        attn_out = self.hook_attn_out(self.attention(resid, key_mask, positions, _unnormed))
        resid = self.ln1(self.hook_resid_mid(resid + attn_out))
        if not self.cfg.attn_only:
            resid = self.ln2(resid + self.hook_mlp_out(self.mlp(self.hook_mlp_in(resid))))
        elif self.mlp_watched():
            resid = resid + self.no_mlp(resid)
        return self.hook_resid_post(resid)


def _unnormed(x: torch.Tensor) -> torch.Tensor:
    return x  # a post-norm block's attention reads the residual stream as it is


SPLIT_INPUTS = ("hook_q_input", "hook_k_input", "hook_v_input")


def init_weights(model: nn.Module, cfg: GPTConfig) -> None:
    """Normal(0, init_range) for matrices, zeros for biases, ones for norm gains; seeded."""
    first = next(model.parameters(), None)
    if first is not None and first.is_meta:
        return  # built on the meta device to be filled by a converter: nothing to draw
    generator = torch.Generator().manual_seed(cfg.seed) if cfg.seed is not None else None
    for name, param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1].lstrip("_")  # grouped-query key/value weights are `_W_K`, `_W_V`
        with torch.no_grad():
            if leaf.startswith("W_") or leaf == "W":
                param.copy_(torch.randn(param.shape, generator=generator) * cfg.init_range)
            elif leaf == "w":
                param.fill_(1.0)
            else:
                param.zero_()
