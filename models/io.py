"""Checkpoints: weights in safetensors, config in JSON beside them. Nothing is ever unpickled.

A checkpoint `NAME` is two files, `NAME.safetensors` and `NAME.json`; the JSON holds the
config (with its `architecture`) and free-form metadata (how the model was made).
Save then load is bit-exact.

The safetensors header also records the config the weights were saved with
(`CONFIG_KEY`, canonical JSON) and its SHA-256 (`FINGERPRINT_KEY`). At load, the JSON config
must describe the same model: an edit that keeps every tensor shape (`architecture`,
`act_fn`, `layer_norm_eps`, ...) would otherwise load silently as a different model (a causal
checkpoint as a bidirectional one). Checkpoints saved before the fingerprint load with a note
in `model.load_notes`.

The header also records a SHA-256 of the tensors themselves (`TENSORS_KEY`: each tensor's name, dtype,
shape and bytes, in name order), checked at load: flipped bytes in the weights (a bad copy, a bad disk)
are refused instead of loading as another model. Checkpoints saved before the digest load unchecked.

The JSON's metadata is read with the config: a BOS id it records (`bos`, `bos_token` or `bos_token_id`, at
its top level or one level down, where prompt building looks) must be a token of the vocabulary; a
tokenizer it carries (`metadata.tokenizer`, {"kind": "bpe", "json": ...}) that cannot be rebuilt leaves the
model without one and says why in `load_notes`, as does a BPE-trained checkpoint (`metadata.recipe`) that
carries none (text prompts then need token ids).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from interp.models.config import EncoderConfig, GPTConfig
from interp.models.encoder import HookedEncoder
from interp.models.files import write_atomic
from interp.models.gpt import HookedGPT
from interp.models.tokenizers import shipped_tokenizer

ARCHITECTURES = {"GPTConfig": (GPTConfig, HookedGPT), "EncoderConfig": (EncoderConfig, HookedEncoder)}
CONFIG_KEY = "interp.config"  # safetensors metadata: the config the weights were saved with (canonical JSON)
FINGERPRINT_KEY = "interp.config_sha256"  # safetensors metadata: SHA-256 of that JSON
TENSORS_KEY = "interp.tensors_sha256"  # safetensors metadata: SHA-256 of the tensors (`tensors_digest`)
BOS_KEYS = ("bos", "bos_token", "bos_token_id")  # where a checkpoint's metadata records its BOS id


class CheckpointFileError(ValueError):
    """A checkpoint that cannot be read, or whose JSON config does not describe its weights. `interp.load` raises
    it as `interp.errors.CheckpointError` (a ModelError, exit 2); models/ imports nothing above it."""


def canonical_config(config: dict[str, Any]) -> str:
    """The config as canonical JSON (sorted keys, no spaces): what the fingerprint hashes."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def config_fingerprint(config: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a config dict."""
    return hashlib.sha256(canonical_config(config).encode()).hexdigest()


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the tensors in name order: each one's name, dtype, shape and raw bytes."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)  # the bytes, without a copy
    return digest.hexdigest()


def checkpoint_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """(weights, config) paths for a checkpoint given as NAME, NAME.safetensors or NAME.json."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in (".safetensors", ".json") else path
    return stem.with_name(stem.name + ".safetensors"), stem.with_name(stem.name + ".json")


def save_checkpoint(model: HookedGPT, path: str | os.PathLike, metadata: dict[str, Any] | None = None) -> Path:
    """Save a HookedGPT / HookedEncoder as NAME.safetensors + NAME.json; returns the weights path."""
    weights_path, config_path = checkpoint_paths(path)
    weights_path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    config = model.cfg.to_dict()
    document = {"config": config, "metadata": metadata or {}}
    header = {CONFIG_KEY: canonical_config(config), FINGERPRINT_KEY: config_fingerprint(config),
              TENSORS_KEY: tensors_digest(tensors)}
    write_atomic(weights_path, lambda tmp: save_file(tensors, str(tmp), metadata=header))
    write_atomic(config_path, json.dumps(document, indent=2, sort_keys=True) + "\n")
    return weights_path


def read_checkpoint_config(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON document of a checkpoint: {"config": {...}, "metadata": {...}}."""
    _, config_path = checkpoint_paths(path)
    if not config_path.exists():
        raise FileNotFoundError(f"checkpoint config {config_path} not found; a checkpoint is NAME.safetensors + NAME.json.")
    try:
        document = json.loads(config_path.read_text())
    except (json.JSONDecodeError, RecursionError) as error:
        why = "nested too deeply to read" if isinstance(error, RecursionError) else str(error)
        raise CheckpointFileError(f"{config_path} is not valid JSON: {why}") from None
    except UnicodeDecodeError as error:
        raise CheckpointFileError(f"{config_path} is not UTF-8 text ({error.reason}); is it the weights file?") from None
    if not isinstance(document, dict) or not isinstance(document.get("config"), dict):
        found = "no 'config' entry" if not isinstance(document, dict) or "config" not in document else \
            f"'config': {document['config']!r}, not an object"
        raise CheckpointFileError(f"{config_path} has {found}; expected {{\"config\": {{...}}, \"metadata\": {{...}}}}.")
    if not isinstance(document.get("metadata", {}), dict):
        raise CheckpointFileError(f"{config_path}: 'metadata' is {document['metadata']!r}; expected an object (or none).")
    return document


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> HookedGPT:
    """Load a checkpoint saved by `save_checkpoint`; raises if config and weights disagree."""
    weights_path, config_path = checkpoint_paths(path)
    if not weights_path.exists():
        raise FileNotFoundError(f"checkpoint weights {weights_path} not found.")
    document = read_checkpoint_config(path)
    config_dict = dict(document["config"])
    arch = config_dict.get("architecture", "GPTConfig")
    if arch not in ARCHITECTURES:
        raise CheckpointFileError(f"{config_path}: unknown architecture {arch!r}; expected one of {sorted(ARCHITECTURES)}.")
    config_class, model_class = ARCHITECTURES[arch]
    try:
        config = config_class.from_dict(config_dict)
    except (TypeError, ValueError) as error:
        raise CheckpointFileError(f"{config_path}: invalid config: {error}") from None
    metadata = document.get("metadata", {})
    check_bos(metadata, config.d_vocab, config_path)
    model = model_class(config)
    state = read_weights(weights_path, device)
    _check_state(state, model.state_dict(), weights_path, config_path)
    header = read_header(weights_path)
    check_digest(header, state, weights_path)
    notes = check_fingerprint(weights_path, config_path, config.to_dict(), config_class, header=header)
    model.load_state_dict(state)
    try:
        model.check_weights()
    except ValueError as error:  # NaN or inf in the file
        raise CheckpointFileError(f"{weights_path}: {error}") from None
    model.metadata = metadata
    model.tokenizer, tokenizer_notes = checkpoint_tokenizer(metadata, config.d_vocab, config_path)
    carried = metadata.get("load_notes")  # a model loaded from a GGUF file keeps what its load said
    model.load_notes = ([str(note) for note in carried] if isinstance(carried, list) else []) + notes + tokenizer_notes
    return model.to(device).eval()


def check_bos(metadata: dict[str, Any], d_vocab: int, config_path: Path) -> None:
    """Refuse a BOS id in the metadata (`BOS_KEYS`, at its top level or one level down) outside the vocabulary:
    every prompt built with it would fail later, blaming the prompts."""
    for where, source in [("metadata", metadata)] + [(f"metadata.{k}", v) for k, v in metadata.items() if isinstance(v, dict)]:
        for key in BOS_KEYS:
            value = source.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < d_vocab:
                raise CheckpointFileError(f"{config_path}: {where}.{key} = {value!r} is not a token of the model's "
                                      f"vocabulary (ids 0..{d_vocab - 1}, d_vocab {d_vocab}); fix or remove it.")


def checkpoint_tokenizer(metadata: dict[str, Any], d_vocab: int, config_path: Path) -> tuple[Any, list[str]]:
    """The checkpoint's tokenizer (`shipped_tokenizer`) and notes: one carried in `metadata.tokenizer` that cannot be
    rebuilt is dropped with a note naming why (the model works on token ids); so is none at all."""
    carried = metadata.get("tokenizer")
    if carried is not None:
        problem = None
        if not isinstance(carried, dict) or carried.get("kind") != "bpe" or not isinstance(carried.get("json"), str):
            kind = carried.get("kind") if isinstance(carried, dict) else None
            problem = (f"is {type(carried).__name__}, not {{\"kind\": \"bpe\", \"json\": ...}}" if not isinstance(carried, dict)
                       else f"has kind {kind!r}, not 'bpe'" if kind != "bpe" else "has no 'json' text")
        else:
            try:
                return shipped_tokenizer(metadata, d_vocab), []
            except ValueError as error:
                if "vocabulary" in str(error):
                    raise CheckpointFileError(f"{config_path}: {error}") from None
                problem = f"does not rebuild ({error})"
            except Exception as error:  # the tokenizers library's own parse errors
                problem = f"does not rebuild ({type(error).__name__}: {error})"
        return None, [f"{config_path.name}: metadata.tokenizer {problem}; the model loads without a tokenizer: pass "
                      "token ids (text prompts need one)."]
    tokenizer = shipped_tokenizer(metadata, d_vocab)
    recipe = metadata.get("recipe")
    if tokenizer is None and isinstance(recipe, dict) and "vocab_size" in recipe:  # trained on BPE pieces
        return None, [f"{config_path.name} was trained with a BPE tokenizer (metadata.recipe) but carries none "
                      "(metadata.tokenizer): pass token ids (text prompts need it; a run folder keeps it in "
                      "tokenizer.json)."]
    return tokenizer, []


def _check_state(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], weights_path: Path,
                 config_path: Path) -> None:
    """Refuse weights whose names, shapes or dtypes are not the config's (integers are never cast to float)."""
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong_shape = [f"{k}: file {tuple(state[k].shape)} vs config {tuple(v.shape)}"
                   for k, v in expected.items() if k in state and state[k].shape != v.shape]
    if missing or unexpected or wrong_shape:
        raise CheckpointFileError(
            f"checkpoint {weights_path.name} does not match its config {config_path.name}: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}, wrong shapes {wrong_shape[:5]}. "
            "Re-save the model with interp.models.io.save_checkpoint, or fix the config."
        )
    integer = [f"{k} ({state[k].dtype})" for k, v in expected.items()
               if v.dtype.is_floating_point and not state[k].dtype.is_floating_point]
    if integer:
        raise CheckpointFileError(f"{weights_path}: tensors {integer[:5]} are not floating point; weights cast from integers "
                              "would be another model. Re-save the model with interp.save.")


def read_weights(weights_path: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a corrupt or truncated file is a CheckpointFileError naming it."""
    try:
        return load_file(str(weights_path), device=str(device))
    except (SafetensorError, OSError) as error:
        raise CheckpointFileError(
            f"{weights_path} is not a readable safetensors file ({error}); it may be truncated or corrupt: "
            "copy it again, or re-save the model with interp.save."
        ) from None


def read_header(weights_path: Path) -> dict[str, str]:
    """The metadata of a safetensors file's header (empty when it has none)."""
    try:
        with safe_open(str(weights_path), framework="pt") as handle:
            return dict(handle.metadata() or {})
    except (SafetensorError, OSError) as error:
        raise CheckpointFileError(
            f"{weights_path} is not a readable safetensors file ({error}); it may be truncated or corrupt: "
            "copy it again, or re-save the model with interp.save."
        ) from None


def check_digest(header: dict[str, str], state: dict[str, torch.Tensor], weights_path: Path) -> None:
    """Refuse tensors whose SHA-256 differs from the one recorded at save time (`TENSORS_KEY`); older files, saved
    without one, are not checked."""
    recorded = header.get(TENSORS_KEY)
    if recorded is not None and recorded != tensors_digest(state):
        raise CheckpointFileError(f"{weights_path}: the tensors' SHA-256 differs from the one recorded when it was saved: "
                              "the weights were altered or corrupted since (a bad copy or disk). Copy the checkpoint "
                              "again, or re-save the model with interp.save.")


def saved_config(weights_path: Path, header: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The config recorded in the safetensors header at save time (None for older checkpoints)."""
    header = read_header(weights_path) if header is None else header
    if CONFIG_KEY not in header:
        return None
    text = header[CONFIG_KEY]
    if header.get(FINGERPRINT_KEY) != hashlib.sha256(text.encode()).hexdigest():
        raise CheckpointFileError(f"{weights_path}: the config recorded in its header does not match its fingerprint; "
                              "the file was altered after saving. Re-save the model with interp.save.")
    return json.loads(text)


def check_fingerprint(weights_path: Path, config_path: Path, config: dict[str, Any], config_class=None, *,
                      header: dict[str, str] | None = None) -> list[str]:
    """Refuse a JSON config that differs from the one the weights were saved with; notes for old files.

    Fields added to the config class after the save are read at their defaults on both sides
    (`config_class.from_dict` of the saved config), so a newer toolkit still loads older files."""
    saved = saved_config(weights_path, header)
    config = json.loads(canonical_config(config))  # tuples as lists, as the saved JSON has them
    if saved is None:
        return [f"{weights_path.name} was saved before config fingerprints: {config_path.name} cannot be checked "
                "against the weights; re-save it with interp.save to record one."]
    if config_class is not None and saved.get("architecture", "GPTConfig") == config.get("architecture", "GPTConfig"):
        try:
            saved = json.loads(canonical_config(config_class.from_dict(saved).to_dict()))
        except (TypeError, ValueError):
            pass  # compared as saved: the differences are named below
    changed = sorted(k for k in set(saved) | set(config) if saved.get(k) != config.get(k))
    if changed:
        shown = "; ".join(f"{k}: saved {saved.get(k)!r}, now {config.get(k)!r}" for k in changed[:6])
        raise CheckpointFileError(
            f"{config_path} does not describe the weights in {weights_path.name}: {shown}. The weights were saved "
            "with the other config; an edited config loads a different model. Restore the JSON, or re-save the "
            "model with interp.save."
        )
    return []
