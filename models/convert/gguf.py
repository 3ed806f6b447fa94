"""GGUF files (llama.cpp's format) converted into a `HookedGPT`, dequantized with the `gguf` package.

A GGUF holds a model's hyperparameters as metadata and its weights as tensors, most of them
quantised in blocks (Q4_1: 32 weights as 4-bit integers with a float16 scale and minimum). Each
tensor is dequantised to float32 when the converter asks for it, renamed to the Hugging Face name,
and handed to the native Llama / Qwen2 converter (`interp.models.convert.llama`), so a GGUF model
is the same `HookedGPT`, with the same hooks, as the model saved by `transformers`; no folder is
written in between and no second copy of the weights is kept.

Architectures: `llama` (Llama, Mistral, SmolLM2 and other files llama.cpp writes as llama) and
`qwen2`. llama.cpp's converter permutes the rows of each Llama head's query and key projections
(its rotary kernel rotates adjacent pairs, Hugging Face's rotates the two halves of a head): those
rows are put back here. Qwen2 files are written unpermuted (llama.cpp rotates them NeoX-style).

| GGUF metadata (`ARCH.` + key) | becomes (Hugging Face config) |
|---|---|
| `block_count` | num_hidden_layers |
| `embedding_length` | hidden_size |
| `feed_forward_length` | intermediate_size |
| `attention.head_count` | num_attention_heads |
| `attention.head_count_kv` | num_key_value_heads (absent: num_attention_heads) |
| `attention.key_length` | head_dim (absent: embedding_length // head_count) |
| `attention.layer_norm_rms_epsilon` | rms_norm_eps |
| `context_length` | max_position_embeddings |
| `rope.freq_base` | rope_theta (absent: 10000) |
| `rope.dimension_count` | must equal head_dim (partial rotary does not convert) |
| `rope.scaling.type` | must be 'none' (scaled rotary does not convert) |
| `vocab_size` | vocab_size (absent: the number of `tokenizer.ggml.tokens`) |
| `expert_count` | must be absent or 0 (mixtures of experts do not convert) |
| no `output.weight` tensor | tie_word_embeddings |
| `blk.N.attn_q.bias` present | attention_bias (Llama; Qwen2 always has q/k/v biases) |

Refused with a `ConversionError` naming what: another architecture (`UnsupportedArchitecture`), a
split file (`split.count` > 1: merge the parts first), a truncated file, a tensor type `gguf`
cannot dequantise, or an integer tensor where a weight belongs.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import einops
import numpy as np
import torch

from interp.models.convert.common import (
    ConversionError,
    UnsupportedArchitecture,
    UnsupportedField,
)

# GGUF architecture -> (Hugging Face model_type, class converted as)
ARCHITECTURES = {"llama": ("llama", "LlamaForCausalLM"), "qwen2": ("qwen2", "Qwen2ForCausalLM")}
# a tensor of block N: its GGUF name after `blk.N.` -> its Hugging Face name after `model.layers.N.`
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight", "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.weight": "mlp.down_proj.weight", "ffn_down.bias": "mlp.down_proj.bias",
}
MODEL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
_SPLIT_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
FLOAT_TYPES = ("F32", "F16", "BF16")  # stored as plain floats; every other float type is blocks of quantised values


@dataclass
class GGUFInfo:
    """What a GGUF file is, for load notes and model cards: its name, architecture and quantisation."""

    path: Path
    architecture: str  # the GGUF architecture ("llama", "qwen2")
    name: str | None  # general.name
    file_type: str  # the file's nominal quantisation (general.file_type), e.g. "Q4_1"
    tensor_types: dict[str, int] = field(default_factory=dict)  # ggml type name -> number of tensors
    metadata: dict[str, Any] = field(default_factory=dict)  # scalar metadata (no token lists)

    def describe(self) -> str:
        """e.g. "Q4_1 (210 tensors Q4_1, 61 F32, 1 Q8_0)"."""
        counts = ", ".join(f"{n} {kind}" for kind, n in sorted(self.tensor_types.items(), key=lambda kv: -kv[1]))
        return f"{self.file_type} ({counts} tensors)"


def sha256(path: str | os.PathLike[str]) -> str:
    """The file's SHA-256, read in 8 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 23), b""):
            digest.update(chunk)
    return digest.hexdigest()


def open_gguf(path: str | os.PathLike[str]) -> Any:
    """A `gguf.GGUFReader` on the file (memory-mapped), refused with a `ConversionError` when the file is
    not a whole, single-part GGUF."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"{path} is not a file; a GGUF model is one .gguf file.")
    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ConversionError(f"{path} is not a GGUF file: it does not start with the GGUF magic bytes. Pass a .gguf "
                                  "file llama.cpp wrote (or a Hugging Face folder).")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError) as error:
        raise ConversionError(
            f"{path} is a GGUF file that cannot be read to its end ({type(error).__name__}: {error}): it is truncated "
            "or corrupt. Download or copy it again."
        ) from None
    _check_complete(reader, path)
    _check_single_part(reader, path)
    return reader


def _check_complete(reader: Any, path: Path) -> None:
    """Every tensor's bytes lie inside the file (a truncated download ends in the data section)."""
    size = path.stat().st_size
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size or tensor.data.nbytes != int(tensor.n_bytes):
            raise ConversionError(
                f"{path} is truncated: tensor {tensor.name!r} needs bytes up to {end:,} but the file has {size:,}. "
                "Download or copy it again."
            )


def _check_single_part(reader: Any, path: Path) -> None:
    count = _scalar(reader, "split.count")
    named = _SPLIT_NAME.search(path.name)
    if (count is not None and int(count) > 1) or named:
        part = f"part {int(_scalar(reader, 'split.no') or 0) + 1} of {int(count)}" if count else \
            f"part {int(named.group(1))} of {int(named.group(2))}" if named else "one part"
        raise ConversionError(
            f"{path} is {part} of a split GGUF model; split files do not load one by one. Merge the parts into one "
            "file with llama.cpp's `llama-gguf-split --merge FIRST-PART.gguf merged.gguf`, then load merged.gguf."
        )


def _scalar(reader: Any, key: str) -> Any:
    """A scalar or string metadata value, or None when the file does not have the key."""
    found = reader.get_field(key)
    if found is None:
        return None
    value = found.contents()
    return value


def read_info(reader: Any, path: str | os.PathLike[str]) -> GGUFInfo:
    """Architecture, name and quantisation of an opened file."""
    import gguf

    architecture = _scalar(reader, "general.architecture")
    file_type = _scalar(reader, "general.file_type")
    try:
        file_type_name = gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:
        file_type_name = None
    types = Counter(t.tensor_type.name for t in reader.tensors)
    metadata = {key: _scalar(reader, key) for key, value in reader.fields.items()
                if not key.startswith(("tokenizer.ggml.", "GGUF.")) and len(value.data) <= 1}
    return GGUFInfo(Path(path), str(architecture), _scalar(reader, "general.name"),
                    file_type_name or (types.most_common(1)[0][0] if types else "unknown"), dict(types), metadata)


def hf_config(reader: Any, path: Path) -> Any:
    """The Hugging Face config (LlamaConfig / Qwen2Config) the file's metadata describes."""
    import transformers

    architecture = _scalar(reader, "general.architecture")
    if architecture not in ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"{path} holds a GGUF model of architecture {architecture!r}; GGUF files convert natively for "
            f"{sorted(ARCHITECTURES)} only. Load the original Hugging Face folder of this model instead."
        )
    model_type, class_name = ARCHITECTURES[architecture]

    def key(name: str, default: Any = ConversionError) -> Any:
        value = _scalar(reader, f"{architecture}.{name}")
        if value is None and default is ConversionError:
            raise ConversionError(f"{path} has no metadata {architecture}.{name}, which a {architecture} GGUF needs; "
                                  "the file is incomplete. Download or convert it again.")
        return default if value is None else value

    _refuse_unconverted(reader, path, architecture, key)
    heads = int(key("attention.head_count"))
    d_model = int(key("embedding_length"))
    d_head = int(key("attention.key_length", d_model // heads))
    rotary = int(key("rope.dimension_count", d_head))
    if rotary != d_head:
        raise UnsupportedField(f"{path}: {architecture}.rope.dimension_count={rotary} rotates part of each head "
                               f"(head dimension {d_head}); partial rotary GGUF files do not convert.")
    names = {t.name for t in reader.tensors}
    tokens = reader.get_field("tokenizer.ggml.tokens")
    vocab = key("vocab_size", len(tokens.data) if tokens is not None else None)
    if vocab is None:
        raise ConversionError(f"{path} states neither {architecture}.vocab_size nor tokenizer.ggml.tokens; the file is "
                              "incomplete. Download or convert it again.")
    fields = dict(
        vocab_size=int(vocab), hidden_size=d_model, intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=int(key("block_count")), num_attention_heads=heads,
        num_key_value_heads=int(key("attention.head_count_kv", heads)), hidden_act="silu",
        max_position_embeddings=int(key("context_length")), rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_parameters={"rope_type": "default", "rope_theta": float(key("rope.freq_base", 10000.0))},
        tie_word_embeddings="output.weight" not in names, architectures=[class_name],
    )
    if model_type == "llama":
        fields.update(attention_bias="blk.0.attn_q.bias" in names, mlp_bias="blk.0.ffn_up.bias" in names,
                      head_dim=d_head)
    return transformers.AutoConfig.for_model(model_type, **fields)


def _refuse_unconverted(reader: Any, path: Path, architecture: str, key: Callable[..., Any]) -> None:
    """Mixtures of experts, scaled rotary and tensors no converter reads: named, never silently dropped."""
    experts = key("expert_count", 0)
    if experts:
        raise UnsupportedField(f"{path}: {architecture}.expert_count={experts}; mixture-of-experts GGUF files do not "
                               "convert natively.")
    scaling = key("rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise UnsupportedField(f"{path}: {architecture}.rope.scaling.type={scaling!r}; only unscaled rotary "
                               "('none') converts from GGUF. Load the original Hugging Face folder instead.")
    unknown = sorted(t.name for t in reader.tensors if hf_name(t.name) is None)
    if unknown:
        why = " (rope_freqs holds Llama 3's rotary scaling, which does not convert from GGUF)" \
            if "rope_freqs.weight" in unknown else ""
        raise UnsupportedField(f"{path} holds tensors no {architecture} converter reads: {unknown[:5]}{why}. "
                               "Load the original Hugging Face folder instead.")


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`)."""
    if gguf_name in MODEL_TENSORS:
        return MODEL_TENSORS[gguf_name]
    block = _BLOCK.match(gguf_name)
    if block and block.group(2) in LAYER_TENSORS:
        return f"model.layers.{block.group(1)}.{LAYER_TENSORS[block.group(2)]}"
    return None


def unpermute(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a Llama query / key projection (or bias) from llama.cpp's order back to Hugging Face's.

    llama.cpp stores each head's rows as (pair, 2) so that rotary rotates adjacent rows; Hugging Face
    stores them as (2, half) and rotates the two halves. (head d_head) x ... in both."""
    return einops.rearrange(weight, "(head half pair) ... -> (head pair half) ...", head=n_heads, pair=2)


class DequantizedTensors(Mapping[str, torch.Tensor]):
    """Hugging Face name -> float32 tensor, dequantised from the file when read and not kept: the converter
    reads each tensor once, so the float32 weights exist once (plus the tensor being converted).

    `progress(done, total)` is called after each tensor is dequantised."""

    def __init__(self, reader: Any, path: Path, config: Any, architecture: str,
                 progress: Callable[[int, int], None] | None = None):
        self.path, self.config, self.architecture, self.progress = path, config, architecture, progress
        self.sources = {name: tensor for tensor in reader.tensors if (name := hf_name(tensor.name)) is not None}
        self.done: set[str] = set()

    def __iter__(self) -> Iterator[str]:
        return iter(self.sources)

    def __len__(self) -> int:
        return len(self.sources)

    def __contains__(self, name: object) -> bool:
        return name in self.sources

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor = self.sources[name]
        weight = self._dequantize(tensor)
        if self.architecture == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = self.config.num_attention_heads if ".q_proj." in name else self.config.num_key_value_heads
            weight = unpermute(weight, heads)
        self.done.add(name)
        if self.progress is not None:
            self.progress(len(self.done), len(self.sources))
        return weight

    def _dequantize(self, tensor: Any) -> torch.Tensor:
        import gguf

        kind = tensor.tensor_type.name
        try:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise ConversionError(
                f"{self.path}: tensor {tensor.name!r} is stored as {kind}, which the installed gguf "
                f"{_version('gguf')} cannot dequantise; re-quantise the model to a type gguf reads (e.g. Q8_0 or "
                "Q4_K) or load the original Hugging Face folder."
            ) from None
        if not np.issubdtype(values.dtype, np.floating) or kind.startswith("I"):
            raise ConversionError(f"{self.path}: tensor {tensor.name!r} is stored as {kind} (integers); weights must be "
                                  "floating point or quantised floats. The file is not a model llama.cpp writes.")
        if kind in FLOAT_TYPES or not values.flags.writeable:  # a view into the read-only file map: copy it out
            values = np.array(values, dtype=np.float32)
        return torch.from_numpy(values.astype(np.float32, copy=False))


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "(not installed)"


def check_quantisations(reader: Any, path: Path) -> None:
    """Refuse, before dequantising anything, a file with tensor types the installed gguf cannot dequantise."""
    import gguf

    unreadable: dict[str, str] = {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type
        if kind.name in unreadable or kind.name in FLOAT_TYPES:
            continue
        block, size = gguf.GGML_QUANT_SIZES[kind]
        try:
            gguf.quants.dequantize(np.zeros((1, size), dtype=np.uint8), kind)
        except NotImplementedError:
            unreadable[kind.name] = tensor.name
        except (ValueError, TypeError):
            continue  # a plain type dequantised as a view: readable
    if unreadable:
        shown = ", ".join(f"{kind} (e.g. {name!r})" for kind, name in unreadable.items())
        raise ConversionError(
            f"{path} holds tensors of types the installed gguf {_version('gguf')} cannot dequantise: {shown}. Re-quantise "
            "the model to a type gguf reads (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants, IQ types) "
            "or load the original Hugging Face folder."
        )


def convert_gguf(path: str | os.PathLike[str], progress: Callable[[int, int], None] | None = None) -> tuple[Any, GGUFInfo]:
    """(HookedGPT, GGUFInfo) from a GGUF file: checked, dequantised tensor by tensor, converted natively."""
    from interp.models.convert import convert

    path = Path(path)
    reader = open_gguf(path)
    config = hf_config(reader, path)
    check_quantisations(reader, path)
    architecture = str(_scalar(reader, "general.architecture"))
    tensors = DequantizedTensors(reader, path, config, architecture, progress)
    try:
        model = convert(config, tensors, ARCHITECTURES[architecture][1])  # type: ignore[arg-type]
    except ConversionError as error:
        said = str(error).replace("this config.json", "the GGUF metadata").replace("config.json", "the GGUF metadata")
        raise type(error)(f"{path}: {said}") from None
    return model, read_info(reader, path)
