"""What works instead on a model without split q/k/v inputs: the advice `interp.paths` and `interp.load` give.

Standalone (torch only), so that loading and the path graph can both give it without importing each other.
"""
from __future__ import annotations

from typing import Any

from torch import nn


def split_inputs_advice(model: nn.Module, n_heads: int | None = None) -> str:
    """What works instead on a model without split q/k/v inputs, for this model: the conversion that exists for
    it (nanoGPT's layout: with its own model_args; a Hugging Face model: the native converter), else what runs on it
    as it is. Never advice that leads back to the same model (backend='native' returns an intercepted module as is)."""
    as_is = ("On this model as it is, where its blocks are pre-norm: direct logit attribution per head (interp.analyses."
             "circuits.direct_logit_attribution); where an attention reads a LayerNorm or RMSNorm of the residual "
             "stream, a head's write patched into that layer's whole attention input (interp.analyses.circuits."
             "attention_input_patch, 'L0H1 -> L1 (attention input)'); where q and k are a Linear's output as they are, "
             "QK attribution (interp qk); and on any: head ablations and importance (interp.Run), attention patterns and "
             "head claims (interp.test_claims, interp claims) work.")
    name = getattr(type(model), "_interp_original_class", type(model)).__name__  # the user's class, not the hooked one
    args = _nanogpt_args(model, n_heads)
    if args is not None:
        return (f"{name} has nanoGPT's layout (transformer.wte, transformer.h.{{l}}.attn.c_attn, lm_head): "
                "convert it into a HookedGPT, where this works: in Python interp.models.nanogpt.from_nanogpt("
                f"{args}, model.state_dict()); from the shell torch.save({{'model_args': {args}, 'model': "
                f"model.state_dict()}}, 'ckpt.pt') and pass ckpt.pt as the model. {as_is}")
    if type(model).__module__.startswith("transformers."):
        return (f"{name} is a Hugging Face model hooked by interception (backend='sdpa'): load its folder "
                "with the default backend (interp.load(folder), --backend auto), which converts GPT-2, Llama, Qwen2, ... "
                f"into a HookedGPT; an architecture the converter lacks has no split inputs anywhere. {as_is}")
    return (f"No conversion exists for {name}, a module of your own; written in nanoGPT's layout "
            "(transformer.wte / wpe / h.{l}.attn.c_attn / lm_head) it would convert (interp.load('ckpt.pt')), and "
            f"HookedGPT (interp.models) has split inputs. {as_is}")


def _nanogpt_args(model: nn.Module, n_heads: int | None) -> dict[str, Any] | None:
    """nanoGPT's model_args of a live module in its layout (what `interp.models.nanogpt.from_nanogpt` reads), or None."""
    try:
        body = model.get_submodule("transformer")
        wte, wpe, first = body.get_submodule("wte"), body.get_submodule("wpe"), body.get_submodule("h.0.attn.c_attn")
        blocks = body.get_submodule("h")
        n_layer = len(blocks) if isinstance(blocks, nn.ModuleList) else 0
        # nanoGPT's attention keeps its head count; else the caller's (read from the model's attention sites)
        n_head = getattr(body.get_submodule("h.0.attn"), "n_head", None) or n_heads
        model.get_submodule("lm_head")
    except (AttributeError, TypeError, IndexError):
        return None
    layout = isinstance(wte, nn.Embedding) and isinstance(wpe, nn.Embedding) and isinstance(first, nn.Linear)
    if not (n_layer and n_head and layout):
        return None
    return {"n_layer": n_layer, "n_head": n_head, "n_embd": wte.embedding_dim, "block_size": wpe.num_embeddings,
            "vocab_size": wte.num_embeddings, "bias": first.bias is not None}


__all__ = ["split_inputs_advice"]
