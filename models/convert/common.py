"""What every family converter shares: errors, the field check, reading tensors by name and shape."""
from __future__ import annotations

import math
import re
from typing import Any, Callable

import einops
import torch

from interp.models.config import ActFn


class ConversionError(ValueError):
    """A Hugging Face model that cannot be converted as given (config field, weights, folder)."""


class UnsupportedArchitecture(ConversionError):
    """An architecture no converter handles; `interp.load` falls back to the bridge on this one."""


class UnsupportedField(ConversionError):
    """A config field the converter cannot honour; `interp.load` (backend auto) falls back to the bridge."""


# fields that never change an eval-mode forward pass: training, generation, labels, bookkeeping
_IGNORED = {
    "transformers_version", "architectures", "_name_or_path", "model_type", "dtype", "torch_dtype",
    "output_hidden_states", "output_attentions", "return_dict", "id2label", "label2id", "problem_type",
    "use_cache", "initializer_range", "gradient_checkpointing", "tokenizer_class", "prefix",
    "task_specific_params", "finetuning_task", "chunk_size_feed_forward", "_attn_implementation_autoset",
    "use_return_dict", "transformers.js_config",
}
# allowed only at these values in every family (cross-attention and encoder-decoder models are other models)
_ACCEPTED_ALL = {"is_encoder_decoder": (False,), "add_cross_attention": (False,), "tie_encoder_decoder": (False,)}
DECODER = {"is_decoder": (True, False)}  # a causal decoder is one whatever this flag says
_IGNORED_PATTERN = re.compile(r"(dropout|pdrop|_token_id$|token_ids$|^summary_|initializer|^classifier)")


def check_fields(hf_config: Any, family: str, supported: dict[str, str], accepted: dict[str, tuple]) -> None:
    """Raise naming the first config field this converter cannot honour.

    `supported`: fields the converter reads (any value it accepts is checked by the converter);
    `accepted`: fields allowed only at the listed values (e.g. is_decoder False). Every other
    field must hold its default (or be one of the known no-ops of an eval forward: dropout,
    token ids, labels, bookkeeping)."""
    values = hf_config.to_dict()
    defaults = type(hf_config)().to_dict()
    accepted = {**_ACCEPTED_ALL, **accepted}
    for name, value in sorted(values.items()):
        if name in supported:
            continue
        if name in accepted:
            if value not in accepted[name]:
                raise UnsupportedField(
                    f"unsupported {family} config field {name}={value!r}: the native converter needs one of "
                    f"{list(accepted[name])}. Load with backend='bridge' to use TransformerBridge instead."
                )
            continue
        if name in _IGNORED or name.startswith("_") or _IGNORED_PATTERN.search(name):  # `_...`: metadata (_name_or_path)
            continue
        if name in defaults and _same(value, defaults[name]):
            continue
        if name not in defaults and (value is None or value is False):
            continue  # a switch this version of the config does not know, left off (e.g. Qwen2's use_mrope)
        raise UnsupportedField(
            f"unsupported {family} config field {name}={value!r} (default {defaults.get(name, 'absent')!r}): "
            f"the native converter reads {sorted(supported)} and cannot honour this one. "
            "Load with backend='bridge' to use TransformerBridge instead."
        )


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # tensors or odd objects: treat as different
        return False


# sizes that must be positive integers wherever a config has them (None: "the default", where a family allows it)
POSITIVE_SIZES = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "hidden_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings")
_MAY_BE_NONE = {"n_inner", "num_key_value_heads", "head_dim"}
_EPSILON = re.compile(r"(^|_)(eps|epsilon)$")  # layer_norm_eps, rms_norm_eps, layer_norm_epsilon


def check_config_values(hf_config: Any) -> None:
    """Raise naming the first size that is not a positive integer or epsilon that is not a positive finite number.

    Checked on every route (a negative epsilon makes every output NaN; n_head=0 divides by zero):
    the config is the user's file, so the error says to fix config.json."""
    values = hf_config.to_dict()
    for name in POSITIVE_SIZES:
        value = values.get(name)
        if name in values and not (value is None and name in _MAY_BE_NONE) and not _positive_int(value):
            raise ConversionError(f"config field {name}={value!r} must be a positive integer; fix it in config.json.")
    for name, value in sorted(values.items()):
        if _EPSILON.search(name) and value is not None and not _positive_finite(value):
            raise ConversionError(f"config field {name}={value!r} must be a positive finite number (the norm divides "
                                  "by sqrt(variance + eps)); fix it in config.json (1e-5 is usual).")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _positive_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


LLAMA3_ROPE = {"factor": "NTK_by_parts_factor", "low_freq_factor": "NTK_by_parts_low_freq_factor",
               "high_freq_factor": "NTK_by_parts_high_freq_factor", "original_max_position_embeddings": "NTK_original_ctx_len"}


def rope(hf_config: Any, family: str, *, partial: bool, scaled: dict | None = None) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) of a rotary config; raise on a scaling we do not convert.

    With `scaled` (a dict), Llama 3's rope_type 'llama3' is accepted and its parameters are
    written into `scaled` under our config's field names."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_type = params.pop("rope_type", "default")
    theta = float(params.pop("rope_theta", 10000.0))
    factor = float(params.pop("partial_rotary_factor", 1.0))
    if rope_type == "llama3" and scaled is not None and all(k in params for k in LLAMA3_ROPE):
        scaled.update({ours: params.pop(theirs) for theirs, ours in LLAMA3_ROPE.items()}, use_NTK_by_parts_rope=True)
    elif rope_type != "default":
        raise UnsupportedField(
            f"unsupported {family} config field rope_parameters.rope_type={rope_type!r}: only unscaled rotary "
            f"('default'){' and llama3' if scaled is not None else ''} convert natively. Load with backend='bridge' instead."
        )
    if params or (factor != 1.0 and not partial):
        extra = params or {"partial_rotary_factor": factor}
        raise UnsupportedField(f"unsupported {family} rope_parameters {extra}; supported: rope_theta"
                              f"{', partial_rotary_factor' if partial else ''}, rope_type='default'.")
    return theta, factor


class Weights:
    """A Hugging Face state dict read by name, each tensor checked against the shape the config implies.

    Names are tried with and without the base model's prefix (`transformer.`, `model.`...), so
    a bare base model and one with a task head both read. `leftover()` names the tensors never used."""

    def __init__(self, tensors: dict[str, torch.Tensor], prefix: str, ignorable: tuple[str, ...] = ()):
        self.tensors = tensors
        self.prefix = prefix
        self.used: set[str] = set()
        self.ignorable = re.compile("|".join(ignorable)) if ignorable else None

    def key(self, name: str) -> str | None:
        for candidate in (self.prefix + name, name):
            if candidate in self.tensors:
                return candidate
        return None

    def has(self, name: str) -> bool:
        return self.key(name) is not None

    def take(self, name: str, shape: tuple[int, ...], why: str) -> torch.Tensor:
        """The tensor `name` as float32, raising if it is absent or its shape is not `shape`."""
        key = self.key(name)
        if key is None:
            raise ConversionError(
                f"weights have no tensor {self.prefix + name!r} (nor {name!r}), which the config implies; "
                "the weights do not belong to this config.json."
            )
        tensor = self.tensors[key]
        if not tensor.dtype.is_floating_point:
            raise ConversionError(
                f"tensor {key!r} is {tensor.dtype}; weights must be floating point (float32, float16, bfloat16): cast "
                "to float, integer weights would make another model (a quantised checkpoint? dequantise it first)."
            )
        if tuple(tensor.shape) != tuple(shape):
            raise ConversionError(
                f"tensor {key!r} has shape {tuple(tensor.shape)} but the config ({why}) implies {tuple(shape)}; "
                "the weights do not match config.json."
            )
        self.used.add(key)
        return tensor.detach().to(torch.float32)

    def leftover(self) -> list[str]:
        return sorted(k for k in self.tensors if k not in self.used
                      and not (self.ignorable and self.ignorable.search(k)))

    def check_all_used(self) -> None:
        extra = self.leftover()
        if extra:
            raise ConversionError(
                f"weights hold {len(extra)} tensors the config does not account for, e.g. {extra[:4]}; "
                "the weights do not match config.json (more layers or heads than it says?)."
            )


def per_head_in(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """An nn.Linear weight (head * d_head, d_model) -> (head, d_model, d_head)."""
    return einops.rearrange(weight, "(head d_head) d_model -> head d_model d_head", head=n_heads)


def per_head_bias(bias: torch.Tensor, n_heads: int) -> torch.Tensor:
    return einops.rearrange(bias, "(head d_head) -> head d_head", head=n_heads)


def per_head_out(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """An nn.Linear output weight (d_model, head * d_head) -> (head, d_head, d_model)."""
    return einops.rearrange(weight, "d_model (head d_head) -> head d_head d_model", head=n_heads)


def optional_bias(weights: Weights, name: str, size: int, present: bool, why: str) -> torch.Tensor:
    """A bias the architecture may omit: read when the config says it exists, zeros otherwise."""
    return weights.take(name, (size,), why) if present else torch.zeros(size)


def kv_names(group: int) -> tuple[str, str, str, str]:
    """Our parameter names for the key/value weights (grouped-query attention stores kv heads as `_W_K`...)."""
    p = "_" if group > 1 else ""
    return f"{p}W_K", f"{p}W_V", f"{p}b_K", f"{p}b_V"


Converter = Callable[[Any, dict[str, torch.Tensor], str], tuple[Any, dict[str, torch.Tensor]]]

# Hugging Face activation name -> ours (gelu_new and gelu_pytorch_tanh are both the tanh approximation)
ACTIVATIONS: dict[str, ActFn] = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new",
                                 "relu": "relu", "silu": "silu", "swish": "silu"}


def activation(name: Any, family: str, field: str) -> ActFn:
    if name not in ACTIVATIONS:
        raise UnsupportedField(f"unsupported {family} config field {field}={name!r}; supported: {sorted(ACTIVATIONS)}.")
    return ACTIVATIONS[name]
