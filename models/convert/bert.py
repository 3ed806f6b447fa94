"""BERT-family encoders: post-LayerNorm blocks, token-type and learned position embeddings, a
LayerNorm on the embeddings, padding mask; BertModel / RobertaModel (no head) or
BertForMaskedLM / RobertaForMaskedLM (MLM head).

RoBERTa counts positions from pad_token_id + 1 (its position table's first rows are never used
for real tokens), so the converted table starts there: n_ctx = max_position_embeddings - pad_token_id - 1."""
from __future__ import annotations

from typing import Any

import torch

from interp.models.config import EncoderConfig
from interp.models.convert.common import (
    ConversionError,
    UnsupportedField,
    Weights,
    activation,
    check_fields,
    per_head_bias,
    per_head_in,
    per_head_out,
)

FIELDS = {
    "vocab_size": "d_vocab",
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads (d_head = hidden_size // num_attention_heads)",
    "intermediate_size": "d_mlp",
    "hidden_act": "act_fn (gelu, gelu_new, gelu_pytorch_tanh, relu, silu)",
    "max_position_embeddings": "n_ctx (RoBERTa: minus pad_token_id + 1)",
    "type_vocab_size": "n_token_types",
    "layer_norm_eps": "layer_norm_eps",
    "pad_token_id": "pad_token_id",
    "tie_word_embeddings": "MLM head: W_U = W_E^T when the decoder weight is absent",
}
ACCEPTED = {"position_embedding_type": ("absolute",), "is_decoder": (False,), "add_cross_attention": (False,)}


NAMES = {"bert": ("BERT", "bert."), "roberta": ("RoBERTa", "roberta.")}


def _position_offset(hf: Any) -> int:
    """Rows of the position table before the first real position (RoBERTa: pad_token_id + 1)."""
    return (hf.pad_token_id + 1) if hf.model_type == "roberta" else 0


def config(hf: Any, name: str) -> EncoderConfig:
    family = NAMES[hf.model_type][0]
    check_fields(hf, family, FIELDS, ACCEPTED)
    if hf.hidden_size % hf.num_attention_heads:
        raise ConversionError(f"{family} hidden_size={hf.hidden_size} is not divisible by num_attention_heads.")
    mlm = name.endswith("ForMaskedLM")
    act = activation(hf.hidden_act, family, "hidden_act")
    if mlm and hf.model_type == "roberta" and act != "gelu":
        raise UnsupportedField(f"unsupported RoBERTa config field hidden_act={hf.hidden_act!r} with an MLM head "
                               "(RoBERTa's head always uses exact gelu; the converter needs hidden_act='gelu').")
    return EncoderConfig(
        n_layers=hf.num_hidden_layers, n_heads=hf.num_attention_heads, d_model=hf.hidden_size,
        n_ctx=hf.max_position_embeddings - _position_offset(hf), d_vocab=hf.vocab_size, d_mlp=hf.intermediate_size,
        act_fn=act, layer_norm_eps=hf.layer_norm_eps,
        pad_token_id=hf.pad_token_id or 0, post_norm=True, n_token_types=hf.type_vocab_size, embed_norm=True,
        lm_head="mlm" if mlm else None, model_name=name, original_architecture=name,
    )


def _layer(w: Weights, cfg: EncoderConfig, layer: int) -> dict[str, torch.Tensor]:
    d, h, d_mlp, p = cfg.d_model, cfg.n_heads, cfg.d_mlp, f"encoder.layer.{layer}."
    why = f"hidden_size={d}, intermediate_size={d_mlp}"
    s, o = p + "attention.self.", p + "attention.output."
    out = {}
    for ours, theirs in (("Q", "query"), ("K", "key"), ("V", "value")):
        out[f"attn.W_{ours}"] = per_head_in(w.take(s + theirs + ".weight", (d, d), why), h)
        out[f"attn.b_{ours}"] = per_head_bias(w.take(s + theirs + ".bias", (d,), why), h)
    out.update({
        "attn.W_O": per_head_out(w.take(o + "dense.weight", (d, d), why), h),
        "attn.b_O": w.take(o + "dense.bias", (d,), why),
        "ln1.w": w.take(o + "LayerNorm.weight", (d,), why), "ln1.b": w.take(o + "LayerNorm.bias", (d,), why),
        "mlp.W_in": w.take(p + "intermediate.dense.weight", (d_mlp, d), why).T,
        "mlp.b_in": w.take(p + "intermediate.dense.bias", (d_mlp,), why),
        "mlp.W_out": w.take(p + "output.dense.weight", (d, d_mlp), why).T,
        "mlp.b_out": w.take(p + "output.dense.bias", (d,), why),
        "ln2.w": w.take(p + "output.LayerNorm.weight", (d,), why), "ln2.b": w.take(p + "output.LayerNorm.bias", (d,), why),
    })
    return {f"blocks.{layer}.{k}": t for k, t in out.items()}


# (dense, LayerNorm, decoder, bias) of each family's masked-LM head
_HEAD_NAMES = {"bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                        "cls.predictions.decoder", "cls.predictions.bias"),
               "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias")}


def _mlm_head(w: Weights, hf: Any, cfg: EncoderConfig, W_E: torch.Tensor, why: str) -> dict[str, torch.Tensor]:
    d = cfg.d_model
    dense, norm, decoder, bias = _HEAD_NAMES[hf.model_type]
    if w.has(decoder + ".weight"):
        W_U = w.take(decoder + ".weight", (cfg.d_vocab, d), why).T
    elif hf.tie_word_embeddings:
        W_U = W_E.T
    else:
        raise ConversionError(f"masked-LM weights have no {decoder}.weight and the config is untied.")
    b_U = w.take(bias if w.has(bias) else decoder + ".bias", (cfg.d_vocab,), why)
    if w.has(decoder + ".bias"):
        w.take(decoder + ".bias", (cfg.d_vocab,), why)  # the same tensor, stored twice
    return {
        "mlm_head.W": w.take(dense + ".weight", (d, d), why).T, "mlm_head.b": w.take(dense + ".bias", (d,), why),
        "mlm_head.ln.w": w.take(norm + ".weight", (d,), why), "mlm_head.ln.b": w.take(norm + ".bias", (d,), why),
        "unembed.W_U": W_U.contiguous(), "unembed.b_U": b_U,
    }


def _positions(w: Weights, hf: Any, cfg: EncoderConfig, why: str) -> torch.Tensor:
    offset = _position_offset(hf)
    table = w.take("embeddings.position_embeddings.weight", (cfg.n_ctx + offset, cfg.d_model), why)
    return table[offset:]  # (n_ctx, d_model): row p is real position p


def state_dict(hf: Any, cfg: EncoderConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # the pooler (CLS -> tanh dense) feeds only classification heads, never the hidden states
    prefix = NAMES[hf.model_type][1]
    w = Weights(tensors, prefix, ignorable=(r"position_ids$", r"^(bert\.|roberta\.)?pooler\.", r"token_type_ids$",
                                            r"^cls\.seq_relationship\."))
    why = f"vocab_size={cfg.d_vocab}, hidden_size={cfg.d_model}, max_position_embeddings={cfg.n_ctx}, " \
          f"type_vocab_size={cfg.n_token_types}"
    e, d = "embeddings.", cfg.d_model
    W_E = w.take(e + "word_embeddings.weight", (cfg.d_vocab, d), why)
    out = {
        "embed.W_E": W_E, "pos_embed.W_pos": _positions(w, hf, cfg, why),
        "token_type_embed.W_token_type": w.take(e + "token_type_embeddings.weight", (cfg.n_token_types, d), why),
        "embed_ln.w": w.take(e + "LayerNorm.weight", (d,), why), "embed_ln.b": w.take(e + "LayerNorm.bias", (d,), why),
    }
    for layer in range(cfg.n_layers):
        out.update(_layer(w, cfg, layer))
    if cfg.lm_head == "mlm":
        out.update(_mlm_head(w, hf, cfg, W_E, why))
    w.check_all_used()
    return out
