"""Attention sites: what one attention layer looks like through its hooks.

An *attention site* is one attention layer seen through its hooks: which hook carries q, k,
v (batch, pos, head, d_head), attn_scores and pattern (batch, head, query, key), z
(batch, pos, head, d_head) and result (batch, pos, head, d_model).

This module sits below every way of hooking a model (`interp.mha`, `interp.sdpa`, the bridge
in `interp.loading`): each defines a *site finder* for its own kind of model, and
`interp.hooks.attention_sites` names them in one explicit list, so nothing is registered by
the side effect of an import.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Literal, Protocol, cast, get_args

from torch import nn

from interp.heads import head_label

if TYPE_CHECKING:
    from transformer_lens.hook_points import HookPoint

Role = Literal["q", "k", "v", "attn_scores", "pattern", "z", "result"]
ROLES: tuple[str, ...] = get_args(Role)


@dataclass(frozen=True)
class AttentionSite:
    """One attention layer: its index in forward order, its module path and its hook names."""

    layer: int  # 0-based index in forward order
    module: str  # path of the attention module, e.g. "blocks.0.attn"
    n_heads: int
    d_head: int
    causal: bool | None  # True causal, False bidirectional, None unknown
    hooks: dict[str, str] = field(default_factory=dict)  # role -> full hook name
    # key/value heads (grouped-query attention): k and v hooks carry n_kv_heads heads and query
    # head h reads key/value head h // (n_heads // n_kv_heads); None means n_heads
    n_kv_heads: int | None = None
    scale: float | None = None  # score scale; None means 1 / sqrt(d_head)
    output_module: str | None = None  # the module whose output the heads' results sum to (default `module`)
    notes: tuple[str, ...] = ()  # what a reader must know about these hooks (repeated k/v, missing roles)

    def kv_head(self, head: int) -> int:
        """The key/value head that query head `head` reads."""
        return head // (self.n_heads // (self.n_kv_heads or self.n_heads))

    def hook(self, role: Role) -> str:
        """Full hook name for a role; a clear error if this site does not expose it."""
        if role not in self.hooks:
            raise KeyError(
                f"attention site {self.module!r} has no {role!r} hook; it exposes {sorted(self.hooks)}."
            )
        return self.hooks[role]

    def label(self, head: int) -> str:
        return head_label((self.layer, head))


class HookRoot(Protocol):
    """What the toolkit reads of a hooked model (a TransformerLens hook root, a bridge, a model
    hooked by `hook_attention` or `hook_sdpa`): its hook points by name and its temporary-hooks context."""

    hook_dict: dict[str, HookPoint]

    def hooks(self, fwd_hooks: list = ..., bwd_hooks: list = ..., reset_hooks_end: bool = ...) -> ContextManager[Any]: ...


def hook_root(model: nn.Module) -> HookRoot:
    """`model` as a hook root, for the type checker only (torch types an unknown module attribute as
    Tensor | Module); callers have checked, or will fail on, `model.hook_dict` as before."""
    return cast(HookRoot, model)


# a site finder returns the sites of a model of its kind, in forward order, or None if the model is not its kind
SiteFinder = Callable[[nn.Module], "list[AttentionSite] | None"]
