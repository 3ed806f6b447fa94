"""GPT-2: Conv1D weights (d_in, d_out), learned positions, pre-LayerNorm, tied or untied unembedding."""
from __future__ import annotations

from typing import Any

import einops
import torch

from interp.models.config import GPTConfig
from interp.models.convert.common import DECODER, ConversionError, UnsupportedField, Weights, activation, check_fields

FIELDS = {
    "vocab_size": "d_vocab",
    "n_positions": "n_ctx",
    "n_ctx": "(legacy copy of n_positions; must equal it)",
    "n_embd": "d_model",
    "n_layer": "n_layers",
    "n_head": "n_heads (d_head = n_embd // n_head)",
    "n_inner": "d_mlp (None: 4 * n_embd)",
    "activation_function": "act_fn (gelu_new, gelu_pytorch_tanh, gelu, relu, silu)",
    "layer_norm_epsilon": "layer_norm_eps",
    "tie_word_embeddings": "W_U = W_E^T when lm_head.weight is absent",
}
ACCEPTED = {"scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,),
            "reorder_and_upcast_attn": (False,)}


def config(hf: Any, name: str) -> GPTConfig:
    check_fields(hf, "GPT-2", FIELDS, {**ACCEPTED, **DECODER})
    legacy_ctx = hf.to_dict().get("n_ctx")
    if legacy_ctx is not None and legacy_ctx != hf.n_positions:
        raise UnsupportedField(f"unsupported GPT-2 config: n_ctx={legacy_ctx} differs from n_positions={hf.n_positions}.")
    if hf.n_embd % hf.n_head:
        raise ConversionError(f"GPT-2 config n_embd={hf.n_embd} is not divisible by n_head={hf.n_head}.")
    return GPTConfig(
        n_layers=hf.n_layer, n_heads=hf.n_head, d_model=hf.n_embd, n_ctx=hf.n_positions, d_vocab=hf.vocab_size,
        d_mlp=hf.n_inner or 4 * hf.n_embd, act_fn=activation(hf.activation_function, "GPT-2", "activation_function"),
        layer_norm_eps=hf.layer_norm_epsilon, model_name=name, original_architecture=name,
    )


def _layer(w: Weights, cfg: GPTConfig, layer: int) -> dict[str, torch.Tensor]:
    d, n_heads, d_mlp, p = cfg.d_model, cfg.n_heads, cfg.d_mlp, f"h.{layer}."
    why = f"n_embd={d}, n_inner={d_mlp}"
    qkv = w.take(p + "attn.c_attn.weight", (d, 3 * d), why)  # Conv1D: (d_in, d_out)
    q, k, v = einops.rearrange(qkv, "d_model (three head d_head) -> three head d_model d_head", three=3, head=n_heads)
    b_q, b_k, b_v = einops.rearrange(w.take(p + "attn.c_attn.bias", (3 * d,), why),
                                     "(three head d_head) -> three head d_head", three=3, head=n_heads)
    out = {
        "ln1.w": w.take(p + "ln_1.weight", (d,), why), "ln1.b": w.take(p + "ln_1.bias", (d,), why),
        "attn.W_Q": q, "attn.W_K": k, "attn.W_V": v, "attn.b_Q": b_q, "attn.b_K": b_k, "attn.b_V": b_v,
        "attn.W_O": einops.rearrange(w.take(p + "attn.c_proj.weight", (d, d), why),
                                     "(head d_head) d_model -> head d_head d_model", head=n_heads),
        "attn.b_O": w.take(p + "attn.c_proj.bias", (d,), why),
        "ln2.w": w.take(p + "ln_2.weight", (d,), why), "ln2.b": w.take(p + "ln_2.bias", (d,), why),
        "mlp.W_in": w.take(p + "mlp.c_fc.weight", (d, d_mlp), why), "mlp.b_in": w.take(p + "mlp.c_fc.bias", (d_mlp,), why),
        "mlp.W_out": w.take(p + "mlp.c_proj.weight", (d_mlp, d), why),
        "mlp.b_out": w.take(p + "mlp.c_proj.bias", (d,), why),
    }
    return {f"blocks.{layer}.{k}": t for k, t in out.items()}


def state_dict(hf: Any, cfg: GPTConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    w = Weights(tensors, "transformer.", ignorable=(r"attn\.bias$", r"attn\.masked_bias$"))
    why = f"vocab_size={cfg.d_vocab}, n_positions={cfg.n_ctx}, n_embd={cfg.d_model}"
    W_E = w.take("wte.weight", (cfg.d_vocab, cfg.d_model), why)
    out = {"embed.W_E": W_E, "pos_embed.W_pos": w.take("wpe.weight", (cfg.n_ctx, cfg.d_model), why)}
    for layer in range(cfg.n_layers):
        out.update(_layer(w, cfg, layer))
    out["ln_final.w"] = w.take("ln_f.weight", (cfg.d_model,), why)
    out["ln_final.b"] = w.take("ln_f.bias", (cfg.d_model,), why)
    out["unembed.W_U"] = lm_head_weight(w, "lm_head.weight", W_E, hf.tie_word_embeddings, cfg, why)
    out["unembed.b_U"] = torch.zeros(cfg.d_vocab)
    w.check_all_used()
    return out


def lm_head_weight(w: Weights, name: str, W_E: torch.Tensor, tied: bool, cfg: GPTConfig, why: str) -> torch.Tensor:
    """W_U (d_model, d_vocab): the LM head's weight, or the token embedding when tied and the head is not stored."""
    if w.has(name):
        return w.take(name, (cfg.d_vocab, cfg.d_model), why).T.contiguous()
    if tied:
        return W_E.T.contiguous()
    raise ConversionError(
        f"the config says tie_word_embeddings=False but the weights hold no {name!r}; "
        "the unembedding is missing (a base model saved without its LM head?)."
    )
