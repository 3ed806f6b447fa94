"""Checkpoints: weights in safetensors, config in JSON beside them. Nothing is ever unpickled.

A checkpoint `NAME` is two files, `NAME.safetensors` and `NAME.json`; the JSON holds the
config (with its `architecture`) and free-form metadata (how the model was made).
Save then load is bit-exact.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from models.config import EncoderConfig, GPTConfig
from models.encoder import HookedEncoder
from models.gpt import HookedGPT

ARCHITECTURES = {"GPTConfig": (GPTConfig, HookedGPT), "EncoderConfig": (EncoderConfig, HookedEncoder)}


def checkpoint_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """(weights, config) paths for a checkpoint given as NAME, NAME.safetensors or NAME.json."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in (".safetensors", ".json") else path
    return stem.with_name(stem.name + ".safetensors"), stem.with_name(stem.name + ".json")


def _atomic_write(path: Path, write) -> None:
    """Write through a temporary file in the same folder, so a failure leaves nothing half-written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(model: HookedGPT, path: str | os.PathLike, metadata: dict[str, Any] | None = None) -> Path:
    """Save a HookedGPT / HookedEncoder as NAME.safetensors + NAME.json; returns the weights path."""
    weights_path, config_path = checkpoint_paths(path)
    weights_path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    document = {"config": model.cfg.to_dict(), "metadata": metadata or {}}
    _atomic_write(weights_path, lambda tmp: save_file(tensors, tmp))
    _atomic_write(config_path, lambda tmp: Path(tmp).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n"))
    return weights_path


def read_checkpoint_config(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON document of a checkpoint: {"config": {...}, "metadata": {...}}."""
    _, config_path = checkpoint_paths(path)
    if not config_path.exists():
        raise FileNotFoundError(f"checkpoint config {config_path} not found; a checkpoint is NAME.safetensors + NAME.json.")
    try:
        document = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_path} is not valid JSON: {error}") from None
    if "config" not in document:
        raise ValueError(f"{config_path} has no 'config' entry; expected {{'config': {{...}}, 'metadata': {{...}}}}.")
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
        raise ValueError(f"{config_path}: unknown architecture {arch!r}; expected one of {sorted(ARCHITECTURES)}.")
    config_class, model_class = ARCHITECTURES[arch]
    model = model_class(config_class.from_dict(config_dict))
    state = load_file(str(weights_path), device=str(device))
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong_shape = [f"{k}: file {tuple(state[k].shape)} vs config {tuple(v.shape)}"
                   for k, v in expected.items() if k in state and state[k].shape != v.shape]
    if missing or unexpected or wrong_shape:
        raise ValueError(
            f"checkpoint {weights_path.name} does not match its config {config_path.name}: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}, wrong shapes {wrong_shape[:5]}. "
            "Re-save the model with models.io.save_checkpoint, or fix the config."
        )
    model.load_state_dict(state)
    model.check_weights()
    model.metadata = document.get("metadata", {})
    return model.to(device).eval()
