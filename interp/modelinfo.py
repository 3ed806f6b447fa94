"""What a model says about itself: vocabulary size, context length, its config, and the
weights analyses read (token embedding, unembedding, per-head value/output maps) whatever
way the model was hooked.

One place that every analysis and the CLI ask, so `max_len` / `d_vocab` are requested from
the user only when the model truly does not say.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import einops
import torch
from torch import nn

# the config facts live one level down, where the hooking modules this one reads (interp.sdpa) can ask them too
from interp.modelconfig import CONTEXT_FIELDS, VOCAB_FIELDS, context_length, model_config, vocab_size

if TYPE_CHECKING:
    from interp.mha import HookedMultiheadAttention

__all__ = [
    "user_class",
    "CONTEXT_FIELDS", "VOCAB_FIELDS", "OVWeights", "check_finite_weights", "context_length", "final_norm", "model_config",
    "describe_output", "output_logits", "ov_weights", "token_embedding", "unembedding", "vocab_size",
]


def check_finite_weights(model: Any) -> None:
    """A ModelError naming the parameters that hold NaN or inf.

    Every analysis that runs a model asks here first: NaN weights give NaN metric rows (or, in a
    fused kernel that skips masked keys, finite wrong outputs), and an audit would blame the NaN
    on something else.
    """
    import torch

    from interp.errors import ModelError

    if not isinstance(model, nn.Module):
        return
    bad = [name for name, param in model.named_parameters() if not bool(torch.isfinite(param).all())]
    if bad:
        more = f" and {len(bad) - 8} more" if len(bad) > 8 else ""
        raise ModelError(f"the model has non-finite weights (NaN or inf) in {bad[:8]}{more}; "
                         "fix or re-train it before analysing it.")


# --------------------------------------------------------------------------- weights a model holds


@dataclass
class OVWeights:
    """One attention site's per-head value and output maps, as TransformerLens stores them."""

    W_V: torch.Tensor  # (kv_head, d_model, d_head): query head h reads W_V[h // kv_group]
    W_O: torch.Tensor  # (head, d_head, d_model)
    norm: nn.Module | None = None  # the norm applied to the attention's input, where known
    source: str = ""  # where the maps were read, for reports
    kv_group: int = 1  # query heads per key/value head (grouped-query attention); 1: one W_V per query head


def token_embedding(model: nn.Module) -> torch.Tensor | None:
    """(d_vocab, d_model): HookedGPT's `embed.W_E`, else the nn.Embedding with the vocabulary's rows."""
    ours = getattr(getattr(model, "embed", None), "W_E", None)
    if isinstance(ours, torch.Tensor):
        return ours
    d_vocab = vocab_size(model)
    found = [m for m in model.modules() if isinstance(m, nn.Embedding) and m.num_embeddings == d_vocab]
    return found[0].weight if found else None


def user_class(model: Any) -> Any:
    """The model's class as its user wrote it: a model the toolkit hooked (`interp.load`, the CLI) runs as a subclass
    made for the hooks (`SDPAHookedGPT` for a `GPT`), which no message should name."""
    return getattr(type(model), "_interp_original_class", type(model))


def unembedding(model: nn.Module) -> torch.Tensor | None:
    """(d_model, d_vocab): HookedGPT's `unembed.W_U`, else the last nn.Linear mapping to the vocabulary
    (a language-model head; nanoGPT's `lm_head`, tied or not). None when the model has none."""
    ours = getattr(getattr(model, "unembed", None), "W_U", None)
    if isinstance(ours, torch.Tensor):
        return ours
    d_vocab = vocab_size(model)
    heads = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == d_vocab]
    return heads[-1].weight.t() if heads else None


def final_norm(model: nn.Module) -> nn.Module | None:
    """The norm before the unembedding where the model names it (HookedGPT's `ln_final`)."""
    return getattr(model, "ln_final", None)


def ov_weights(model: nn.Module, site: Any) -> OVWeights | None:
    """Per-head W_V, W_O of one attention site: HookedGPT's own, nn.MultiheadAttention's
    `in_proj_weight` / `out_proj`, or the value and output projections SDPA interception found."""
    module = model.get_submodule(site.module) if site.module else model
    group = int(getattr(module, "group", 1) or 1)  # a grouped-query Attention keeps its kv heads' maps in _W_V
    W_V = getattr(module, "_W_V" if group > 1 else "W_V", None)
    W_O = getattr(module, "W_O", None)
    if isinstance(W_V, torch.Tensor) and isinstance(W_O, torch.Tensor):
        blocks = getattr(model, "blocks", None)
        block = blocks[site.layer] if blocks is not None else None
        return OVWeights(W_V, W_O, getattr(block, "ln1", None), "_W_V (key/value heads), W_O" if group > 1 else
                         "W_V, W_O", kv_group=group)
    from interp.mha import HookedMultiheadAttention

    if isinstance(module, HookedMultiheadAttention):
        return _mha_ov(module)
    from interp.sdpa import is_intercepted, sdpa_sites

    if is_intercepted(model):
        return _sdpa_ov(model, sdpa_sites(model).get(site.module))
    return None


def _mha_ov(module: HookedMultiheadAttention) -> OVWeights:
    w_v = module.in_weights()[2]  # (embed_dim, vdim)
    n_heads = module.num_heads
    return OVWeights(
        einops.rearrange(w_v, "(head d_head) d_model -> head d_model d_head", head=n_heads),
        einops.rearrange(module.out_proj.weight, "d_model (head d_head) -> head d_head d_model", head=n_heads),
        source="in_proj_weight (value rows), out_proj.weight",
    )


def _sdpa_ov(model: nn.Module, site: Any) -> OVWeights | None:
    if site is None or site.v_proj is None or site.out_proj is None:
        return None
    from interp.sdpa import linear_weight

    v_path, start = site.v_proj
    n_kv = site.n_heads // site.kv_groups if site.kv_groups > 1 else site.n_kv_heads
    v_weight, w_o = linear_weight(model.get_submodule(v_path)), linear_weight(model.get_submodule(site.out_proj))
    if v_weight is None or w_o is None:  # the probe records only linear layers as v_proj / out_proj
        return None
    w_v = v_weight[:, start:start + n_kv * site.d_value]  # (d_model, kv_head * d_head)
    W_V = einops.rearrange(w_v, "d_model (head d_head) -> head d_model d_head", head=n_kv)  # (kv_head, ...)
    # w_o: (head * d_head, d_model)
    W_O = einops.rearrange(w_o, "(head d_head) d_model -> head d_head d_model", head=site.n_heads)
    return OVWeights(W_V, W_O, source=f"{v_path} (columns from {start}), {site.out_proj}",
                     kv_group=site.n_heads // n_kv)


def output_logits(output: Any, model: Any = None) -> torch.Tensor:
    """The logits in a model's output: the one place every measurement reads a forward's output.

    With a selector recorded on `model` (`interp.load(..., output=)`, `--logits-key`, `interp.validate.select_output`):
    that key, attribute, tuple index or function. Without: a tensor as is, a Hugging Face `ModelOutput`'s
    `.logits`, a mapping's "logits", the one non-scalar tensor of a tuple (nanoGPT returns (logits, loss)).
    Anything else, or a tuple or mapping with several candidates, is a BadInput naming what was returned
    and how to say which part is the logits."""
    from interp.validate import output_selector

    selector = output_selector(model)
    if isinstance(output, torch.Tensor):
        return output
    if selector is not None:
        return _selected(output, selector)
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)):
        candidates = [x for x in output if isinstance(x, torch.Tensor) and x.ndim >= 2]
        if len(candidates) == 1:
            return candidates[0]
    raise _which_output(output)


def _selected(output: Any, selector: Any) -> torch.Tensor:
    """The part of `output` the selector names (see `output_logits`)."""
    from interp.errors import BadInput

    if callable(selector):
        part = selector(output)
    elif isinstance(selector, int):
        if not isinstance(output, (tuple, list)) or not -len(output) <= selector < len(output):
            size = f"{len(output)} elements" if isinstance(output, (tuple, list)) else "no index"
            raise BadInput(f"output={selector} selects an element of the model's output, which has {size}: "
                           f"it returned {describe_output(output)}.")
        part = output[selector]
    elif isinstance(output, Mapping):
        if selector not in output:
            raise BadInput(f"output={selector!r} is not in the model's output: keys {list(output)}; it returned "
                           f"{describe_output(output)}.")
        part = output[selector]
    else:
        part = getattr(output, selector, None)
    if not isinstance(part, torch.Tensor):
        raise BadInput(f"output={selector!r} gives {describe_output(part)}, not the logits tensor; the model returned "
                       f"{describe_output(output)}.")
    return part


def describe_output(output: Any, depth: int = 0) -> str:
    """A short description of a forward's output: 'a dict {'scores': tensor (2, 6, 61), ...}'."""
    def part(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            return f"tensor {tuple(x.shape)}"
        return describe_output(x, depth + 1) if depth < 1 and isinstance(x, (tuple, list, Mapping)) else type(x).__name__
    if isinstance(output, torch.Tensor):
        return f"a tensor {tuple(output.shape)}"
    if isinstance(output, Mapping):
        items = ", ".join(f"{k!r}: {part(v)}" for k, v in list(output.items())[:6])
        return f"a {type(output).__name__} {{{items}}}"
    if isinstance(output, (tuple, list)):
        return f"a {type(output).__name__} ({', '.join(part(x) for x in output[:6])})"
    return f"a {type(output).__name__}"


def _which_output(output: Any):
    """The BadInput for an output whose logits cannot be told apart: what it is and how to choose."""
    from interp.errors import BadInput

    if isinstance(output, Mapping):
        key = next((k for k, v in output.items() if isinstance(v, torch.Tensor) and v.ndim >= 2), None)
        how = f"output={key!r}" if key is not None else "output='<key>'"
        cli = f"--logits-key {key}" if key is not None else "--logits-key KEY"
    elif isinstance(output, (tuple, list)):
        last = len(output) - 1
        how, cli = f"output={last} (a tuple index)", f"--logits-key {last}"
    else:
        how, cli = "output=<attribute or function>", "--logits-key NAME"
    return BadInput(f"the model returned {describe_output(output)}, and the toolkit cannot tell which part is the "
                    f"logits; say which: interp.load(spec, {how}) or interp.validate.select_output(model, ...) in Python, "
                    f"{cli} on the command line.")
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return output
