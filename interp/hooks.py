"""Hook names, the attention sites of any supported model, and hook hygiene.

An *attention site* is one attention layer seen through its hooks: which hook carries q, k,
v (batch, pos, head, d_head), attn_scores and pattern (batch, head, query, key), z
(batch, pos, head, d_head) and result (batch, pos, head, d_model). Analyses ask
`attention_sites(model)` for these names and never spell hook strings themselves.

Each way of hooking a model defines the finder of its own sites (`interp.sites`), below this
module; `BUILTIN_SITE_FINDERS` names them in the order they are tried.
"""
from __future__ import annotations

import contextlib
import difflib
from typing import Any, Callable, Iterable, Iterator, Protocol, cast

from torch import nn

from interp.errors import BadType
from interp.loading import bridge_sites
from interp.mha import mha_sites
from interp.models.components import hook_is_live
from interp.sdpa import intercepted_sites
from interp.sites import ROLES, AttentionSite, HookRoot, Role, SiteFinder, hook_root

__all__ = [
    "ROLES", "AttentionSite", "BUILTIN_SITE_FINDERS", "Role", "SiteFinder", "attached_forward_hooks", "attention_sites",
    "check_hook_names",
    "hooked", "live_hooks", "register_site_finder",
]


class _BlockLayout(HookRoot, Protocol):
    """A model laid out as TransformerLens lays them out (HookedGPT, HookedEncoder, HookedTransformer)."""

    cfg: Any  # a GPTConfig or a TransformerLens config: n_heads, d_head, causal / is_causal
    blocks: nn.ModuleList


def _block_sites(model: nn.Module) -> list[AttentionSite]:
    """Sites of models laid out as TransformerLens lays them out: blocks[l].attn.hook_*."""
    layout = cast(_BlockLayout, model)  # attention_sites checked blocks, cfg and hook_dict
    cfg = layout.cfg
    causal = getattr(cfg, "causal", None)
    if causal is None:
        causal = getattr(cfg, "is_causal", None)
    sites = []
    for layer, block in enumerate(layout.blocks):
        attn = getattr(block, "attn", None)
        if attn is None:
            continue
        prefix = f"blocks.{layer}.attn"
        hooks = {role: f"{prefix}.hook_{role}" for role in ROLES if f"{prefix}.hook_{role}" in layout.hook_dict}
        n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
        sites.append(AttentionSite(layer, prefix, cfg.n_heads, cfg.d_head, causal, hooks, n_kv_heads=n_kv))
    return sites


# the built-in kinds of model, tried in this order (the order `attention_sites` has always tried them):
# a TransformerBridge, a model hooked by `hook_attention` (nn.MultiheadAttention), a model hooked by
# `hook_sdpa`; a model laid out as TransformerLens lays it out (HookedGPT, HookedEncoder) comes last
BUILTIN_SITE_FINDERS: tuple[SiteFinder, ...] = (bridge_sites, mha_sites, intercepted_sites)
_SITE_FINDERS: list[SiteFinder] = []  # a user's own, tried after the built-in ones


def register_site_finder(finder: SiteFinder) -> SiteFinder:
    """Teach `attention_sites` a new kind of model: `finder` returns its sites, or None if not its kind.

    Finders registered here are tried after `BUILTIN_SITE_FINDERS`, in registration order, and
    before the TransformerLens block layout."""
    _SITE_FINDERS.append(finder)
    return finder


def attention_sites(model: nn.Module) -> list[AttentionSite]:
    """The attention sites of a supported model, in forward order."""
    for finder in (*BUILTIN_SITE_FINDERS, *_SITE_FINDERS):
        sites = finder(model)
        if sites is not None:
            return sites
    if hasattr(model, "blocks") and hasattr(model, "cfg") and hasattr(model, "hook_dict"):
        return _block_sites(model)
    raise BadType(
        f"cannot find attention hooks in a {type(model).__name__}; pass a HookedGPT, HookedEncoder, "
        "a TransformerBridge, or your own model through interp.load(model) first: it hooks models built on "
        "nn.MultiheadAttention or scaled_dot_product_attention, and says why when it cannot."
    )


def check_hook_names(model: nn.Module, names: Iterable[str]) -> None:
    """Raise a KeyError naming unknown hooks and the closest real ones."""
    root = hook_root(model)
    hook_dict, aliases = root.hook_dict, getattr(root, "hook_aliases", {})
    known = list(hook_dict)
    for name in names:
        if name not in hook_dict and name not in aliases:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
            hint = f" Did you mean {close}?" if close else f" The model has {len(known)} hooks; see model.hook_dict."
            raise KeyError(f"unknown hook name {name!r}.{hint}")


@contextlib.contextmanager
def hooked(
    model: nn.Module,
    fwd_hooks: Iterable[tuple[str, Callable[..., Any]]] = (),
    bwd_hooks: Iterable[tuple[str, Callable[..., Any]]] = (),
) -> Iterator[nn.Module]:
    """Attach hooks for the duration of a `with` block; they are removed even if the body raises.

    Hook names are checked first (with close-match suggestions), so a typo never silently
    attaches nothing.
    """
    fwd_hooks, bwd_hooks = list(fwd_hooks), list(bwd_hooks)
    check_hook_names(model, [name for name, _ in fwd_hooks + bwd_hooks if isinstance(name, str)])
    with hook_root(model).hooks(fwd_hooks=fwd_hooks, bwd_hooks=bwd_hooks, reset_hooks_end=True):
        yield model


def attached_forward_hooks(model: nn.Module) -> list[str]:
    """Where forward hooks that may change what `model` computes are attached: module paths ("" the model
    itself), and "every module" for torch's global forward hooks.

    Every hook on a HookPoint counts (a TransformerLens hook, a raw torch hook); on other modules, hooks that
    TransformerLens wires into its own bridge's modules (they capture, they compute nothing new) do not.
    `interp.Run` reads this to refuse memoising numbers a hook may have changed."""
    from torch.nn.modules import module as torch_module
    from transformer_lens.hook_points import HookPoint

    found = ["every module"] if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks else []
    if not isinstance(model, nn.Module):
        return found
    for path, module in model.named_modules():
        hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
        if not isinstance(module, HookPoint):
            hooks = [h for h in hooks if not getattr(h, "__module__", "").startswith("transformer_lens.")]
        if hooks:
            found.append(path)
    return found


def live_hooks(model: nn.Module) -> list[str]:
    """Names of hook points that currently have a forward or backward hook attached."""
    return [name for name, hp in hook_root(model).hook_dict.items() if hook_is_live(hp)]
