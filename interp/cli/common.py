"""What every command shares: the default model and exit codes, loading the model behind a status
line, and the prompt and selection flags read into specs."""
from __future__ import annotations

import os

from interp.launch import place

DEFAULT_SPEC = "toy-induction"
EXIT_OK, EXIT_FINDING, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
PROMPTS_DEFAULT = 64  # prompts of report, demo, scan, heads and claims without --n (report.DEFAULT_N, tested)
AUDIT_PROMPTS_DEFAULT = 2  # prompts per length of audit-leakage without --n (leakage.audit's n_prompts, tested)


def _stderr_console(quiet: bool = False):
    from rich.console import Console

    return Console(stderr=True, quiet=quiet, highlight=False)


def _load(spec: str | None, quiet: bool = False, backend: str = "auto", *, black_box: bool = False,
          allow_download: bool = False):
    """interp.load (or `interp.loading.load_auditable` with `black_box`) behind a status line, which counts
    the tensors while a GGUF model is dequantized.

    An empty spec (`interp verify ""`, e.g. an unset variable in a script) is refused: it must
    not silently mean the default model. Input errors become BadInput naming the spec; errors
    of the user's checkpoint, factory or model stay ModelError (both exit 2). `allow_download`:
    `--allow-download`, a hub id missing from the cache is downloaded.
    """
    from interp.errors import BadInput, ModelError

    spec = _checked_spec(spec)
    console = _stderr_console(quiet)
    with console.status(f"loading {spec} ...", spinner="dots") as status:
        from interp.loading import load as load_model
        from interp.loading import load_auditable

        def progress(done: int, total: int) -> None:
            status.update(f"loading {spec}: dequantizing tensor {done}/{total} ...")

        load = load_auditable if black_box else load_model
        try:
            model = load(spec, backend=backend, allow_download=allow_download, progress=progress)
        except ModelError as error:  # the user's checkpoint or factory: stays a ModelError, says which spec
            raise type(error)(f"cannot load model spec {spec!r}: {_message(error)}") from error
        except (FileNotFoundError, ValueError, KeyError, ImportError, AttributeError, TypeError) as error:
            raise BadInput(f"cannot load model spec {spec!r}: {_message(error)}") from error
    for note in getattr(model, "load_notes", None) or []:
        console.print(f"note: {note}")
    return place(model) if hasattr(model, "to") else model  # --device / --dtype


def _checked_spec(spec: str | None) -> str:
    """The spec to load: the default when none was given, a BadInput when an empty one was."""
    from interp.errors import BadInput

    if spec is None:
        return DEFAULT_SPEC
    if not spec.strip():
        raise BadInput(f"the model spec is empty ({spec!r}); pass a built-in name (e.g. {DEFAULT_SPEC}), a checkpoint "
                       "path, package.module:factory or a Hugging Face folder. Is a shell variable unset?")
    return spec


def _load_black_box(spec: str, quiet: bool = False, backend: str = "auto", *, allow_download: bool = False):
    """Like `_load`, but a `package.module:factory` whose model has no hooks is audited as a black box
    (the leakage audit needs only tokens -> outputs); the factory is called once."""
    return _load(spec, quiet, backend, black_box=True, allow_download=allow_download)


def _message(error: BaseException) -> str:
    text = str(error)
    if isinstance(error, KeyError) and text.startswith(("'", '"')):
        text = text[1:-1]
    return text or type(error).__name__


def _input_files(args) -> list[str]:
    """The files a command reads, which no output may replace: the model spec's (`interp.specnames.spec_files`:
    a checkpoint's two files, a model folder's, a factory's module), --prompts and --claims files, a claims FILE."""
    from interp.specnames import spec_files

    files: list = []
    if hasattr(args, "spec") and getattr(args, "command", None) != "demo":
        files += spec_files(args.spec or DEFAULT_SPEC)
    for path in getattr(args, "paths", None) or []:  # interp claims [SPEC] FILE
        files += spec_files(path)
    for flag in ("prompts", "claims"):
        value = getattr(args, flag, None)
        if value and os.path.exists(value):
            files.append(value)
    return [os.fspath(f) for f in files]


def _prompt_spec(args):
    from interp.specs import PromptSpec

    return PromptSpec.parse(getattr(args, "prompts", None), n=getattr(args, "n", None), seed=getattr(args, "seed", 0),
                            prefix_len=getattr(args, "prefix_len", None))


def _prompts(model, args, default_n: int = PROMPTS_DEFAULT):
    from interp.specs import build_prompts

    return build_prompts(model, _prompt_spec(args), default_n=default_n)


def _select(args):
    from interp.specs import parse_heads_flag, parse_layers_flag

    return parse_layers_flag(getattr(args, "layers", None)), parse_heads_flag(getattr(args, "heads", None))


def _check_max_len_flag(model, max_len: int | str | None) -> None:
    """--max-len against the model's context, worded as the flag (the API's own errors say max_len=N)."""
    from interp.errors import BadInput
    from interp.modelinfo import context_length

    n_ctx = context_length(model)
    if n_ctx is None and (max_len is None or max_len == "ctx"):
        raise BadInput(f"cannot tell the context length of a {type(model).__name__}; pass --max-len N (the longest "
                       "sequence the model accepts).")
    if n_ctx is not None and isinstance(max_len, int) and max_len > n_ctx:
        raise BadInput(f"--max-len {max_len} exceeds the model's context n_ctx={n_ctx}; pass --max-len {n_ctx} or less, "
                       "or --max-len ctx.")
