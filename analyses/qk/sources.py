"""The sources of one head's query and key, each projected to the head's d_head space on its own.

A pre-norm head reads `x = ln1(resid_pre)`. With the norm's per-position scale `sigma` frozen at its
clean-run value, the norm is affine in the residual stream: `x = w * centre(resid) / sigma + b`
(RMSNorm: no centring, no `b`; no norm: `x = resid`). The residual stream is a sum of writes (the
sources of `interp.paths`, the embedding split further), so the head's query is a sum of one term per
source,

    q = R_q( sum_s W_Q^T (w * centre(s) / sigma_q) + W_Q^T b + b_Q )

and the key alike (`R`: the rotary rotation at that position, identity without rotary). Each term is
computed here on its own, in float64: `Source` names it, `project_sources` returns the stack.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import einops
import torch
from torch import nn

from interp.data import PromptSet
from interp.errors import BadInput
from interp.heads import Head, head_label
from interp.hooks import hooked
from interp.models.components import (
    Attention,
    GroupedQueryAttention,
    apply_rotary,
    rotary_angles,
)
from interp.models.gpt import HookedGPT
from interp.paths import check_graph_model

Side = Literal["q", "k"]
SIDES: tuple[str, ...] = ("q", "k")
# configuration switches (TransformerLens's names) that change how a score is made from q and k: none of
# our converted families sets them today, but a model carrying one is refused rather than mis-attributed
_REFUSED_SWITCHES = {"use_qk_norm": "QK-norm (a norm on q and k after the projection)",
                     "attn_scores_soft_cap": "soft-capping of the attention scores",
                     "attn_logit_softcapping": "soft-capping of the attention scores"}


@dataclass(frozen=True)
class Source:
    """One term of a head's query or key input.

    `kind`: "embed" (an embedding hook's output), "rest" (on a model hooked by interception: the residual stream
    less the heads' writes and output biases), "head" (a head's write z @ W_O[h]), "mlp" (an MLP's output,
    its b_out included), "b_O" (a layer's attention output bias): all in the residual stream, so the norm
    centres and scales them; "ln_bias" (the norm's own bias) and "b_Q" / "b_K" (the projection's bias),
    added after the norm."""

    name: str  # "tok_embed", "pos_embed", "embed", "type_embed", "L0H2", "b_O0", "MLP0", "ln_bias", "b_Q", "b_K"
    kind: str
    hook: str | None = None  # the hook whose activation gives the write (embed, head, mlp)
    layer: int | None = None  # heads, MLPs, b_O
    index: int | None = None  # heads

    @property
    def in_stream(self) -> bool:
        """Whether the term enters before the norm (the norm's scale divides it)."""
        return self.kind in ("embed", "head", "mlp", "b_O", "rest")


def check_qk_head(model: nn.Module, head: Any) -> Head:
    """The head, checked: a pre-norm HookedGPT with our attention and none of the score variants this
    decomposition does not cover, and a head that exists."""
    check_graph_model(model, "QK attribution")
    from interp.heads import parse_head

    parsed = parse_head(head)
    blocks: Any = model.blocks  # check_graph_model checked them
    n_layers, n_heads = len(blocks), blocks[0].cfg.n_heads
    if not (0 <= parsed.layer < n_layers and 0 <= parsed.head < n_heads):
        raise BadInput(f"head {head_label(parsed)} does not exist: this {type(model).__name__} has {n_layers} layers "
                       f"of {n_heads} heads (L0H0 .. L{n_layers - 1}H{n_heads - 1}).")
    cfg = blocks[parsed.layer].cfg
    for switch, what in _REFUSED_SWITCHES.items():
        value = getattr(cfg, switch, None)
        if value not in (None, False, 0, -1, -1.0):
            raise BadInput(f"QK attribution cannot decompose this model's scores: it uses {what} ({switch}={value!r}), "
                           "so a score is no bilinear form of the residual streams. Only plain q . k scores qualify.")
    if getattr(cfg, "positional_embedding_type", "standard") not in ("standard", "rotary"):
        raise BadInput(f"QK attribution covers learned and rotary positions; this model's are "
                       f"{cfg.positional_embedding_type!r} (ALiBi adds a bias per distance that no source owns).")
    attn = blocks[parsed.layer].attn
    if type(attn) not in (Attention, GroupedQueryAttention):
        raise BadInput(f"QK attribution reads the weights of interp's own attention; L{parsed.layer}'s is a "
                       f"{type(attn).__name__}, whose scores may be computed otherwise. Load the model natively.")
    return parsed


def sources(model: HookedGPT, layer: int, side: Side) -> list[Source]:
    """The terms of layer `layer`'s query (side "q") or key ("k") input, in forward order."""
    cfg = model.cfg
    if getattr(cfg, "embed_norm", False):  # the embeddings are normalised together: one source
        out = [Source("embed", "embed", "blocks.0.hook_resid_pre")]
    elif cfg.positional_embedding_type == "standard":
        out = [Source("tok_embed", "embed", "hook_embed"), Source("pos_embed", "embed", "hook_pos_embed")]
    else:  # rotary: position enters by rotation, there is no position source
        out = [Source("embed", "embed", "hook_embed")]
    if getattr(cfg, "n_token_types", 0) and not getattr(cfg, "embed_norm", False):
        out.append(Source("type_embed", "embed", "hook_token_type_embed"))
    for earlier in range(layer):
        out += [Source(head_label((earlier, h)), "head", f"blocks.{earlier}.attn.hook_z", earlier, h)
                for h in range(cfg.n_heads)]
        out.append(Source(f"b_O{earlier}", "b_O", None, earlier))
        if not cfg.attn_only:
            out.append(Source(f"MLP{earlier}", "mlp", f"blocks.{earlier}.hook_mlp_out", earlier))
    if cfg.normalization_type == "LN":
        out.append(Source("ln_bias", "ln_bias"))
    out.append(Source("b_Q" if side == "q" else "b_K", "bias"))
    return out


def side_weights(attn: Attention, head: int, side: Side) -> tuple[torch.Tensor, torch.Tensor]:
    """The map (d_model, d_head) and bias (d_head,) of one head's query or key; grouped-query models
    share a key head among head // group's query heads."""
    if side == "q":
        return attn.W_Q[head], attn.b_Q[head]
    W_K, _, b_K, _ = attn.kv_weights()
    return W_K[head // attn.group], b_K[head // attn.group]


def read_map(norm: nn.Module, W: torch.Tensor) -> torch.Tensor:
    """(d_model, d_head) float64: what the projection reads of a residual-stream vector through the norm,
    its scale left out: gain times W, with LayerNorm's centring folded in (x - mean x is x times a fixed
    projection, so the column means of w * W are removed)."""
    read = W.double()
    gain = getattr(norm, "w", None)
    if gain is not None:
        read = gain.double()[:, None] * read
    if hasattr(norm, "b"):  # LayerNorm: centres (RMSNorm has no bias and does not centre)
        read = read - read.mean(0, keepdim=True)
    return read


HOOKS_ALWAYS = ("attn.hook_attn_scores", "attn.hook_pattern")


@torch.no_grad()
def capture(model: HookedGPT, batch: PromptSet, layer: int) -> dict[str, torch.Tensor]:
    """One forward stopped after block `layer`, keeping every source's hook, the norm's scale and the
    head's scores and pattern at `layer`."""
    names = {src.hook for side in SIDES for src in sources(model, layer, side) if src.hook}  # type: ignore[arg-type]
    names |= {f"blocks.{layer}.{name}" for name in HOOKS_ALWAYS}
    if model.cfg.normalization_type is not None:
        names.add(f"blocks.{layer}.ln1.hook_scale")
    kept: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any) -> None:
        kept[hook.name] = act.detach()

    device = model.device
    kwargs = {k: v.to(device) for k, v in batch.model_kwargs().items()}
    with hooked(model, [(name, keep) for name in sorted(names)]):
        model(batch.tokens.to(device), stop_at_layer=layer + 1, **kwargs)
    return kept


def project_sources(model: HookedGPT, batch: PromptSet, head: Head, side: Side,
                    kept: dict[str, torch.Tensor]) -> torch.Tensor:
    """(source, batch, pos, d_head) float64: each source's term of the head's query (times the head's
    `attn.scale`, so a query term dotted with a key term is a share of the score) or key, rotated at its
    position on rotary models. `kept`: `capture`'s activations for the batch."""
    block = model.blocks[head.layer]
    attn = block.attn
    W, bias = side_weights(attn, head.head, side)
    read = read_map(block.ln1, W)  # (d_model, d_head)
    scale = kept.get(f"blocks.{head.layer}.ln1.hook_scale")
    n_batch, n_pos = batch.tokens.shape
    sigma = torch.ones(n_batch, n_pos, 1, dtype=torch.float64, device=read.device) if scale is None else scale.double()
    terms = [_term(model, src, read, kept, block.ln1, W, bias) for src in sources(model, head.layer, side)]
    stacked = torch.stack([t.expand(n_batch, n_pos, -1) for t in terms])  # (source, batch, pos, d_head)
    in_stream = torch.tensor([src.in_stream for src in sources(model, head.layer, side)], device=read.device)
    stacked = torch.where(in_stream[:, None, None, None], stacked / sigma, stacked)
    if model.cfg.positional_embedding_type == "rotary":
        positions = model.position_ids(batch.tokens.shape, batch.attention_mask, device=read.device)
        cos, sin = rotary_angles(positions, attn.rotary_inv_freq)  # (batch, 1, pos, rotary_dim)
        rotated = apply_rotary(einops.rearrange(stacked, "source batch pos d -> batch source pos d"), cos, sin)
        stacked = einops.rearrange(rotated, "batch source pos d -> source batch pos d")
    return stacked * attn.scale if side == "q" else stacked


def _term(model: HookedGPT, src: Source, read: torch.Tensor, kept: dict[str, torch.Tensor], norm: Any,
          W: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """One source's term, (batch, pos, d_head) or broadcastable to it, before the norm's scale."""
    if src.kind == "head":
        assert src.hook is not None and src.layer is not None and src.index is not None  # sources() sets them
        W_O = model.blocks[src.layer].attn.W_O[src.index].double()  # (d_head, d_model)
        return kept[src.hook][:, :, src.index].double() @ (W_O @ read)
    if src.kind in ("embed", "mlp"):
        assert src.hook is not None
        return kept[src.hook].double() @ read
    if src.kind == "b_O":
        assert src.layer is not None
        return (model.blocks[src.layer].attn.b_O.double() @ read)[None, None]
    if src.kind == "ln_bias":  # after the norm: neither centred nor scaled
        return (norm.b.double() @ W.double())[None, None]
    return bias.double()[None, None]
