"""Where a command's output goes: rich consoles (stdout, or stderr when a machine-readable document
takes stdout), stdout fenced off while a command runs, error lines on stderr filled to the terminal, and
the JSON envelope every --json writes."""
from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from interp.errors import BadInput  # no torch: --help stays fast
from interp.schemas import JSON_SCHEMA  # the envelope's version (re-exported by interp.cli)

if TYPE_CHECKING:
    from rich.console import Console


MACHINE_FLAGS = ("json", "sarif", "junit")  # flags whose target may be "-": one machine-readable document on stdout
OUTPUT_FLAGS = (*MACHINE_FLAGS, "png")  # every flag naming one output file (`interp report --out` is a folder: outdir)


def check_targets(args, inputs: Iterable[str | os.PathLike] = ()) -> None:
    """Every output flag of `args` checked before any work (`interp.outdir.check_outputs`): writable, none the
    same file as another or as one of the command's `inputs`, none inside the report folder `--out`."""
    from interp.outdir import check_outputs

    outputs = {f"--{flag}": getattr(args, flag, None) for flag in OUTPUT_FLAGS}
    out = getattr(args, "out", None)
    if out:
        folder = os.path.realpath(out)
        for flag, target in outputs.items():
            if target not in (None, "", "-") and os.path.realpath(target).startswith(folder + os.sep):
                raise BadInput(f"{flag} {target} lies inside the output folder --out {out}, whose files the report "
                               f"replaces; choose a path outside it.")
    check_outputs(outputs, inputs)


def _stdout_document(args) -> bool:
    """Whether a machine-readable document goes to stdout (then everything else goes to stderr)."""
    return any(getattr(args, flag, None) == "-" for flag in MACHINE_FLAGS)


_PENDING_STDOUT: list[str] = []  # the document for stdout, written once the command's own output is fenced off


@contextlib.contextmanager
def _fenced_stdout(args) -> Iterator[None]:
    """With a document for stdout, whatever runs meanwhile (the user's model printing at build time, a C
    extension or `os.write(1, ...)`) goes to stderr, redirected at the file-descriptor level; the
    document is written to stdout after, alone."""
    targets = [flag for flag in MACHINE_FLAGS if getattr(args, flag, None) == "-"]
    if len(targets) > 1:
        raise BadInput(f"--{' and --'.join(targets)} both write to stdout (-); give all but one of them a FILE.")
    if not targets:
        yield
        return
    sys.stdout.flush()
    saved, real = os.dup(1), sys.stdout
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        sys.stdout = real
    for text in _PENDING_STDOUT:
        sys.stdout.write(text)
    _PENDING_STDOUT.clear()


def _out_console(args) -> Any:
    """Where human-readable results go: stdout, or stderr when JSON is written to stdout."""
    to_stderr = _stdout_document(args)
    stream = sys.stderr if to_stderr else sys.stdout
    width = None if stream.isatty() else _columns_env() or 120  # a terminal's own width; else $COLUMNS or 120
    return _pipe_safe_console()(stderr=to_stderr, quiet=getattr(args, "quiet", False) and to_stderr, highlight=False,
                               width=width)


def _pipe_safe_console() -> type[Console]:
    """A rich Console class whose closed pipe raises BrokenPipeError (exit 0 in `main`), not rich's SystemExit(1),
    which would read as "a finding" (`interp verify | head -1`)."""
    from rich.console import Console

    class PipeSafeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError("stdout was closed by the reader")

    return PipeSafeConsole


def _columns_env() -> int | None:
    text = os.environ.get("COLUMNS", "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def stderr_width() -> int | None:
    """The width error lines are filled to: $COLUMNS when set, else the terminal's when stderr is one; None
    (each message on one line, as logs and CI greps want it) when stderr is a file or a pipe. Not
    `shutil.get_terminal_size`, which asks stdout and falls back to 80 under a capture."""
    columns = _columns_env()
    if columns is not None:
        return columns
    try:
        if sys.stderr.isatty():
            return os.get_terminal_size(sys.stderr.fileno()).columns
    except (AttributeError, OSError, ValueError):  # no stderr, or one without a file descriptor
        pass
    return None


def fill_message(text: str, width: int | None) -> str:
    """`text` filled to `width` columns at spaces, each of its own lines apart (None: unchanged). Words are
    never split, not even at hyphens, so a word longer than the width keeps a line of its own, and joining
    each line's pieces with one space gives back the text."""
    if width is None:
        return text
    import textwrap

    return "\n".join("\n".join(textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False)) or line
                     for line in text.split("\n"))


def print_error(text: str) -> None:
    """One message on stderr (`interp CMD: error: ...`), filled to `stderr_width()`."""
    print(fill_message(text, stderr_width()), file=sys.stderr)


DISTRIBUTION = "interp-attention"
# keys whose values are counts or indices: written as JSON integers even when pandas made them floats
# (a column with a missing value becomes float64: `"layer": 0.0`)
INTEGER_KEYS = frozenset({
    "layer", "head", "layer_a", "head_a", "layer_b", "head_b", "n_prompts", "n_pos", "length", "query_pos",
    "source_pos", "offset", "prefix_len", "seed", "n", "n_layers", "n_heads", "n_removed", "step",
})


def toolkit_version() -> str:
    """The installed distribution's version (pyproject.toml), or "unknown" when run from an uninstalled tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def envelope(command: str, model: str | None, result: Any, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one JSON shape every command writes: what ran, on which model, by which toolkit, and its result; or,
    when it failed, `result: null` and `error: {type, message, exit_code}` (`interp.cli.failure`)."""
    return {"command": command, "model": model, "version": toolkit_version(), "schema": JSON_SCHEMA,
            "result": integers(result), "error": error}


def integers(value: Any, key: str | None = None) -> Any:
    """`value` with every integral float under an INTEGER_KEYS key made an int (recursively); NaN and
    infinities -> None (JSON has no such numbers; json.dumps would write the invalid NaN / Infinity)."""
    if isinstance(value, dict):
        return {k: integers(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [integers(v, key) for v in value]
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        if key in INTEGER_KEYS and value.is_integer():
            return int(value)
    return value


def _emit_json(args, command: str, model: str | None, result: Any) -> None:
    """Write the command's result in the envelope to --json's target (nothing without --json)."""
    _write_json(getattr(args, "json", None), envelope(command, model, result))


def _write_json(target: str | None, payload: Any) -> None:
    if target is None:
        return
    text = json.dumps(payload, indent=2, sort_keys=True, default=_json_default) + "\n"
    _write_text(target, text, "JSON")


def _write_text(target: str, text: str, what: str) -> None:
    """`text` to stdout (after the command, see `_fenced_stdout`) or to `target` through `interp.outdir.write_output`:
    a file written whole or not at all, a device, pipe or /dev/stdout written in place."""
    if target == "-":
        _PENDING_STDOUT.append(text)
        return
    from interp.outdir import write_output

    write_output(target, text, what=what)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars keep their type (bool stays bool)
        return value.item()
    for caster in (float, str):
        try:
            return caster(value)
        except (TypeError, ValueError):
            continue
    return repr(value)


def _frame_records(frame) -> list[dict[str, Any]]:
    """A DataFrame as JSON-ready records (NaN -> null, counts and indices as integers)."""
    return integers(json.loads(frame.to_json(orient="records", double_precision=6, default_handler=str)))
