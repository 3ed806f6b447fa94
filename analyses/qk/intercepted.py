"""QK attribution on a model hooked by intercepting its attention (a user's own module), where the query and key
projections are visible: one head's scores split into (query source x key source) terms, as `attribute` does on a
HookedGPT.

What is read: the layer's input norm (`interp.intercepted.layout`, a LayerNorm or RMSNorm whose scale is frozen at
the clean run's value), the query and key maps (the Linear whose output holds the call's q, resp. k, as a column
block, found by `interp.intercepted.projections`), each earlier head's write (hook_z through the output projection)
and the output projections' biases. Sources on each side: `rest` (everything else in the residual stream entering
the layer: the embeddings, MLPs, any other writer, which an intercepted model does not tell apart), `L{l}H{h}`,
`b_O{l}`, `ln_bias` (LayerNorm) and `b_Q` / `b_K`. q and k must be the projection's columns as they are: a model
that rotates them in its own code (rotary positions) or normalises them is refused, since the toolkit cannot see
that transform.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from interp.analyses.qk.sources import Side, Source
from interp.data import PromptSet
from interp.errors import BadInput
from interp.heads import Head, parse_head
from interp.hooks import attention_sites, hooked
from interp.intercepted import Norm, head_writes, layout, norm_input, output_projection, projections, what_works
from interp.modelinfo import user_class
from interp.sites import AttentionSite


@dataclass(frozen=True)
class SiteMask:
    """What `interp.analyses.qk.items` reads of an attention to know which keys a query sees."""

    causal: bool
    cfg: Any = None  # no sliding window

    def mask(self, n_pos: int, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """(batch or 1, 1, query, key) bool: causal (or not) and the padding's keys masked."""
        allowed = torch.ones(n_pos, n_pos, dtype=torch.bool)
        allowed = allowed.tril() if self.causal else allowed
        if attention_mask is not None:
            return allowed[None, None] & attention_mask.bool().cpu()[:, None, None, :]
        return allowed[None, None]


@dataclass(frozen=True)
class Plan:
    """One head of an intercepted model, with what its attribution reads."""

    head: Head
    site: AttentionSite
    norm: Norm
    maps: dict[str, tuple[torch.Tensor, torch.Tensor]]  # side -> (head, d_model, d_head) map and (head, d_head) bias
    scale: float


def is_intercepted_model(model: nn.Module) -> bool:
    """A hooked model without HookedGPT's blocks (split inputs): read through `interp.intercepted`."""
    blocks = getattr(model, "blocks", None)
    has_blocks = blocks is not None and all(hasattr(block, "hook_q_input") for block in blocks)
    return not has_blocks and hasattr(model, "hook_dict")


def plan(model: nn.Module, head: Any) -> Plan:
    """The head, checked, and what its attribution reads; a BadInput saying what works where something is hidden."""
    parsed = parse_head(head)
    sites = attention_sites(model)
    if not 0 <= parsed.layer < len(sites) or not 0 <= parsed.head < sites[parsed.layer].n_heads:
        raise BadInput(f"head {parsed.label} does not exist: {user_class(model).__name__} has {len(sites)} attention layers of "
                       f"{sites[0].n_heads} heads.")
    site = sites[parsed.layer]
    works = what_works(model)
    maps = projections(model).get(parsed.layer, {})
    missing = [side for side in ("q", "k") if side not in maps]
    if missing:
        raise BadInput(f"QK attribution needs the query and key as a Linear's output columns; in "
                       f"{user_class(model).__name__}, {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} no column "
                       "block of any Linear's output (the model's code transforms them after the projection: rotary "
                       f"positions, a norm on q and k, ...), so the toolkit cannot see how a score is made. {works}")
    norm = layout(model).input_norms.get(parsed.layer)
    if layout(model).post_norm:
        raise BadInput(f"QK attribution needs a pre-norm model; an attention of {user_class(model).__name__} reads "
                       f"{layout(model).post_norm[0]}, so its input is no sum of the earlier writes. {works}")
    if norm is None:
        reads = layout(model).input_unknown.get(parsed.layer) or "the residual stream without a norm"
        raise BadInput(f"QK attribution of {parsed.label} needs its attention to read a LayerNorm or RMSNorm of the "
                       f"residual stream (a pre-norm block); in {user_class(model).__name__} it reads {reads}. {works}")
    if site.causal is None:
        raise BadInput(f"QK attribution of {parsed.label}: whether {site.module!r} is causal is unknown (its mask is "
                       f"computed per call), so the keys a query sees cannot be told. {works}")
    for earlier in sites[:parsed.layer]:
        if "z" not in earlier.hooks or output_projection(model, earlier) is None:
            raise BadInput(f"QK attribution of {parsed.label}: the attention at {earlier.module!r} has no visible output "
                           f"projection, so its heads' writes cannot be split. {works}")
    return Plan(parsed, site, norm, maps, site.scale if site.scale is not None else site.d_head ** -0.5)


def intercepted_sources(model: nn.Module, layer: int, side: Side) -> list[Source]:
    """The terms of layer `layer`'s query or key input on an intercepted model, in forward order."""
    sites = attention_sites(model)
    out = [Source("rest", "rest")]
    for site in sites[:layer]:
        out += [Source(site.label(h), "head", site.hooks["z"], site.layer, h) for h in range(site.n_heads)]
        out.append(Source(f"b_O{site.layer}", "b_O", None, site.layer))
    norm = layout(model).input_norms.get(layer)
    if norm is not None and norm.affine(model)[1] is not None:
        out.append(Source("ln_bias", "ln_bias"))
    return out + [Source("b_Q" if side == "q" else "b_K", "bias")]


@torch.no_grad()
def capture_intercepted(model: nn.Module, chosen: Plan, batch: PromptSet) -> dict[str, torch.Tensor]:
    """One forward keeping the earlier heads' z, the layer's input-norm input ("resid"), its scores and pattern."""
    sites = attention_sites(model)
    names = [site.hooks["z"] for site in sites[:chosen.head.layer]]
    names += [chosen.site.hooks["attn_scores"], chosen.site.hooks["pattern"]]
    kept: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any) -> None:
        kept[hook.name] = act.detach()

    device = next(model.parameters()).device
    with hooked(model, [(name, keep) for name in names]), norm_input(model, chosen.norm) as resid:
        model(batch.tokens.to(device), **{k: v.to(device) for k, v in batch.model_kwargs().items()})
    kept["resid"] = resid["x"]
    return kept


def project(model: nn.Module, chosen: Plan, side: Side, kept: dict[str, torch.Tensor]) -> torch.Tensor:
    """(source, batch, pos, d_head) float64: each source's term of the head's query (times the score scale) or key."""
    sites = attention_sites(model)
    W, bias = chosen.maps[side]
    W, bias = W[chosen.head.head].double(), bias[chosen.head.head].double()  # (d_model, d_head), (d_head,)
    gain, ln_bias = chosen.norm.affine(model)
    read = W if gain is None else gain.double()[:, None] * W
    read = read - read.mean(0, keepdim=True) if chosen.norm.centres else read  # centring folded into the map
    resid = kept["resid"].double()  # (batch, pos, d_model)
    sigma = chosen.norm.scale(resid)  # (batch, pos, 1)
    terms, stream = [], resid
    for site in sites[:chosen.head.layer]:
        writes = head_writes(model, site, kept[site.hooks["z"]])  # (batch, pos, head, d_model)
        terms += [writes[:, :, h] @ read for h in range(site.n_heads)]
        out_bias = getattr(output_projection(model, site), "bias", None)
        b_O = torch.zeros(resid.shape[-1], dtype=torch.float64) if out_bias is None else out_bias.detach().double()
        terms.append((b_O @ read).expand(resid.shape[0], resid.shape[1], -1))
        stream = stream - writes.sum(2) - b_O
    terms = [stream @ read, *terms]
    stacked = torch.stack(terms) / sigma  # in-stream sources, divided by the frozen scale
    after = ([] if ln_bias is None else [ln_bias.double() @ W]) + [bias]  # after the norm: neither centred nor scaled
    stacked = torch.cat([stacked, torch.stack(after)[:, None, None].expand(-1, *stacked.shape[1:])])
    return stacked * chosen.scale if side == "q" else stacked


__all__ = ["Plan", "SiteMask", "capture_intercepted", "intercepted_sources", "is_intercepted_model", "plan", "project"]
