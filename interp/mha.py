"""Hook any model built on `torch.nn.MultiheadAttention`, without changing what it computes.

`hook_attention(model)` swaps every `nn.MultiheadAttention` inside `model` for a
`HookedMultiheadAttention` that shares the same parameters (same objects, same state-dict
keys) and exposes the toolkit's per-head hooks under module-path names, e.g.
`layers.0.self_attn.hook_pattern`:

- `hook_q`, `hook_k`, `hook_v`: (batch, pos, head, d_head), after the input projections;
- `hook_attn_scores`: (batch, head, query, key), q k^T / sqrt(d_head) plus the masks, masked
  entries -inf, before softmax;
- `hook_pattern`: (batch, head, query, key), softmax of the scores (before attention dropout);
- `hook_z`: (batch, pos, head, d_head), pattern @ v;
- `hook_result`: (batch, pos, head, d_model), each head's slice of `out_proj` applied to its z;
  the heads sum, plus `out_proj.bias`, to the module's output.

Design: the model itself becomes the hook root. Its class is swapped for a subclass that
also inherits `transformer_lens.HookedRootModule` (`isinstance(model, OriginalClass)` stays
true, `state_dict` keys do not change), so `model.hook_dict`, `run_with_hooks`,
`run_with_cache`, `hooks()` and every toolkit function work on it directly, with hook names
that are the module paths the user already knows. A wrapper object around the model would
have prefixed every name ("model.layers.0...") and hidden the user's own attributes.
`unhook_attention(model)` puts the original modules and class back. The swapped class is made
at run time, so `torch.save(model)` (pickling the whole object) fails while hooked: save the
state dict (its keys are unchanged), or unhook first. `copy.deepcopy` works.

Masks are honoured as `nn.MultiheadAttention` honours them: `attn_mask` (bool, True = not
allowed, or float, added), `key_padding_mask` (bool, True = padding, or float), the
`is_causal` hint (which, as in torch, needs the mask too), `need_weights` and
`average_attn_weights`, `batch_first` either way, unbatched inputs, `kdim`/`vdim`,
`add_bias_kv` and `add_zero_attn` (their extra key appears as a last key position in
k, v, scores and pattern).

Fast paths: with no hook on q, k, v, scores or pattern live and `need_weights=False`, the
module runs `F.scaled_dot_product_attention`. `nn.TransformerEncoderLayer` bypasses its
attention module entirely in eval mode (`torch._transformer_encoder_layer_fwd`) but turns
that off by itself whenever a forward hook is attached below it, i.e. whenever someone is
watching; `nn.TransformerEncoder`'s nested-tensor path (taken with a padding mask in eval
mode) is switched off while hooked, so padded output positions are no longer zero-filled
(real positions are unchanged).
"""
from __future__ import annotations

import math
from typing import Any, cast

import einops
import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from interp.models.components import CachingRoot, hook_is_live
from interp.models.tokenizers import TokenMethods
from interp.sites import ROLES, AttentionSite

_EXPLICIT_ROLES = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern")
# attributes of nn.MultiheadAttention that code outside it reads (torch's own layers included)
_COPIED_ATTRIBUTES = (
    "embed_dim", "kdim", "vdim", "_qkv_same_embed_dim", "num_heads", "dropout", "batch_first",
    "head_dim", "add_zero_attn",
)


def _additive(mask: torch.Tensor | None, dtype: torch.dtype, name: str) -> torch.Tensor | None:
    """A bool mask (True = not allowed) or float mask as an additive float mask (-inf where masked)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))
    if not torch.is_floating_point(mask):
        raise TypeError(f"{name} must be a bool or float tensor, got dtype {mask.dtype}; use mask.bool().")
    return mask.to(dtype)


class HookedMultiheadAttention(HookedRootModule):
    """`nn.MultiheadAttention` with per-head hooks; shares the wrapped module's parameters.

    Build it with `HookedMultiheadAttention(mha)`; `.original` gives the wrapped module back.
    It is a `HookedRootModule` itself, so a bare attention module (the lesson's example) can be
    hooked and cached on its own.
    """

    # declared for the type checker (nn.Module types an unknown attribute as Tensor | Module);
    # set in __init__ from the wrapped module (_COPIED_ATTRIBUTES and its parameters)
    _original: nn.MultiheadAttention
    embed_dim: int
    kdim: int
    vdim: int
    _qkv_same_embed_dim: bool
    num_heads: int
    dropout: float
    batch_first: bool
    head_dim: int
    add_zero_attn: bool
    in_proj_weight: nn.Parameter | None
    q_proj_weight: nn.Parameter | None
    k_proj_weight: nn.Parameter | None
    v_proj_weight: nn.Parameter | None
    in_proj_bias: nn.Parameter | None
    bias_k: nn.Parameter | None
    bias_v: nn.Parameter | None
    out_proj: nn.Linear
    observed_causal: bool  # set by observe_causality; absent until it has run

    def __init__(self, original: nn.MultiheadAttention):
        super().__init__()
        if not isinstance(original, nn.MultiheadAttention):
            raise TypeError(f"HookedMultiheadAttention wraps an nn.MultiheadAttention, got {type(original).__name__}.")
        # kept outside the module tree: its parameters are registered below under their own names
        object.__setattr__(self, "_original", original)
        for name in _COPIED_ATTRIBUTES:
            setattr(self, name, getattr(original, name))
        # the same Parameter objects under the same names: the state dict is unchanged
        for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "bias_k", "bias_v"):
            param = getattr(original, name, None)
            if isinstance(param, nn.Parameter) or param is None:
                self.register_parameter(name, param)
            else:
                setattr(self, name, param)
        self.out_proj = original.out_proj
        self.train(original.training)
        self.hook_q = HookPoint()  # (batch, pos, head, d_head)
        self.hook_k = HookPoint()  # (batch, pos, head, d_head)
        self.hook_v = HookPoint()  # (batch, pos, head, d_head)
        self.hook_attn_scores = HookPoint()  # (batch, head, query, key)
        self.hook_pattern = HookPoint()  # (batch, head, query, key)
        self.hook_z = HookPoint()  # (batch, pos, head, d_head)
        self.hook_result = HookPoint()  # (batch, pos, head, d_model)
        self.setup()

    def reset_parameters(self) -> None:
        """Re-initialise the shared parameters as nn.MultiheadAttention does (`_reset_parameters`: Xavier-uniform
        input projections, zero biases); the random-init control's copy of a user's model uses it."""
        nn.MultiheadAttention._reset_parameters(cast(nn.MultiheadAttention, self))

    @property
    def original(self) -> nn.MultiheadAttention:
        return self._original

    # torch's TransformerEncoderLayer fast path calls this on its attention module
    merge_masks = nn.MultiheadAttention.merge_masks

    def explicit_needed(self) -> bool:
        return any(hook_is_live(getattr(self, name)) for name in _EXPLICIT_ROLES)

    def in_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The query, key and value input projection matrices, each (embed_dim, its input dim): the
        packed `in_proj_weight`'s thirds, or the separate ones when kdim / vdim differ from embed_dim."""
        if self._qkv_same_embed_dim:
            assert self.in_proj_weight is not None  # nn.MultiheadAttention packs q, k, v when their dims agree
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
            return w_q, w_k, w_v
        assert self.q_proj_weight is not None and self.k_proj_weight is not None and self.v_proj_weight is not None
        return self.q_proj_weight, self.k_proj_weight, self.v_proj_weight

    def _project(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
        """Input projections, each (batch, pos, embed_dim)."""
        w_q, w_k, w_v = self.in_weights()
        b_q = b_k = b_v = None
        if self.in_proj_bias is not None:
            b_q, b_k, b_v = self.in_proj_bias.chunk(3)
        return F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Same signature and return values as `nn.MultiheadAttention.forward`.

        Stages: inputs to (batch, pos, d) layout, per-head q/k/v, one additive mask, attention
        (explicit through the hooks when one is live or weights are asked for, else the fused
        kernel), the output projection per head, and the caller's layout back."""
        if query.is_nested:
            raise ValueError(
                "HookedMultiheadAttention got a nested tensor; per-head hooks need padded tensors. "
                "Pass a padded batch with key_padding_mask instead."
            )
        batched = query.dim() == 3
        query, key, value, key_padding_mask = self._batch_first(query, key, value, key_padding_mask)
        if is_causal and attn_mask is None:
            raise RuntimeError(
                "Need attn_mask if specifying the is_causal hint (as nn.MultiheadAttention does); "
                "build one with nn.Transformer.generate_square_subsequent_mask(n_pos)."
            )
        q, k, v = self._heads(query, key, value)  # (batch, pos, head, d_head)
        mask = self._merged_mask(attn_mask, key_padding_mask, dtype=q.dtype, n_key=k.shape[1])
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if self.explicit_needed() or need_weights:
            z, weights = self._explicit_attention(q, k, v, mask, dropout_p)
        else:
            # is_causal aligns the mask top-left: right only when keys and queries correspond one to one
            causal_only = is_causal and key_padding_mask is None and k.shape[1] == q.shape[1]
            z = self._fused_attention(q, k, v, mask, dropout_p=dropout_p, causal_only=causal_only)
        out = self._output(self.hook_z(z))  # (batch, pos, d_model)
        if need_weights and average_attn_weights:
            assert weights is not None  # need_weights took the explicit path
            weights = weights.mean(dim=1)  # (batch, query, key)
        if not batched:
            out = out.squeeze(0)
            weights = weights.squeeze(0) if weights is not None else None
        elif not self.batch_first:
            out = einops.rearrange(out, "batch pos d -> pos batch d")
        return out, (weights if need_weights else None)

    def _batch_first(self, query, key, value, key_padding_mask):
        """Unbatched (pos, d) inputs get a batch of one; (pos, batch, d) inputs become (batch, pos, d)."""
        if query.dim() != 3:  # unbatched (pos, embed_dim) inputs
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = (einops.rearrange(t, "pos batch d -> batch pos d") for t in (query, key, value))
        return query, key, value, key_padding_mask

    def _heads(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
        """q, k, v split into heads, each (batch, pos, head, d_head); k and v gain the bias_k / bias_v
        and zero-attention keys where the module has them."""
        batch, n_heads, d_head = query.shape[0], self.num_heads, self.head_dim
        q, k, v = self._project(query, key, value)  # (batch, pos, embed_dim)
        if self.bias_k is not None and self.bias_v is not None:  # add_bias_kv sets both
            k = torch.cat([k, self.bias_k.reshape(1, 1, -1).expand(batch, 1, -1)], dim=1)
            v = torch.cat([v, self.bias_v.reshape(1, 1, -1).expand(batch, 1, -1)], dim=1)
        q = einops.rearrange(q, "batch pos (head d_head) -> batch pos head d_head", head=n_heads)
        k = einops.rearrange(k, "batch pos (head d_head) -> batch pos head d_head", head=n_heads)
        v = einops.rearrange(v, "batch pos (head d_head) -> batch pos head d_head", head=n_heads)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(batch, 1, n_heads, d_head)], dim=1)
            v = torch.cat([v, v.new_zeros(batch, 1, n_heads, d_head)], dim=1)
        return q, k, v

    def _merged_mask(self, attn_mask, key_padding_mask, *, dtype: torch.dtype, n_key: int) -> torch.Tensor | None:
        """One additive mask broadcasting to (batch, head, query, key), as torch merges them."""
        mask = _additive(attn_mask, dtype, "attn_mask")
        if mask is not None:
            if mask.dim() == 2:
                mask = einops.rearrange(mask, "query key -> 1 1 query key")
            else:
                mask = einops.rearrange(mask, "(batch head) query key -> batch head query key", head=self.num_heads)
        padding = _additive(key_padding_mask, dtype, "key_padding_mask")
        if padding is not None:
            padding = einops.rearrange(padding, "batch key -> batch 1 1 key")
            mask = padding if mask is None else mask + padding
        if mask is not None and mask.shape[-1] < n_key:  # the bias_kv / zero-attention key is never masked
            mask = F.pad(mask, (0, n_key - mask.shape[-1]))
        return mask

    def _explicit_attention(self, q, k, v, mask, dropout_p: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores, mask, softmax and weights @ values, each step through its hook: z (batch, pos, head,
        d_head) and the weights (batch, head, query, key) after dropout."""
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        scores = einops.einsum(
            q, k, "batch query head d_head, batch key head d_head -> batch head query key"
        ) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        scores = self.hook_attn_scores(scores)
        pattern = self.hook_pattern(torch.softmax(scores, dim=-1))
        weights = F.dropout(pattern, p=dropout_p) if dropout_p > 0 else pattern
        z = einops.einsum(weights, v, "batch head query key, batch key head d_head -> batch query head d_head")
        return z, weights

    def _fused_attention(self, q, k, v, mask, *, dropout_p: float, causal_only: bool) -> torch.Tensor:
        """The fused kernel, when no hook needs the scores: z (batch, pos, head, d_head)."""
        fused = F.scaled_dot_product_attention(
            einops.rearrange(q, "batch pos head d_head -> batch head pos d_head"),
            einops.rearrange(k, "batch pos head d_head -> batch head pos d_head"),
            einops.rearrange(v, "batch pos head d_head -> batch head pos d_head"),
            attn_mask=None if causal_only else mask,
            dropout_p=dropout_p,
            is_causal=causal_only,
        )
        return einops.rearrange(fused, "batch head pos d_head -> batch pos head d_head")

    def _output(self, z: torch.Tensor) -> torch.Tensor:
        """out_proj applied per head (each head's write through hook_result when it is live): (batch, pos, d_model)."""
        w_o = einops.rearrange(self.out_proj.weight, "d_model (head d_head) -> head d_head d_model", head=self.num_heads)
        if hook_is_live(self.hook_result):
            result = self.hook_result(einops.einsum(
                z, w_o, "batch pos head d_head, head d_head d_model -> batch pos head d_model"
            ))
            out = result.sum(dim=2)
        else:
            out = einops.einsum(z, w_o, "batch pos head d_head, head d_head d_model -> batch pos d_model")
        if self.out_proj.bias is not None:
            out = out + self.out_proj.bias  # (batch, pos, d_model)
        return out


class AttentionHookedModel(TokenMethods, CachingRoot):
    """Mixin given to a user's model by `hook_attention` and `hook_sdpa`: makes it a TransformerLens hook root,
    with TransformerLens's model surface where interception can give it (`interp.tl_surface`: `cfg`, the token
    methods over `model.tokenizer`, stacked weights and logit attributions on a nanoGPT / minGPT layout).

    Never instantiated directly; `hook_attention` swaps a model's class for
    `type(name, (OriginalClass, AttentionHookedModel), {})`. The user's own attributes and methods come first.
    """

    _interp_original_class: type

    def setup(self) -> None:
        """Index the hook points by module path (and, unlike TransformerLens, leave the names of
        the user's own modules alone)."""
        import interp.tl_surface as tl_surface

        self.mod_dict, self.hook_dict = {}, {}
        for name, module in self.named_modules():
            if name and isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module
                self.mod_dict[name] = module
        self.set_hook_aliases({**canonical_aliases(self.hook_dict, self._attention_paths()), **tl_surface.aliases(self)})

    def __getattr__(self, name: str) -> Any:
        """nn.Module's lookup (parameters, buffers, submodules), then TransformerLens's stacked weights
        (`interp.tl_surface.weight`: an AttributeError saying why where the model has none)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            import interp.tl_surface as tl_surface

            if name in tl_surface.WEIGHT_NAMES:
                return tl_surface.weight(self, name)
            raise

    def tokens_to_residual_directions(self, tokens: Any) -> torch.Tensor:
        """TransformerLens's method (`cache.logit_attrs` calls it): on a nanoGPT / minGPT layout only."""
        import interp.tl_surface as tl_surface

        return tl_surface.residual_directions(self, tokens)

    def _pads_right_safely(self) -> bool:
        """Right padding leaves the real positions as they are when every attention the probe saw was causal."""
        sites = self.__dict__.get("_interp_sdpa_sites") or {}
        return bool(sites) and all(site.causal is True for site in sites.values())

    def _attention_paths(self) -> list[str]:
        """Module path of each hooked attention layer, in layer order (the order `attention_sites` gives)."""
        sdpa_sites = self.__dict__.get("_interp_sdpa_sites")  # set by interp.hook_sdpa before it calls setup
        if sdpa_sites is not None:
            return [site.path for site in sdpa_sites.values()]
        return [name for name, module in self.named_modules() if isinstance(module, HookedMultiheadAttention)]


def canonical_aliases(hook_dict: dict[str, HookPoint], attention_paths: list[str]) -> dict[str, str]:
    """TransformerLens's names for the attention hooks of layer i (`blocks.{i}.attn.hook_pattern`, ...) ->
    this model's own (`enc.layers.{i}.self_attn.hook_pattern`); a name the model already has is left to it."""
    aliases = {}
    for layer, path in enumerate(attention_paths):
        for role in ROLES:
            own = f"{path}.hook_{role}" if path else f"hook_{role}"
            alias = f"blocks.{layer}.attn.hook_{role}"
            if own in hook_dict and alias not in hook_dict:
                aliases[alias] = own
    return aliases


_HOOKED_CLASSES: dict[type, type] = {}


def _hooked_class(cls: type) -> type:
    if cls not in _HOOKED_CLASSES:
        _HOOKED_CLASSES[cls] = type(
            f"AttentionHooked{cls.__name__}", (cls, AttentionHookedModel),
            {"_interp_original_class": cls, "__module__": cls.__module__},
        )
    return _HOOKED_CLASSES[cls]


def _replace(root: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, leaf = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, leaf, new)


def hook_attention(model: nn.Module) -> nn.Module:
    """Give every `nn.MultiheadAttention` in `model` per-head hooks; returns the hooked model.

    The model is changed in place (its attention modules replaced, its class given the
    `HookedRootModule` methods) and returned; outputs are unchanged to float tolerance.
    A bare `nn.MultiheadAttention` comes back as a `HookedMultiheadAttention` (hooks named
    `hook_q` ... at the root). Calling it twice is harmless. Undo with `unhook_attention`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"hook_attention needs an nn.Module, got {type(model).__name__}.")
    if isinstance(model, HookedMultiheadAttention):
        return model
    if isinstance(model, nn.MultiheadAttention):
        return HookedMultiheadAttention(model)
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)]
    already = any(isinstance(m, HookedMultiheadAttention) for m in model.modules())
    if not targets and not already:
        raise ValueError(
            f"{type(model).__name__} contains no torch.nn.MultiheadAttention module, so there is nothing to hook. "
            "Models written with their own attention need HookPoints of their own (see interp.models.components.Attention)."
        )
    for name, mha in targets:
        _replace(model, name, HookedMultiheadAttention(mha))
    for module in model.modules():
        # the nested-tensor path would feed the attention modules nested tensors, which have no per-head view
        if isinstance(module, nn.TransformerEncoder) and getattr(module, "use_nested_tensor", False):
            # put back by unhook_attention; setattr: a bool, where torch types a module's attributes as Tensor | Module
            setattr(module, "_interp_use_nested_tensor", module.use_nested_tensor)  # noqa: B010
            module.use_nested_tensor = False
    if not isinstance(model, AttentionHookedModel):
        if isinstance(model, HookedRootModule):  # already a hook root (its own class): re-index only
            model.setup()
            return model
        model.__class__ = _hooked_class(type(model))
        model = cast(AttentionHookedModel, model)  # its class now derives from AttentionHookedModel
        model.is_caching, model.context_level = False, 0
        import interp.tl_surface as tl_surface

        tl_surface.attach(model, [(m, m.num_heads, m.head_dim) for m in model.modules()
                                  if isinstance(m, HookedMultiheadAttention)])
    model.setup()
    return model


def unhook_attention(model: nn.Module) -> nn.Module:
    """Undo `hook_attention`: the original attention modules and class come back; returns the model."""
    if isinstance(model, HookedMultiheadAttention):
        model.reset_hooks(including_permanent=True)
        return model.original.train(model.training)
    hooked = [(name, m) for name, m in model.named_modules() if isinstance(m, HookedMultiheadAttention)]
    if not hooked:
        raise ValueError(f"{type(model).__name__} has no hooked attention module; was it passed to hook_attention?")
    for name, module in hooked:
        module.reset_hooks(including_permanent=True)
        _replace(model, name, module.original.train(module.training))
    for child in model.modules():
        if isinstance(child, nn.TransformerEncoder) and hasattr(child, "_interp_use_nested_tensor"):
            child.use_nested_tensor = getattr(child, "_interp_use_nested_tensor")  # noqa: B009 -- Any, as above
            del child._interp_use_nested_tensor
    if isinstance(model, AttentionHookedModel):
        import interp.tl_surface as tl_surface

        tl_surface.detach(model)
        model.__class__ = model._interp_original_class
        for attr in ("hook_dict", "mod_dict", "hook_aliases", "is_caching", "context_level"):
            model.__dict__.pop(attr, None)
    elif isinstance(model, HookedRootModule):
        model.setup()
    return model


def mha_sites(model: nn.Module) -> list[AttentionSite] | None:
    """Sites of a hooked MultiheadAttention model, in module-registration order.

    Registration order is forward order for `nn.TransformerEncoder` and the usual
    `nn.ModuleList` of blocks; `causal` is None because a MultiheadAttention module is causal
    only when the caller passes a causal mask.
    """
    if not isinstance(model, (AttentionHookedModel, HookedMultiheadAttention)) or "_interp_sdpa_sites" in model.__dict__:
        return None
    sites = []
    modules = [(name, m) for name, m in model.named_modules() if isinstance(m, HookedMultiheadAttention)]
    for layer, (name, module) in enumerate(modules):
        prefix = f"{name}." if name else ""
        hooks = {role: f"{prefix}hook_{role}" for role in ROLES}
        causal = getattr(module, "observed_causal", None)
        sites.append(AttentionSite(layer, name, module.num_heads, module.head_dim, causal, hooks))
    return sites


def observe_causality(model: nn.Module, tokens: torch.Tensor) -> None:
    """Run `model` once on `tokens` and record on each hooked attention module whether the mask its
    caller passed was causal (`observed_causal`: every score above the diagonal -inf, and none
    below): a MultiheadAttention module is causal only through the mask its caller passes, so
    `attention_sites` reports None until this has run. A forward that fails raises ModelError."""
    from interp.errors import ModelError

    modules = [m for m in model.modules() if isinstance(m, HookedMultiheadAttention)]
    seen: dict[int, bool] = {}

    def record(module: HookedMultiheadAttention):
        def hook(scores, hook):  # (batch, head, query, key)
            n_query, n_key = scores.shape[-2:]
            above = torch.ones(n_query, n_key, dtype=torch.bool, device=scores.device).triu(1 + n_key - n_query)
            masked = torch.isneginf(scores)
            seen[id(module)] = bool(n_query > 1 and masked[..., above].all() and not masked[..., ~above].any())
        return hook

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for module in modules:
                module.hook_attn_scores.add_hook(record(module))
            model(tokens)
    except Exception as error:
        raise ModelError(
            f"{type(model).__name__}.forward failed on token ids of shape {tuple(tokens.shape)}: {type(error).__name__}: "
            f"{error}. The toolkit feeds (batch, pos) LongTensors of token ids from the model's nn.Embedding; make "
            "forward(tokens) accept them (a factory can wrap the model in a module that does), or, for a model that "
            "takes other inputs, hook it with interp.hook_attention(model) and pass your own (verify_hooks(model, "
            "tokens=inputs))."
        ) from error
    finally:
        model.train(was_training)
        for module in modules:
            module.hook_attn_scores.remove_hooks(including_permanent=False)
    for module in modules:
        if id(module) in seen:
            module.observed_causal = seen[id(module)]
