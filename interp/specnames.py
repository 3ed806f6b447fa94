"""Model-spec names checked without importing torch or transformer_lens (about 3-4 s here).

`interp.loading.load` is the authority on what a spec means; this module only answers, in
milliseconds, "can this string possibly name something loadable?", so that the CLI refuses a
misspelt built-in name before the heavy imports. It mirrors `load`'s order: a built-in name,
an existing file or folder, a checkpoint NAME with NAME.safetensors or NAME.json beside it, a
`package.module:factory`. Anything else is refused with the close matches among built-ins.
"""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from interp.errors import BadInput

# built-in name -> checkpoint name under models/checkpoints/ (NAME.safetensors + NAME.json);
# `interp.loading.BUILTINS` is this dict
BUILTINS: dict[str, str] = {
    "toy-induction": "toy-induction",
    "stdlib-bytes": "stdlib-bytes",  # byte-level LM of the Python stdlib source (models/checkpoints/stdlib-bytes.md)
}
FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def could_load(text: str) -> bool:
    """False only when `text` is certainly not a spec `interp.load` accepts."""
    if text in BUILTINS or FACTORY.match(text):
        return True
    path = Path(text).expanduser()
    if path.exists():
        return True
    stem = path.with_suffix("") if path.suffix in (".safetensors", ".json") else path
    return any(Path(f"{stem}{suffix}").exists() for suffix in (".safetensors", ".json"))


def check_spec(text: str | os.PathLike | None) -> None:
    """Raise BadInput for a string that names nothing loadable (no torch import on the way)."""
    if text is None:
        return
    text = os.fspath(text)
    if not text.strip():  # an unset shell variable must not mean "the current folder" or the default model
        raise BadInput(f"the model spec is empty ({text!r}); pass a built-in name (e.g. toy-induction), a checkpoint "
                       "path, package.module:factory or a Hugging Face folder. Is a shell variable unset?")
    if could_load(text):
        return
    close = difflib.get_close_matches(text, list(BUILTINS), n=3, cutoff=0.5)
    hint = f" Did you mean {close}?" if close else ""
    raise BadInput(
        f"cannot load model spec {text!r}: it names nothing loadable (no built-in model, file, folder or "
        f"package.module:factory of that name).{hint} Built-in names: {sorted(BUILTINS)}; or pass a checkpoint "
        "path, a Hugging Face model folder, or 'package.module:factory'."
    )
