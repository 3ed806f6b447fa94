"""Llama, Mistral, Qwen2, Gemma and Phi-3: RMSNorm, gated MLP, rotary, grouped-query attention; Qwen2's
q/k/v biases; Mistral's sliding window; Gemma's norm gains stored as w - 1 (converted to 1 + w) and
its embeddings scaled by sqrt(hidden_size) (folded into W_E; the tied unembedding keeps the
unscaled matrix); Phi-3's fused qkv_proj and gate_up_proj split into their parts, its partial
rotary and sliding window."""
from __future__ import annotations

from typing import Any

import torch

from interp.models.config import GPTConfig
from interp.models.convert.common import (
    DECODER,
    UnsupportedField,
    Weights,
    activation,
    check_fields,
    kv_names,
    optional_bias,
    per_head_bias,
    per_head_in,
    per_head_out,
    rope,
)
from interp.models.convert.gpt2 import lm_head_weight

FIELDS = {
    "vocab_size": "d_vocab",
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_key_value_heads (None: num_attention_heads)",
    "head_dim": "d_head (None: hidden_size // num_attention_heads)",
    "intermediate_size": "d_mlp (gated_mlp=True)",
    "hidden_act": "act_fn (silu, gelu, gelu_new, gelu_pytorch_tanh, relu)",
    "max_position_embeddings": "n_ctx",
    "rms_norm_eps": "layer_norm_eps (normalization_type='RMS')",
    "rope_parameters": "rotary_base = rope_theta (rope_theta in older configs); rope_type 'default', or "
                       "'llama3' (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings -> "
                       "use_NTK_by_parts_rope and the NTK_* fields)",
    "tie_word_embeddings": "W_U = W_E^T when lm_head.weight is absent",
}
FAMILY_FIELDS = {
    "llama": {"attention_bias": "q/k/v/o biases present (else zeros)",
              "mlp_bias": "gate/up/down biases present (else zeros)"},
    "mistral": {"sliding_window": "window_size (None: full causal attention)"},
    "gemma": {"attention_bias": "q/k/v/o biases present (else zeros)"},
    "phi3": {"rope_parameters": "rotary_base = rope_theta; rotary_dim = int(d_head * partial_rotary_factor); "
                                "rope_type 'default' or 'llama3'",
             "sliding_window": "window_size (None: full causal attention)",
             "original_max_position_embeddings": "read only by scaled rotary variants, which do not convert"},
    "qwen2": {"use_sliding_window": "must be False (sliding layers do not convert yet)",
              "sliding_window": "ignored while use_sliding_window is False",
              "max_window_layers": "ignored while use_sliding_window is False",
              "layer_types": "must all be 'full_attention'"},
}
NAMES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "gemma": "Gemma", "phi3": "Phi-3"}


def config(hf: Any, name: str) -> GPTConfig:
    family = NAMES[hf.model_type]
    check_fields(hf, family, {**FIELDS, **FAMILY_FIELDS[hf.model_type]}, DECODER)
    scaling: dict = {}
    theta, partial = rope(hf, family, partial=hf.model_type == "phi3", scaled=scaling)
    window = None
    if hf.model_type in ("mistral", "phi3"):
        window = hf.sliding_window
    if hf.model_type == "qwen2":
        layer_types = set(getattr(hf, "layer_types", None) or ["full_attention"])
        if getattr(hf, "use_sliding_window", False) or layer_types != {"full_attention"}:
            raise UnsupportedField(
                f"unsupported Qwen2 config field use_sliding_window={hf.use_sliding_window!r} "
                f"(layer_types {sorted(layer_types)}): per-layer sliding windows do not convert natively yet. "
                "Load with backend='bridge' instead."
            )
    d_head = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return GPTConfig(
        n_layers=hf.num_hidden_layers, n_heads=hf.num_attention_heads, d_model=hf.hidden_size, d_head=d_head,
        n_key_value_heads=hf.num_key_value_heads or hf.num_attention_heads,
        n_ctx=hf.max_position_embeddings, d_vocab=hf.vocab_size, d_mlp=hf.intermediate_size,
        act_fn=activation(hf.hidden_act, family, "hidden_act"), normalization_type="RMS",
        layer_norm_eps=hf.rms_norm_eps, positional_embedding_type="rotary", rotary_base=theta,
        gated_mlp=True, window_size=window, model_name=name, original_architecture=name, **scaling,
        rotary_dim=int(d_head * partial) if partial != 1.0 else None,
    )


def _biases(hf: Any) -> tuple[bool, bool, bool]:
    """(q/k/v bias, output bias, MLP biases) as each family's config says."""
    if hf.model_type == "qwen2":
        return True, False, False
    if hf.model_type == "llama":
        return bool(hf.attention_bias), bool(hf.attention_bias), bool(hf.mlp_bias)
    if hf.model_type == "gemma":
        return bool(hf.attention_bias), bool(hf.attention_bias), False
    return False, False, False


def _attention(w: Weights, hf: Any, cfg: GPTConfig, p: str) -> dict[str, torch.Tensor]:
    d, h, kv, dh = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    why = f"hidden_size={d}, num_attention_heads={h}, num_key_value_heads={kv}, head_dim={dh}"
    qkv_bias, o_bias, _ = _biases(hf)
    W_K, W_V, b_K, b_V = kv_names(h // kv)
    a = p + "self_attn."
    if hf.model_type == "phi3":  # one fused projection: query rows, then key rows, then value rows
        q, k, v = w.take(a + "qkv_proj.weight", ((h + 2 * kv) * dh, d), why).split([h * dh, kv * dh, kv * dh])
    else:
        q, k, v = (w.take(a + f"{x}_proj.weight", (n * dh, d), why) for x, n in (("q", h), ("k", kv), ("v", kv)))
    return {
        "attn.W_Q": per_head_in(q, h),
        f"attn.{W_K}": per_head_in(k, kv),
        f"attn.{W_V}": per_head_in(v, kv),
        "attn.b_Q": per_head_bias(optional_bias(w, a + "q_proj.bias", h * dh, qkv_bias, why), h),
        f"attn.{b_K}": per_head_bias(optional_bias(w, a + "k_proj.bias", kv * dh, qkv_bias, why), kv),
        f"attn.{b_V}": per_head_bias(optional_bias(w, a + "v_proj.bias", kv * dh, qkv_bias, why), kv),
        "attn.W_O": per_head_out(w.take(a + "o_proj.weight", (d, h * dh), why), h),
        "attn.b_O": optional_bias(w, a + "o_proj.bias", d, o_bias, why),
    }


def _layer(w: Weights, hf: Any, cfg: GPTConfig, layer: int) -> dict[str, torch.Tensor]:
    d, d_mlp, p = cfg.d_model, cfg.d_mlp, f"layers.{layer}."
    why = f"hidden_size={d}, intermediate_size={d_mlp}"
    mlp_bias = _biases(hf)[2]
    if hf.model_type == "phi3":  # gate rows first, then the linear branch (Phi-3 chunks them in that order)
        gate, up = w.take(p + "mlp.gate_up_proj.weight", (2 * d_mlp, d), why).split([d_mlp, d_mlp])
    else:
        gate, up = w.take(p + "mlp.gate_proj.weight", (d_mlp, d), why), w.take(p + "mlp.up_proj.weight", (d_mlp, d), why)
    out = {
        "ln1.w": _norm_gain(w, hf, p + "input_layernorm.weight", d, why),
        **_attention(w, hf, cfg, p),
        "ln2.w": _norm_gain(w, hf, p + "post_attention_layernorm.weight", d, why),
        "mlp.W_gate": gate.T,
        "mlp.b_gate": optional_bias(w, p + "mlp.gate_proj.bias", d_mlp, mlp_bias, why),
        "mlp.W_in": up.T,
        "mlp.b_in": optional_bias(w, p + "mlp.up_proj.bias", d_mlp, mlp_bias, why),
        "mlp.W_out": w.take(p + "mlp.down_proj.weight", (d, d_mlp), why).T,
        "mlp.b_out": optional_bias(w, p + "mlp.down_proj.bias", d, mlp_bias, why),
    }
    return {f"blocks.{layer}.{k}": t for k, t in out.items()}


def _norm_gain(w: Weights, hf: Any, name: str, d: int, why: str) -> torch.Tensor:
    """An RMSNorm gain; Gemma stores w - 1 and multiplies by (1 + w), in float32."""
    gain = w.take(name, (d,), why)
    return 1.0 + gain if hf.model_type == "gemma" else gain


def state_dict(hf: Any, cfg: GPTConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    w = Weights(tensors, "model.", ignorable=(r"rotary_emb\.inv_freq$", r"embed_tokens\.embed_scale$"))
    why = f"vocab_size={cfg.d_vocab}, hidden_size={cfg.d_model}"
    W_E = w.take("embed_tokens.weight", (cfg.d_vocab, cfg.d_model), why)
    # Gemma multiplies the looked-up embeddings by sqrt(hidden_size) (a float32 scalar): the same product here
    scale = torch.tensor(cfg.d_model ** 0.5, dtype=W_E.dtype) if hf.model_type == "gemma" else None
    out = {"embed.W_E": W_E * scale if scale is not None else W_E}
    for layer in range(cfg.n_layers):
        out.update(_layer(w, hf, cfg, layer))
    out["ln_final.w"] = _norm_gain(w, hf, "norm.weight", cfg.d_model, why)
    out["unembed.W_U"] = lm_head_weight(w, "lm_head.weight", W_E, hf.tie_word_embeddings, cfg, why)
    out["unembed.b_U"] = torch.zeros(cfg.d_vocab)
    w.check_all_used()
    return out
