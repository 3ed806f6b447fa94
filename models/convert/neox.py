"""GPT-NeoX / Pythia: fused per-head q/k/v rows, partial rotary, parallel attention + MLP, untied unembedding."""
from __future__ import annotations

from typing import Any

import einops
import torch

from interp.models.config import GPTConfig
from interp.models.convert.common import DECODER, ConversionError, Weights, activation, check_fields, rope
from interp.models.convert.gpt2 import lm_head_weight

FIELDS = {
    "vocab_size": "d_vocab",
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads (d_head = hidden_size // num_attention_heads)",
    "intermediate_size": "d_mlp",
    "hidden_act": "act_fn (gelu, gelu_new, gelu_pytorch_tanh, relu, silu)",
    "max_position_embeddings": "n_ctx",
    "layer_norm_eps": "layer_norm_eps",
    "use_parallel_residual": "parallel_attn_mlp",
    "rope_parameters": "rotary_base = rope_theta; rotary_dim = int(d_head * partial_rotary_factor) "
                       "(rotary_pct, rotary_emb_base in older configs); rope_type 'default' only",
    "attention_bias": "q/k/v and output biases present (else zeros)",
    "tie_word_embeddings": "W_U = W_E^T when embed_out.weight / lm_head.weight is absent",
}


def config(hf: Any, name: str) -> GPTConfig:
    check_fields(hf, "GPT-NeoX", FIELDS, DECODER)
    theta, factor = rope(hf, "GPT-NeoX", partial=True)
    if hf.hidden_size % hf.num_attention_heads:
        raise ConversionError(f"GPT-NeoX hidden_size={hf.hidden_size} is not divisible by num_attention_heads.")
    d_head = hf.hidden_size // hf.num_attention_heads
    return GPTConfig(
        n_layers=hf.num_hidden_layers, n_heads=hf.num_attention_heads, d_model=hf.hidden_size,
        n_ctx=hf.max_position_embeddings, d_vocab=hf.vocab_size, d_mlp=hf.intermediate_size,
        act_fn=activation(hf.hidden_act, "GPT-NeoX", "hidden_act"), layer_norm_eps=hf.layer_norm_eps,
        positional_embedding_type="rotary", rotary_base=theta, rotary_dim=int(d_head * factor),
        parallel_attn_mlp=bool(hf.use_parallel_residual), model_name=name, original_architecture=name,
    )


def _layer(w: Weights, hf: Any, cfg: GPTConfig, layer: int) -> dict[str, torch.Tensor]:
    d, h, d_mlp, p = cfg.d_model, cfg.n_heads, cfg.d_mlp, f"layers.{layer}."
    why = f"hidden_size={d}, intermediate_size={d_mlp}"
    bias = bool(getattr(hf, "attention_bias", True))
    # rows of the fused projection run (head, q|k|v, d_head): GPT-NeoX views them per head, then chunks
    q, k, v = einops.rearrange(w.take(p + "attention.query_key_value.weight", (3 * d, d), why),
                               "(head three d_head) d_model -> three head d_model d_head", three=3, head=h)
    b_qkv = w.take(p + "attention.query_key_value.bias", (3 * d,), why) if bias else torch.zeros(3 * d)
    b_q, b_k, b_v = einops.rearrange(b_qkv, "(head three d_head) -> three head d_head", three=3, head=h)
    out = {
        "ln1.w": w.take(p + "input_layernorm.weight", (d,), why), "ln1.b": w.take(p + "input_layernorm.bias", (d,), why),
        "attn.W_Q": q, "attn.W_K": k, "attn.W_V": v, "attn.b_Q": b_q, "attn.b_K": b_k, "attn.b_V": b_v,
        "attn.W_O": einops.rearrange(w.take(p + "attention.dense.weight", (d, d), why),
                                     "d_model (head d_head) -> head d_head d_model", head=h),
        "attn.b_O": w.take(p + "attention.dense.bias", (d,), why) if bias else torch.zeros(d),
        "ln2.w": w.take(p + "post_attention_layernorm.weight", (d,), why),
        "ln2.b": w.take(p + "post_attention_layernorm.bias", (d,), why),
        "mlp.W_in": w.take(p + "mlp.dense_h_to_4h.weight", (d_mlp, d), why).T,
        "mlp.b_in": w.take(p + "mlp.dense_h_to_4h.bias", (d_mlp,), why),
        "mlp.W_out": w.take(p + "mlp.dense_4h_to_h.weight", (d, d_mlp), why).T,
        "mlp.b_out": w.take(p + "mlp.dense_4h_to_h.bias", (d,), why),
    }
    return {f"blocks.{layer}.{k}": t for k, t in out.items()}


def state_dict(hf: Any, cfg: GPTConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    w = Weights(tensors, "gpt_neox.", ignorable=(r"rotary_emb\.inv_freq$", r"attention\.bias$", r"masked_bias$"))
    why = f"vocab_size={cfg.d_vocab}, hidden_size={cfg.d_model}"
    W_E = w.take("embed_in.weight", (cfg.d_vocab, cfg.d_model), why)
    out = {"embed.W_E": W_E}
    for layer in range(cfg.n_layers):
        out.update(_layer(w, hf, cfg, layer))
    out["ln_final.w"] = w.take("final_layer_norm.weight", (cfg.d_model,), why)
    out["ln_final.b"] = w.take("final_layer_norm.bias", (cfg.d_model,), why)
    head = "embed_out.weight" if w.has("embed_out.weight") else "lm_head.weight"  # older and newer transformers
    out["unembed.W_U"] = lm_head_weight(w, head, W_E, hf.tie_word_embeddings, cfg, why)
    out["unembed.b_U"] = torch.zeros(cfg.d_vocab)
    w.check_all_used()
    return out
