"""Checks of a model transformers built from a local folder (the sdpa and bridge routes of `interp.load`).

transformers initialises a tensor missing from the file at random, reinitialises one of the wrong
shape (with `ignore_mismatched_sizes`), drops one the model has no place for and casts integer
tensors into float parameters, each with only a log line. Here each is a `CheckpointError`
(exit 2) naming the folder and the tensors, so a folder that loads is the model its files hold:

- before loading, `check_folder`: config values (`interp.models.convert.check_values`) and the weight
  files (confined to the folder, readable: `interp.models.convert.files`);
- after loading, `check_loaded` on transformers' own loading report (`output_loading_info=True`),
  and on the weights themselves (finite, not cast from integers).
  When the bridge builds another class than the folder declares (MiniLM's `BertModel` booted as
  `BertForMaskedLM`, `head_is_random`), the task head's tensors may be missing or dropped: only
  the base model's must all come from the file.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from torch import nn

from interp.errors import CheckpointError

# tensors a checkpoint may carry that no model parameter holds: causal-mask and rotary buffers, position ids
_IGNORABLE = re.compile(r"(rotary_emb\.inv_freq|attn\.bias|attn\.masked_bias|position_ids)$")
_FIX = "The folder's weights do not match its config.json: copy the folder again, or fix config.json."


@dataclass(frozen=True)
class Loaded:
    """What `check_loaded` needs of one from_pretrained, taken at once (the bridge then renames the modules)."""

    built: str  # the class transformers built
    base: str  # its base model's prefix with a dot ('transformer.'), '' for a base model
    info: dict[str, Any]  # transformers' loading report: missing_keys, unexpected_keys, mismatched_keys
    floating: frozenset[str]  # state-dict names of its floating-point tensors
    nonfinite: tuple[str, ...]  # parameters holding NaN or inf

    @classmethod
    def of(cls, model: nn.Module, info: dict[str, Any]) -> Loaded:
        import torch

        state = model.state_dict()
        floating = frozenset(k for k, v in state.items() if v.dtype.is_floating_point)
        nonfinite = tuple(k for k in sorted(floating) if not torch.isfinite(state[k].sum()) and not torch.isfinite(state[k]).all())
        return cls(type(model).__name__, _base_prefix(model), info, floating, nonfinite)


def check_folder(folder: Path) -> dict[str, tuple[str, Path]]:
    """Refuse bad config values and unreadable or out-of-folder weight files; tensor name -> (dtype, file)."""
    from interp.models.convert import ConversionError, UnsupportedArchitecture, check_config_values, read_config
    from interp.models.convert.files import file_dtypes

    try:
        try:
            check_config_values(read_config(folder))
        except UnsupportedArchitecture:
            pass  # a config our converters do not read: transformers says what it makes of it
        return file_dtypes(folder)
    except ConversionError as error:
        raise CheckpointError(str(error) if str(folder) in str(error) else f"{folder}: {error}") from None


@contextlib.contextmanager
def recorded_loads() -> Iterator[list[Loaded]]:
    """Within: every `PreTrainedModel.from_pretrained` returns as asked, and records what it loaded (`Loaded`).

    Mismatched shapes are reported rather than raised (`ignore_mismatched_sizes=True`), so that
    `check_loaded` can name them. For the bridge, which calls from_pretrained itself."""
    from transformers import PreTrainedModel

    original = PreTrainedModel.__dict__["from_pretrained"]
    records: list[Loaded] = []

    def from_pretrained(cls, *args, **kwargs):
        wanted = kwargs.pop("output_loading_info", False)
        kwargs.setdefault("ignore_mismatched_sizes", True)
        model, info = original.__func__(cls, *args, output_loading_info=True, **kwargs)
        records.append(Loaded.of(model, info))
        return (model, info) if wanted else model

    # setattr: a method patched on the class for the block (mypy refuses an assignment to a method)
    setattr(PreTrainedModel, "from_pretrained", classmethod(from_pretrained))  # noqa: B010
    try:
        yield records
    finally:
        setattr(PreTrainedModel, "from_pretrained", original)  # noqa: B010


def check_loaded(loaded: Loaded, folder: Path, dtypes: dict[str, tuple[str, Path]], declared: list[str]) -> None:
    """Refuse a model with a tensor not from the file, of the wrong shape, dropped from the file, or cast from integers."""
    built, base, info = loaded.built, loaded.base, loaded.info
    other_class = bool(declared) and built not in declared  # the bridge chose another head: it may be random
    mismatched = sorted((str(k), tuple(a), tuple(b)) for k, a, b in info.get("mismatched_keys") or ())
    if mismatched:
        shown = "; ".join(f"{k}: {a} in the file, {b} in the model" for k, a, b in mismatched[:5])
        raise CheckpointError(f"{folder}: tensors of the wrong shape for the {built} that config.json describes: "
                              f"{shown}. {_FIX}")
    missing = sorted(k for k in info.get("missing_keys") or () if not (other_class and not k.startswith(base)))
    if missing:
        raise CheckpointError(f"{folder}: the {built} built from config.json needs {missing[:6]}"
                              f"{f' (and {len(missing) - 6} more)' if len(missing) > 6 else ''}, which are not in the "
                              f"file: transformers would initialise them at random. {_FIX}")
    unexpected = sorted(k for k in info.get("unexpected_keys") or () if not _IGNORABLE.search(k))
    if unexpected and not other_class:
        raise CheckpointError(f"{folder}: the file holds {unexpected[:6]}, but the {built} built from config.json has "
                              "no such tensors (transformers would drop them). " + _FIX)
    _check_float(loaded, folder, dtypes)
    if loaded.nonfinite:
        raise CheckpointError(f"{folder}: non-finite weights (NaN or inf) in {list(loaded.nonfinite[:8])}; fix or re-train "
                              "the model before analysing it.")


def _base_prefix(model: nn.Module) -> str:
    """'transformer.' for a model with a head around its base model, '' for a base model itself."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    inner = getattr(model, prefix, None) if prefix else None
    return f"{prefix}." if inner is not None and inner is not model else ""


def _check_float(loaded: Loaded, folder: Path, dtypes: dict[str, tuple[str, Path]]) -> None:
    """Refuse an integer tensor of the file that the model holds as a floating-point parameter."""
    from interp.models.convert.files import is_integer_dtype

    prefix = loaded.base
    for name, (dtype, path) in sorted(dtypes.items()):
        if not is_integer_dtype(dtype):
            continue
        for key in (name, prefix + name, name.removeprefix(prefix)):
            if key in loaded.floating:
                raise CheckpointError(
                    f"{folder}: tensor {name!r} is stored as {_dtype_name(dtype)} in {path.name}, but the model holds it "
                    "as a floating-point parameter: transformers would cast the integers to float, another model "
                    "(a quantised checkpoint? dequantise it first). Re-save the weights in a floating dtype."
                )


def _dtype_name(dtype: str) -> str:
    """'I32' (safetensors) or 'torch.int32' -> 'int32'."""
    text = dtype.removeprefix("torch.")
    names = {"I": "int", "U": "uint", "F": "float"}
    return names[text[0]] + text[1:] if text[:1] in names and text[1:].isdigit() else text.lower()


def from_pretrained_checked(model_class: Any, folder: Path) -> nn.Module:
    """`model_class.from_pretrained(folder)` offline, refused unless every tensor came from the folder's files."""
    import json

    dtypes = check_folder(folder)
    declared = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    try:
        model, info = model_class.from_pretrained(str(folder), local_files_only=True, output_loading_info=True,
                                                  ignore_mismatched_sizes=True)
    except Exception as error:  # the user's folder: say which, and what transformers said
        raise CheckpointError(f"{folder}: transformers could not load this Hugging Face folder: "
                              f"{type(error).__name__}: {error}") from error
    check_loaded(Loaded.of(model, info), folder, dtypes, declared)
    return model.eval()
