"""The weight files of a Hugging Face folder, found and read safely, whichever route loads them.

A folder's weights are `model.safetensors`, the shards a `model.safetensors.index.json` names,
or `pytorch_model.bin` (read with `torch.load(weights_only=True)`, never unpickled). Every file
is confined to the folder: the index's `weight_map` must name relative paths inside it, and a
path is resolved (symlinks included) before it is opened, so an index pointing at `/etc/passwd`
or `../elsewhere` is refused. The one link allowed out is the Hugging Face cache's layout,
`snapshots/<revision>/<file>` linking into the repository's `blobs/`.

Every failure is a `WeightFileError` (a `ConversionError`) naming the file and the fix.
"""
from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from interp.models.convert.common import ConversionError

SAFETENSORS, INDEX, BIN = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"
WEIGHT_FILES = (SAFETENSORS, INDEX, BIN)
_RESAVE = "copy the folder again, or re-save the model with save_pretrained (which writes model.safetensors)"


class WeightFileError(ConversionError):
    """A weight file of a folder that cannot be read, or that points outside the folder."""


def weight_kind(folder: Path) -> str:
    """Which of WEIGHT_FILES holds the folder's weights (the first present, as transformers prefers them)."""
    for name in WEIGHT_FILES:
        if (folder / name).exists():
            return name
    raise WeightFileError(
        f"{folder} has config.json but no weights: expected one of {list(WEIGHT_FILES)} "
        "(save the model with save_pretrained, which writes model.safetensors)."
    )


def weight_files(folder: str | os.PathLike) -> list[Path]:
    """The files holding the folder's weights, each confined to the folder and present."""
    folder = Path(folder)
    kind = weight_kind(folder)
    if kind == INDEX:
        return sorted(set(read_index(folder).values()))
    return [resolve_inside(folder, kind)]


def _allowed_roots(folder: Path) -> list[Path]:
    """Where the folder's files may resolve to: the folder, and for a hub cache snapshot its repository's blobs."""
    roots = [folder.resolve()]
    if folder.parent.name == "snapshots" and (folder.parent.parent / "blobs").is_dir():
        roots.append((folder.parent.parent / "blobs").resolve())
    return roots


def resolve_inside(folder: Path, name: str, index: Path | None = None) -> Path:
    """`folder / name` resolved (symlinks included), refused unless it lies inside the folder.

    `index`: the index file that named it, if any (the message names it)."""
    said = f"{index} names the file {name!r}" if index else f"{folder / name}"
    fix = f"Fix {INDEX} to name shards in this folder, or {_RESAVE}." if index else \
        f"Put the file itself in the folder, or {_RESAVE}."
    if not name or "\x00" in name or "\\" in name or PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
        raise WeightFileError(f"{said}, which lies outside the folder {folder}: weight files must be relative names "
                              f"inside it, without '..'. {fix}")
    path = (folder / name).resolve()
    if not any(path == root or root in path.parents for root in _allowed_roots(folder)):
        raise WeightFileError(f"{said}, which resolves to {path}, outside the folder {folder} (a link out of it?). {fix}")
    return path


def read_index(folder: Path) -> dict[str, Path]:
    """tensor name -> shard path of a sharded folder's index, checked: an object, confined, every shard present."""
    index = folder / INDEX
    path = resolve_inside(folder, INDEX)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise WeightFileError(f"{index} is not valid JSON ({error}); {_RESAVE}.") from None
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(document, dict) or "weight_map" not in document:
        raise WeightFileError(f"{index} has no 'weight_map' (an object: tensor name -> shard file); {_RESAVE}.")
    if not isinstance(weight_map, dict) or not weight_map:
        found = "empty" if weight_map == {} else f"a {type(weight_map).__name__}"
        raise WeightFileError(f"{index}: 'weight_map' is {found}; expected an object mapping each tensor name to "
                              f"its shard file; {_RESAVE}.")
    shards: dict[str, Path] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str):
            raise WeightFileError(f"{index}: weight_map[{tensor!r}] is {shard!r}; expected the shard's file name; {_RESAVE}.")
        shards[tensor] = resolve_inside(folder, shard, index)
    missing = sorted({weight_map[t] for t, p in shards.items() if not p.is_file()})
    if missing:
        raise WeightFileError(f"{INDEX} lists shards {missing} that are not in {folder}; {_RESAVE}.")
    return shards


def _unreadable(path: Path, error: Exception) -> WeightFileError:
    size = path.stat().st_size if path.exists() else 0
    reason = "the file is empty" if size == 0 else f"{error}; {size} bytes"
    return WeightFileError(f"{path} is not a readable safetensors file ({reason}); it may be truncated or corrupt: {_RESAVE}.")


def safetensors_dtypes(path: Path) -> dict[str, str]:
    """tensor name -> safetensors dtype ("F32", "I64", ...) from a file's header, checked to cover the file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return {name: handle.get_slice(name).get_dtype() for name in handle.keys()}
    except (SafetensorError, OSError) as error:
        raise _unreadable(path, error) from None


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file; an unreadable file is a WeightFileError naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise _unreadable(path, error) from None


def read_bin(path: Path) -> dict[str, torch.Tensor]:
    """The state dict of a pytorch_model.bin, read with weights_only=True: tensors and plain data, no code."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # UnpicklingError, EOFError, RuntimeError ...: whatever the file is, it is not weights
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise WeightFileError(
            f"{path} cannot be read as weights with torch.load(weights_only=True) ({type(error).__name__}: {first}): "
            "it is not a PyTorch state dict, or it holds pickled objects other than tensors, which are never "
            f"unpickled. {_RESAVE[0].upper()}{_RESAVE[1:]}."
        ) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        what = "a dict with non-tensor entries" if isinstance(state, dict) else f"a {type(state).__name__}"
        raise WeightFileError(f"{path} holds {what}, not a state dict (tensor name -> tensor); {_RESAVE}.")
    return state


def file_dtypes(folder: str | os.PathLike) -> dict[str, tuple[str, Path]]:
    """tensor name -> (dtype, file) over the folder's weight files, each checked readable (headers only for safetensors)."""
    dtypes: dict[str, tuple[str, Path]] = {}
    folder = Path(folder)
    kind = weight_kind(folder)
    for path in weight_files(folder):
        if kind == BIN:
            dtypes.update({k: (str(v.dtype), path) for k, v in read_bin(path).items()})
        else:
            dtypes.update({k: (v, path) for k, v in safetensors_dtypes(path).items()})
    return dtypes


def read_folder_weights(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of a folder: model.safetensors, sharded safetensors with their index, or pytorch_model.bin."""
    folder = Path(folder)
    kind = weight_kind(folder)
    if kind == INDEX:
        return _read_shards(folder)
    path = resolve_inside(folder, kind)
    return read_bin(path) if kind == BIN else read_safetensors(path)


def _read_shards(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of a sharded folder; each tensor the index lists must be in its shard, and in no other."""
    shards = read_index(folder)
    tensors: dict[str, torch.Tensor] = {}
    origin: dict[str, Path] = {}
    for shard in sorted(set(shards.values())):
        for name, tensor in read_safetensors(shard).items():
            if name in origin:
                raise WeightFileError(f"tensor {name!r} is in both {origin[name].name} and {shard.name} of {folder}; "
                                      f"{_RESAVE}.")
            tensors[name], origin[name] = tensor, shard
    for name, shard in shards.items():
        if origin.get(name) != shard:
            raise WeightFileError(f"{folder / INDEX} places tensor {name!r} in {shard.name}, but it is not in "
                                  f"{shard.name}; {_RESAVE}.")
    return tensors


def is_integer_dtype(dtype: Any) -> bool:
    """A safetensors dtype name ("I32", "U8", "BOOL") or torch dtype string ("torch.int64") that is not floating."""
    text = str(dtype).removeprefix("torch.").lower()
    return text.startswith(("i", "u", "bool"))
