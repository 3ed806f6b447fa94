"""Hugging Face models converted natively into `HookedGPT` / `HookedEncoder`.

The weights are mapped (per head, as TransformerLens stores them), so every hook of the
converted model carries what its name says and every edit at a hook takes effect: this is
what the TransformerLens bridge cannot promise (`interp.verify_hooks` on a bridge model lists it). Converting reads config.json
and the safetensors weights only; no Hugging Face model is built for a folder. The converted
model computes in float32 and equals Hugging Face's eager forward within 1e-4 (tests/models/convert/test_convert.py).

Position ids: with an `attention_mask`, positions count real tokens only (cumsum - 1), as
`generate` passes them; Hugging Face's plain forward counts padding too, so left-padded
inputs match it when it is given the same `position_ids`.

Every config field of a family is either read (the tables below), one of the no-ops of an
eval forward (dropout, token ids, labels, bookkeeping), or must hold its default: any other
value raises `ConversionError` naming the field and its value, because a silently ignored
field would make a different model. In every family `is_encoder_decoder`, `add_cross_attention`
and `tie_encoder_decoder` must be False; the decoders accept either value of `is_decoder`.

GPT-2 (`GPT2LMHeadModel`, `GPT2Model`)

| Hugging Face field | becomes |
|---|---|
| `vocab_size` | d_vocab |
| `n_positions` | n_ctx |
| `n_ctx` | (legacy copy of n_positions; must equal it) |
| `n_embd` | d_model |
| `n_layer` | n_layers |
| `n_head` | n_heads (d_head = n_embd // n_head) |
| `n_inner` | d_mlp (None: 4 * n_embd) |
| `activation_function` | act_fn (gelu_new, gelu_pytorch_tanh, gelu, relu, silu) |
| `layer_norm_epsilon` | layer_norm_eps |
| `tie_word_embeddings` | W_U = W_E^T when lm_head.weight is absent |
| `scale_attn_weights` | must be True |
| `scale_attn_by_inverse_layer_idx` | must be False |
| `reorder_and_upcast_attn` | must be False |

GPT-NeoX / Pythia (`GPTNeoXForCausalLM`, `GPTNeoXModel`)

| Hugging Face field | becomes |
|---|---|
| `vocab_size` | d_vocab |
| `hidden_size` | d_model |
| `num_hidden_layers` | n_layers |
| `num_attention_heads` | n_heads (d_head = hidden_size // num_attention_heads) |
| `intermediate_size` | d_mlp |
| `hidden_act` | act_fn (gelu, gelu_new, gelu_pytorch_tanh, relu, silu) |
| `max_position_embeddings` | n_ctx |
| `layer_norm_eps` | layer_norm_eps |
| `use_parallel_residual` | parallel_attn_mlp |
| `rope_parameters` | rotary_base = rope_theta; rotary_dim = int(d_head * partial_rotary_factor) (rotary_pct, rotary_emb_base in older configs); rope_type 'default' only |
| `attention_bias` | q/k/v and output biases present (else zeros) |
| `tie_word_embeddings` | W_U = W_E^T when embed_out.weight is absent |

Llama (`LlamaForCausalLM`, `LlamaModel`)

| Hugging Face field | becomes |
|---|---|
| `vocab_size` | d_vocab |
| `hidden_size` | d_model |
| `num_hidden_layers` | n_layers |
| `num_attention_heads` | n_heads |
| `num_key_value_heads` | n_key_value_heads (None: num_attention_heads) |
| `head_dim` | d_head (None: hidden_size // num_attention_heads) |
| `intermediate_size` | d_mlp (gated_mlp=True) |
| `hidden_act` | act_fn (silu, gelu, gelu_new, gelu_pytorch_tanh, relu) |
| `max_position_embeddings` | n_ctx |
| `rms_norm_eps` | layer_norm_eps (normalization_type='RMS') |
| `rope_parameters` | rotary_base = rope_theta (rope_theta in older configs); rope_type 'default', or 'llama3' (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings -> use_NTK_by_parts_rope and the NTK_* fields) |
| `tie_word_embeddings` | W_U = W_E^T when lm_head.weight is absent |
| `attention_bias` | q/k/v/o biases present (else zeros) |
| `mlp_bias` | gate/up/down biases present (else zeros) |

Mistral (`MistralForCausalLM`, `MistralModel`)

| Hugging Face field | becomes |
|---|---|
| `vocab_size` | d_vocab |
| `hidden_size` | d_model |
| `num_hidden_layers` | n_layers |
| `num_attention_heads` | n_heads |
| `num_key_value_heads` | n_key_value_heads (None: num_attention_heads) |
| `head_dim` | d_head (None: hidden_size // num_attention_heads) |
| `intermediate_size` | d_mlp (gated_mlp=True) |
| `hidden_act` | act_fn (silu, gelu, gelu_new, gelu_pytorch_tanh, relu) |
| `max_position_embeddings` | n_ctx |
| `rms_norm_eps` | layer_norm_eps (normalization_type='RMS') |
| `rope_parameters` | rotary_base = rope_theta (rope_theta in older configs); rope_type 'default', or 'llama3' (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings -> use_NTK_by_parts_rope and the NTK_* fields) |
| `tie_word_embeddings` | W_U = W_E^T when lm_head.weight is absent |
| `sliding_window` | window_size (None: full causal attention) |

Qwen2 (`Qwen2ForCausalLM`, `Qwen2Model`): q/k/v biases always, no output or MLP bias

| Hugging Face field | becomes |
|---|---|
| `vocab_size` | d_vocab |
| `hidden_size` | d_model |
| `num_hidden_layers` | n_layers |
| `num_attention_heads` | n_heads |
| `num_key_value_heads` | n_key_value_heads (None: num_attention_heads) |
| `head_dim` | d_head (None: hidden_size // num_attention_heads) |
| `intermediate_size` | d_mlp (gated_mlp=True) |
| `hidden_act` | act_fn (silu, gelu, gelu_new, gelu_pytorch_tanh, relu) |
| `max_position_embeddings` | n_ctx |
| `rms_norm_eps` | layer_norm_eps (normalization_type='RMS') |
| `rope_parameters` | rotary_base = rope_theta (rope_theta in older configs); rope_type 'default', or 'llama3' (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings -> use_NTK_by_parts_rope and the NTK_* fields) |
| `tie_word_embeddings` | W_U = W_E^T when lm_head.weight is absent |
| `use_sliding_window` | must be False (sliding layers do not convert yet) |
| `sliding_window` | ignored while use_sliding_window is False |
| `max_window_layers` | ignored while use_sliding_window is False |
| `layer_types` | must all be 'full_attention' |

Gemma (`GemmaForCausalLM`, `GemmaModel`; Gemma 1: no soft-capping): norm gains 1 + w, embeddings
scaled by sqrt(hidden_size), gelu_pytorch_tanh gated MLP

| Hugging Face field | becomes |
|---|---|
| `vocab_size` | d_vocab |
| `hidden_size` | d_model |
| `num_hidden_layers` | n_layers |
| `num_attention_heads` | n_heads |
| `num_key_value_heads` | n_key_value_heads (None: num_attention_heads) |
| `head_dim` | d_head (None: hidden_size // num_attention_heads) |
| `intermediate_size` | d_mlp (gated_mlp=True) |
| `hidden_act` | act_fn (silu, gelu, gelu_new, gelu_pytorch_tanh, relu) |
| `max_position_embeddings` | n_ctx |
| `rms_norm_eps` | layer_norm_eps (normalization_type='RMS') |
| `rope_parameters` | rotary_base = rope_theta (rope_theta in older configs); rope_type 'default', or 'llama3' (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings -> use_NTK_by_parts_rope and the NTK_* fields) |
| `tie_word_embeddings` | W_U = W_E^T when lm_head.weight is absent |
| `attention_bias` | q/k/v/o biases present (else zeros) |

Phi-3 (`Phi3ForCausalLM`, `Phi3Model`): fused qkv_proj and gate_up_proj split into their parts

| Hugging Face field | becomes |
|---|---|
| `vocab_size` | d_vocab |
| `hidden_size` | d_model |
| `num_hidden_layers` | n_layers |
| `num_attention_heads` | n_heads |
| `num_key_value_heads` | n_key_value_heads (None: num_attention_heads) |
| `head_dim` | d_head (None: hidden_size // num_attention_heads) |
| `intermediate_size` | d_mlp (gated_mlp=True) |
| `hidden_act` | act_fn (silu, gelu, gelu_new, gelu_pytorch_tanh, relu) |
| `max_position_embeddings` | n_ctx |
| `rms_norm_eps` | layer_norm_eps (normalization_type='RMS') |
| `rope_parameters` | rotary_base = rope_theta; rotary_dim = int(d_head * partial_rotary_factor); rope_type 'default' or 'llama3' |
| `tie_word_embeddings` | W_U = W_E^T when lm_head.weight is absent |
| `sliding_window` | window_size (None: full causal attention) |
| `original_max_position_embeddings` | read only by scaled rotary variants, which do not convert |

BERT and RoBERTa (`BertModel`, `RobertaModel`: no head, forward returns the last hidden state;
`BertForMaskedLM`, `RobertaForMaskedLM`: lm_head='mlm'; RoBERTa's position table starts at
pad_token_id + 1, so n_ctx = max_position_embeddings - pad_token_id - 1)

| Hugging Face field | becomes |
|---|---|
| `vocab_size` | d_vocab |
| `hidden_size` | d_model |
| `num_hidden_layers` | n_layers |
| `num_attention_heads` | n_heads (d_head = hidden_size // num_attention_heads) |
| `intermediate_size` | d_mlp |
| `hidden_act` | act_fn (gelu, gelu_new, gelu_pytorch_tanh, relu, silu) |
| `max_position_embeddings` | n_ctx (RoBERTa: minus pad_token_id + 1) |
| `type_vocab_size` | n_token_types |
| `layer_norm_eps` | layer_norm_eps |
| `pad_token_id` | pad_token_id |
| `tie_word_embeddings` | MLM head: W_U = W_E^T when the decoder weight is absent |
| `position_embedding_type` | must be 'absolute' |
| `is_decoder` | must be False |
| `add_cross_attention` | must be False |
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from interp.models.components import Attention, model_rotary_frequencies
from interp.models.config import GPTConfig
from interp.models.convert import bert, gpt2, llama, neox
from interp.models.convert.common import ConversionError, UnsupportedArchitecture, UnsupportedField, check_config_values
from interp.models.convert.files import WEIGHT_FILES, WeightFileError, read_folder_weights
from interp.models.encoder import HookedEncoder
from interp.models.gpt import HookedGPT

# Hugging Face class -> (model_type, converter module)
ARCHITECTURES: dict[str, tuple[str, Any]] = {
    "GPT2LMHeadModel": ("gpt2", gpt2), "GPT2Model": ("gpt2", gpt2),
    "GPTNeoXForCausalLM": ("gpt_neox", neox), "GPTNeoXModel": ("gpt_neox", neox),
    "LlamaForCausalLM": ("llama", llama), "LlamaModel": ("llama", llama),
    "MistralForCausalLM": ("mistral", llama), "MistralModel": ("mistral", llama),
    "Qwen2ForCausalLM": ("qwen2", llama), "Qwen2Model": ("qwen2", llama),
    "GemmaForCausalLM": ("gemma", llama), "GemmaModel": ("gemma", llama),
    "Phi3ForCausalLM": ("phi3", llama), "Phi3Model": ("phi3", llama),
    "BertModel": ("bert", bert), "BertForMaskedLM": ("bert", bert),
    "RobertaModel": ("roberta", bert), "RobertaForMaskedLM": ("roberta", bert),
}
# the class a folder is converted as when config.json names no architecture
_BASE_CLASS = {"gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM", "llama": "LlamaForCausalLM",
               "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma": "GemmaForCausalLM", "phi3": "Phi3ForCausalLM",
               "bert": "BertModel",
               "roberta": "RobertaModel"}

__all__ = ["ARCHITECTURES", "WEIGHT_FILES", "ConversionError", "UnsupportedArchitecture", "UnsupportedField", "WeightFileError",
           "architecture_of", "check_config_values", "convert", "convert_folder", "convert_model", "read_config", "read_folder_weights",
           "supported_architectures"]


def supported_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


def architecture_of(hf_config: Any, declared: str | None = None) -> str:
    """The Hugging Face class to convert as: `declared` (a model's class), else config.architectures[0]."""
    names = [declared] if declared else list(getattr(hf_config, "architectures", None) or [])
    if not names:
        names = [_BASE_CLASS.get(getattr(hf_config, "model_type", None) or "", "")]
    name = names[0]
    if name not in ARCHITECTURES or ARCHITECTURES[name][0] != getattr(hf_config, "model_type", None):
        raise UnsupportedArchitecture(
            f"architecture {name or '(none)'} (model_type {getattr(hf_config, 'model_type', None)!r}) has no "
            f"native converter; supported: {supported_architectures()}."
        )
    return name


def convert(hf_config: Any, tensors: dict[str, torch.Tensor], architecture: str | None = None) -> HookedGPT:
    """A HookedGPT / HookedEncoder from a Hugging Face config object and its state dict (eval mode)."""
    name = architecture_of(hf_config, architecture)
    family = ARCHITECTURES[name][1]
    check_config_values(hf_config)
    cfg = family.config(hf_config, name)
    state = family.state_dict(hf_config, cfg, tensors)
    return _build(*_tie_unembedding(hf_config, cfg, state))


def _tie_unembedding(hf_config: Any, cfg: GPTConfig, state: dict[str, torch.Tensor]
                     ) -> tuple[GPTConfig, dict[str, torch.Tensor]]:
    """A tied model (`tie_word_embeddings`) whose converted W_U is exactly W_E^T keeps one tensor
    (`GPTConfig.tie_word_embeddings`); a scaled embedding (Gemma's) or an untied head keeps its own W_U."""
    W_U, W_E = state.get("unembed.W_U"), state.get("embed.W_E")
    if (not getattr(hf_config, "tie_word_embeddings", False) or W_U is None or W_E is None
            or W_U.shape != W_E.T.shape or not torch.equal(W_U, W_E.T)):
        return cfg, state
    del state["unembed.W_U"]
    return dataclasses.replace(cfg, tie_word_embeddings=True), state


def _build(cfg: GPTConfig, state: dict[str, torch.Tensor]) -> HookedGPT:
    """Build on the meta device (no random initialisation to throw away), then take the converted tensors."""
    model_class = HookedEncoder if not cfg.causal else HookedGPT
    with torch.device("meta"):
        model = model_class(cfg)
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:  # a converter bug, not the user's: the mapping is ours
        raise RuntimeError(f"converter produced a state dict that does not fit {cfg.model_name}: "
                           f"missing {missing[:5]}, unexpected {unexpected[:5]}.")
    # one tensor at a time, each taken out of `state`: a view's source (a dequantised GGUF tensor) is freed as soon
    # as its contiguous copy exists, so the weights are never held twice
    model.load_state_dict({name: state.pop(name).contiguous() for name in list(state)}, assign=True)
    for module in model.modules():  # non-persistent buffers are still on meta
        if isinstance(module, Attention) and hasattr(module, "rotary_inv_freq"):
            module.rotary_inv_freq = model_rotary_frequencies(cfg).to(module.W_Q.device)
    model._apply(lambda t: t)  # record the real device and dtype on cfg
    try:
        model.check_weights()
    except ValueError as error:  # NaN or inf in the user's weights
        raise ConversionError(str(error)) from None
    return model.eval()


def convert_model(hf_model: Any) -> HookedGPT:
    """Convert an instantiated Hugging Face model (its tensors are copied, never shared; integer ones are refused)."""
    tensors = {k: v.detach().to(torch.float32 if v.dtype.is_floating_point else v.dtype, copy=True)
               for k, v in hf_model.state_dict().items()}
    return convert(hf_model.config, tensors, type(hf_model).__name__)


def read_config(folder: str | os.PathLike) -> Any:
    """The folder's config.json as a Hugging Face config object (read locally, never downloaded)."""
    from transformers import AutoConfig

    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise ConversionError(f"{folder} has no config.json; a Hugging Face model folder needs one.")
    try:
        document = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ConversionError(f"{folder}/config.json is not a JSON object ({error}); is the folder complete?") from None
    if not isinstance(document, dict):
        raise ConversionError(f"{folder}/config.json is not a JSON object (it holds a {type(document).__name__}).")
    try:
        return AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (ValueError, KeyError) as error:
        raise UnsupportedArchitecture(f"{folder}/config.json is not a config transformers knows: {error}") from None
    except Exception as error:  # huggingface_hub's StrictDataclassError: a field of the wrong type
        said = " ".join(str(error).split())
        raise ConversionError(f"{folder}/config.json holds an invalid value ({said}); fix it in config.json.") from None


def convert_folder(folder: str | os.PathLike) -> HookedGPT:
    """Convert a local Hugging Face folder (config.json + weights); the tokenizer is not needed."""
    hf_config = read_config(folder)
    name = architecture_of(hf_config)  # refuse before reading gigabytes of weights
    check_config_values(hf_config)
    return convert(hf_config, read_folder_weights(folder), name)
