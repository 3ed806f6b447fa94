"""The `interp` command: one console script, one subcommand per job.

    interp report [SPEC]            per-head pattern report (HTML, CSV, Markdown, PNG)
    interp audit-leakage SPEC       does any output depend on a later token?
    interp claims [SPEC] FILE       test the claims written in a TOML claims file
    interp scan [SPEC]              propose a claim for every head and test it on held-out prompts
    interp heads [SPEC]             per-head positional and induction metrics with CIs
    interp verify [SPEC]            prove that the model's hooks carry what their names say
    interp train [ARGS...]          train a model (wraps `python -m interp.models.train`)
    interp demo                     `interp report` on the embedded default, then the highlights

SPEC is anything `interp.load` accepts: a built-in name (`toy-induction`, the default), a
checkpoint (NAME.safetensors + NAME.json), `package.module:factory`, or a local Hugging Face
model folder.

Exit codes: 0 ok; 1 a finding (a leak, a failed hook check, a refuted claim with --strict);
2 a usage or input error (message on stderr, no traceback; set INTERP_DEBUG=1 for one);
3 an internal error (a bug: the traceback is printed).

Parsing flags imports neither torch nor transformer_lens (about 3 s here): every handler
imports what it needs when it runs, so `interp --help` answers at once.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from interp.errors import BadInput as InputError  # the earlier name, kept for callers (no torch: --help stays fast)
from interp.launch import add_flags as add_scale_flags, place

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_SPEC = "toy-induction"
EXIT_OK, EXIT_FINDING, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


# --------------------------------------------------------------------------- helpers


def _stderr_console(quiet: bool = False):
    from rich.console import Console

    return Console(stderr=True, quiet=quiet, highlight=False)


MACHINE_FLAGS = ("json", "sarif", "junit")  # flags whose target may be "-": one machine-readable document on stdout


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
        raise InputError(f"--{' and --'.join(targets)} both write to stdout (-); give all but one of them a FILE.")
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


def _load(spec: str | None, quiet: bool = False, backend: str = "auto", *, black_box: bool = False):
    """interp.load (or `interp.loading.load_auditable` with `black_box`) behind a status line.

    An empty spec (`interp verify ""`, e.g. an unset variable in a script) is refused: it must
    not silently mean the default model. Input errors become BadInput naming the spec; errors
    of the user's checkpoint, factory or model stay ModelError (both exit 2).
    """
    from interp.errors import BadInput, ModelError

    spec = _checked_spec(spec)
    console = _stderr_console(quiet)
    with console.status(f"loading {spec} ...", spinner="dots"):
        import interp
        from interp.loading import load_auditable

        try:
            model = load_auditable(spec, backend=backend) if black_box else interp.load(spec, backend=backend)
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


def _load_black_box(spec: str, quiet: bool = False, backend: str = "auto"):
    """Like `_load`, but a `package.module:factory` whose model has no hooks is audited as a black box
    (the leakage audit needs only tokens -> outputs); the factory is called once."""
    return _load(spec, quiet, backend, black_box=True)


def _message(error: BaseException) -> str:
    text = str(error)
    if isinstance(error, KeyError) and text.startswith(("'", '"')):
        text = text[1:-1]
    return text or type(error).__name__


JSON_SCHEMA = 1  # version of the JSON envelope and of each command's `result`; changes go in CHANGELOG.md
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


def envelope(command: str, model: str | None, result: Any) -> dict[str, Any]:
    """The one JSON shape every command writes: what ran, on which model, by which toolkit, and its result."""
    return {"command": command, "model": model, "version": toolkit_version(), "schema": JSON_SCHEMA,
            "result": integers(result)}


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
    """`text` to stdout (after the command, see `_fenced_stdout`) or to the file `target`, written whole or not at all."""
    if target == "-":
        _PENDING_STDOUT.append(text)
        return
    from interp.models.files import write_atomic  # a full disk keeps the earlier file: no 0-byte JSON

    path = Path(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    except OSError as error:
        raise InputError(f"cannot write {what} to {target}: {error.strerror or error}") from None


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


def _cell(column: str, value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return ""
        if column in INTEGER_KEYS and value.is_integer():
            return str(int(value))
        if column.startswith("p_"):
            from interp.analyses.report.format import format_p  # one way to write a p-value, as in the report

            return format_p(value)
        if column in ("max_influence", "influence"):
            return f"{value:.3g}"
        return f"{value:.3f}"
    if isinstance(value, (list, tuple)):
        return "; ".join(map(str, value))
    return str(value)


FOLDING_COLUMNS = ("reasons", "reason", "detail")  # long prose: wraps at spaces inside its column
FOLDING_MIN_WIDTH = 20
TABLE_OVERHEAD = 3  # per column: one space of padding either side and a rule (rich's default box)


def _columns_env() -> int | None:
    text = os.environ.get("COLUMNS", "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def _header_lines(column: str, split: bool) -> list[str]:
    """The header's lines: whole, or broken after each underscore (never inside a word)."""
    if not split or "_" not in column:
        return [column]
    parts = column.split("_")
    return [p + "_" for p in parts[:-1]] + [parts[-1]]


def _wraps(column: str, cells: dict[str, list[str]]) -> bool:
    """Prose columns, and text columns with spaces, wrap at spaces inside their column."""
    return column in FOLDING_COLUMNS or any(" " in text for text in cells[column])


def _column_need(column: str, cells: dict[str, list[str]], split: bool) -> int:
    """The narrowest the column can be without breaking a word (prose: at least FOLDING_MIN_WIDTH)."""
    header = max(len(line) for line in _header_lines(column, split))
    if column in FOLDING_COLUMNS:
        return max(header, FOLDING_MIN_WIDTH)
    if _wraps(column, cells):
        return max([header, *(len(word) for text in cells[column] for word in text.split())])
    return max([header, *map(len, cells[column])])


def _fit_columns(columns: list[str], cells: dict[str, list[str]], width: int,
                 drop_first: tuple[str, ...] = ()) -> tuple[dict[str, bool], list[str]]:
    """Which headers to break at underscores, and which columns to leave out, so the table fits `width`.

    All headers are broken (a uniform look) before any column is dropped; then the columns in
    `drop_first` go (in that order), then columns from the right (never the first). A column that
    wraps at spaces needs only its longest word (prose: FOLDING_MIN_WIDTH).
    Returns ({column: split}, dropped columns in table order)."""
    need = lambda column, split: _column_need(column, cells, split)

    split = {c: False for c in columns}
    kept = list(columns)
    total = lambda: 1 + sum(need(c, split[c]) + TABLE_OVERHEAD for c in kept)
    if total() > width:
        split = {c: True for c in columns}
    order = [c for c in drop_first if c in kept[1:]] + [c for c in reversed(kept[1:]) if c not in drop_first]
    while total() > width and order:
        kept.remove(order.pop(0))
    return split, [c for c in columns if c not in kept]


def _frame_table(frame, title: str | None = None, columns: list[str] | None = None, max_rows: int = 80,
                 width: int | None = None, footer: list[str] | None = None, drop_first: tuple[str, ...] = ()):
    """A rich Table from a DataFrame: fixed 3 decimals (p-values 3 significant digits), counts as integers,
    verdicts coloured; headers never wrap inside a word, and what does not fit in `width` is left out and
    counted in the caption (as are rows beyond `max_rows`), with the other `footer` lines."""
    from rich.table import Table

    columns = [c for c in (columns or list(frame.columns)) if c in frame.columns]
    shown = frame.head(max_rows)
    cells = {c: [_cell(c, v) for v in shown[c]] for c in columns}
    split, dropped = _fit_columns(columns, cells, width or _columns_env() or 120, drop_first)
    kept = [c for c in columns if c not in dropped]
    table = Table(title=title, show_lines=False, header_style="bold")
    for column in kept:
        folding = _wraps(column, cells)
        table.add_column("\n".join(_header_lines(str(column), split[column])), overflow="fold", no_wrap=not folding,
                         max_width=70 if column in ("reasons", "reason") else None,
                         min_width=None if column in FOLDING_COLUMNS else _column_need(column, cells, split[column]))
    colours = {"supported": "green", "refuted": "red", "inconclusive": "yellow", "True": "green", "False": "red"}
    for i in range(len(shown)):
        row = []
        for column in kept:
            text = cells[column][i]
            colour = colours.get(text)
            row.append(f"[{colour}]{text}[/{colour}]" if colour else text)
        table.add_row(*row)
    notes = list(footer or [])
    if len(frame) > max_rows:
        notes.append(f"{len(frame) - max_rows} more rows not shown")
    if dropped:
        notes.append(f"{len(dropped)} column{'s' if len(dropped) > 1 else ''} not shown at {width or _columns_env() or 120} "
                     f"columns: {', '.join(dropped)}")
    if len(frame) > max_rows or dropped:
        notes[-1] += "; use --json for all of them"
    table.caption = "\n".join(notes) or None
    return table


def _prompt_spec(args):
    from interp.specs import PromptSpec

    return PromptSpec.parse(getattr(args, "prompts", None), n=getattr(args, "n", None), seed=getattr(args, "seed", 0),
                            prefix_len=getattr(args, "prefix_len", None))


def _prompts(model, args, default_n: int = 64):
    from interp.specs import build_prompts

    return build_prompts(model, _prompt_spec(args), default_n=default_n)


def _select(args):
    from interp.specs import parse_heads_flag, parse_layers_flag

    return parse_layers_flag(getattr(args, "layers", None)), parse_heads_flag(getattr(args, "heads", None))


# --------------------------------------------------------------------------- handlers


def cmd_report(args) -> int:
    from interp.analyses import report

    layers, heads = _select(args)
    prompt_spec = _prompt_spec(args)  # bad flags fail before the model loads
    spec = args.spec or DEFAULT_SPEC
    out = Path(args.out) if args.out else Path("reports") / _slug(spec)
    report.check_out_dir(out, args.force)
    max_cards = getattr(args, "max_cards", None) or report.MAX_CARDS
    report.check_cards_before_loading(spec, layers, heads, max_cards)  # a too-large report fails before the load
    claims = None
    if args.claims:
        from interp.analyses.registry import read_claims

        claims = read_claims(args.claims)
    model = _load(spec, args.quiet, getattr(args, "backend", "auto"))
    max_len = getattr(args, "max_len", None)  # `interp demo` passes none
    if max_len is not None:
        _check_max_len_flag(model, max_len)  # against the model's own context length, before any work
    prompt_spec = report.model_prompt_spec(model, prompt_spec, asked=getattr(args, "prompts", None) is not None)
    result = report.build_report(
        model, out, spec=spec, prompt_spec=prompt_spec, layers=layers, heads=heads, claims_file=claims,
        seed=args.seed, force=args.force, progress=not args.quiet, behaviour=getattr(args, "behaviour", None),
        max_cards=max_cards, colour_scale=getattr(args, "colour_scale", None) or "common",
        leakage_len=max_len or report.LEAKAGE_LEN, bidirectional=True if getattr(args, "bidirectional", False) else None,
    )
    console = _out_console(args)
    console.print(f"report written to [bold]{result.out_dir}[/bold] (open {result.out_dir / 'report.html'})")
    console.print(_frame_table(result.highlights, title="Strongest findings", width=console.width))
    _emit_json(args, "report", spec, result.to_json())
    return EXIT_OK


def cmd_demo(args) -> int:
    """`interp report` on the embedded default; replaces an earlier demo report, never other files."""
    out = Path(args.out)
    force = True  # replaces only a previous report's own files (interp.outdir); refuses, naming them, if others are there
    args_report = argparse.Namespace(
        spec=DEFAULT_SPEC, out=str(out), force=force, prompts=None, n=args.n, seed=args.seed, prefix_len=None,
        layers=None, heads=None, claims=None, quiet=args.quiet, json=None, behaviour=None,
    )
    return cmd_report(args_report)


def cmd_audit_leakage(args) -> int:
    from interp.analyses import leakage

    model = _load_black_box(args.spec, args.quiet, getattr(args, "backend", "auto"))
    _check_max_len_flag(model, args.max_len)
    kwargs: dict[str, Any] = {"seed": args.seed, "progress": not args.quiet}
    if args.max_len is not None:
        kwargs["max_len"] = args.max_len
    if args.n is not None:
        kwargs["n_prompts"] = args.n
    if args.tol is not None:
        kwargs["tol"] = args.tol
    if args.bidirectional:
        kwargs["bidirectional"] = True
    if args.no_padding:
        kwargs["methods"] = tuple(m for m in leakage.METHODS if m != "padding")
    result = leakage.audit(model, **kwargs)
    from rich.markup import escape

    console = _out_console(args)
    console.print(_verdict_table(result, args.spec))
    for kind, origin in result.origins.items():  # where to look first: the line of code
        console.print(f"[bold]origin ({kind})[/bold]: {escape(str(origin))}")
    if result.leaks and len(result.table):
        top = result.table.sort_values("influence", ascending=False)
        console.print(_frame_table(top[leakage.above_threshold(top, result.tol)], title="Largest influences", max_rows=10,
                                   columns=["method", "site", "length", "query_pos", "source_pos", "influence"],
                                   width=console.width))
    for note in result.notes:
        console.print(f"note: {note}")
    for reason in result.incomplete.values():
        console.print(f"[red]not checked[/red]: {reason}")
    _write_ci_files(args, result)
    if args.json is not None:
        _emit_json(args, "audit-leakage", args.spec, json.loads(result.to_json()))
    return result.exit_code


def _write_ci_files(args, result) -> None:
    """--sarif and --junit: the audit in the formats code-scanning and test-report UIs read."""
    from interp.analyses import leakage_ci

    if args.sarif is not None:
        _write_text(args.sarif, json.dumps(leakage_ci.to_sarif(result), indent=2) + "\n", "SARIF")
    if args.junit is not None:
        _write_text(args.junit, leakage_ci.to_junit(result, f"interp audit-leakage {args.spec}"), "JUnit XML")


def _check_max_len_flag(model, max_len: int | None) -> None:
    """--max-len against the model's context, worded as the flag (the API's own errors say max_len=N)."""
    from interp.errors import BadInput
    from interp.modelinfo import context_length

    n_ctx = context_length(model)
    if n_ctx is None and max_len is None:
        raise BadInput(f"cannot tell the context length of a {type(model).__name__}; pass --max-len N (the longest "
                       "sequence the model accepts).")
    if n_ctx is not None and max_len is not None and max_len > n_ctx:
        raise BadInput(f"--max-len {max_len} exceeds the model's context n_ctx={n_ctx}; pass --max-len {n_ctx} or less.")


def _verdict_table(result, spec: str):
    """The audit's verdict as a rich table: one row per method, coloured by the report's own tones."""
    from rich.table import Table

    from interp.analyses.leakage import STATUS_TONE

    colours = {"ok": "green", "leak": "red", "neutral": "cyan", "warn": "yellow", "skipped": "dim"}
    colour = colours[result.tone]
    caption = f"lengths {list(result.lengths)}, {result.n_prompts} prompts, {result.seconds:.1f} s"
    if result.first_leaking_site:
        caption = f"first leaking site: {result.first_leaking_site}; " + caption
    table = Table(title=f"Leakage audit of {spec}: [bold {colour}]{result.headline}[/bold {colour}]", caption=caption,
                  header_style="bold")
    for column in ("method", "status", "max influence", "where"):
        table.add_column(column)
    for row in result.summary_rows():
        status = row["status"]
        value = "-" if row["max_influence"] is None else f"{row['max_influence']:.3g}"
        c = colours[STATUS_TONE.get(status, "neutral")]
        table.add_row(row["method"], f"[{c}]{status}[/{c}]", value, row["where"])
    return table


def cmd_claims(args) -> int:
    from interp.analyses.registry import MODEL_CLAIM_KINDS, head_claim_kinds, pair_claim_kinds, read_claims, run_claims

    if args.list_kinds:
        print("claim kinds (prefix with 'not ' to expect a refutation):")
        print("  one head (L1H2 = ...):        " + ", ".join(sorted(head_claim_kinds())))
        print("  a pair (\"L0H1 ~ L0H3\" = ...): " + ", ".join(sorted(pair_claim_kinds())))
        print("  the model (model = ...):      " + ", ".join(MODEL_CLAIM_KINDS))
        return EXIT_OK
    if len(args.paths) == 1:
        spec, claims_path = None, args.paths[0]
    elif len(args.paths) == 2:
        spec, claims_path = args.paths
        if Path(spec).suffix == ".toml" and Path(spec).is_file() and not Path(claims_path).is_file():
            raise InputError(f"the arguments are [SPEC] FILE, model first: {spec!r} is a claims file and {claims_path!r} "
                             f"is not; run: interp claims {claims_path} {spec}")
    else:
        raise InputError(f"expected [SPEC] FILE (or --list-kinds), got {len(args.paths)} arguments: {args.paths}.")
    claims_file = read_claims(claims_path)
    spec = spec or claims_file.model
    if spec is None:
        raise InputError(f"{claims_path} names no model: pass a SPEC (interp claims toy-induction {claims_path}) or add model = \"...\" to the file.")
    model = _load(spec, args.quiet, getattr(args, "backend", "auto"))
    overrides = {k: v for k, v in {"n": args.n, "seed": args.seed, "prefix_len": args.prefix_len}.items() if v is not None}
    frame = run_claims(model, claims_file, prompt_overrides=overrides, progress=not args.quiet, behaviour=args.behaviour)
    console = _out_console(args)
    shown = frame.assign(reasons=[_short_reasons(r, p) for r, p in zip(frame["reasons"], frame["passed"])])
    console.print(_frame_table(shown, title=f"Claims in {claims_path} on {spec}",
                               columns=["name", "expect", "verdict", "p_adjusted", "passed", "reasons"], width=console.width,
                               drop_first=("expect",)))
    n_failed = int((~frame["passed"]).sum())
    console.print(f"{len(frame) - n_failed} of {len(frame)} claims as expected" + (f"; {n_failed} not" if n_failed else ""))
    _emit_json(args, "claims", spec, {"file": str(claims_path), "behaviour": _behaviour_names(frame),
                                      "n_claims": len(frame), "n_as_expected": len(frame) - n_failed,
                                      "claims": _frame_records(frame)})
    return EXIT_FINDING if (args.strict and n_failed) else EXIT_OK


def _behaviour_names(frame) -> str:
    """The behaviours the claims' causal evidence measured, joined ("" when none ran)."""
    if "behaviour" not in frame.columns:
        return ""
    return ", ".join(dict.fromkeys(str(b) for b in frame["behaviour"] if isinstance(b, str) and b))


def _short_reasons(reasons: str, passed: bool, width: int = 110) -> str:
    """All the reasons of a claim that missed its expected verdict; the start of them for a claim that got it
    (cut, never split at "; ": a reason may itself contain one)."""
    return str(reasons) if not passed else _cut(str(reasons), width)


def _cut(text: str, width: int) -> str:
    """`text` shortened to at most `width` characters at a space, marked with " ..." when cut."""
    return text if len(text) <= width else text[: width - 4].rsplit(" ", 1)[0] + " ..."


def _brief_reasons(frame, width: int = 110) -> list[str]:
    """Per row, the reason that decided the verdict, read from the Verdict objects that
    `interp.claims.verdict_frame` keeps in `frame.attrs["verdicts"]` (`interp.claims.decide` puts the
    deciding evidence first); without them, the start of the joined reasons text."""
    verdicts = frame.attrs.get("verdicts")
    if verdicts is None or len(verdicts) != len(frame):
        return [_cut(str(r), width) for r in frame["reasons"]]
    return [_cut(v.reasons[0] if v.reasons else "", width) for v in verdicts]


def cmd_scan(args) -> int:
    from interp.analyses import head_claims

    _prompt_spec(args)  # bad flags fail before the model loads
    model = _load(args.spec, args.quiet, getattr(args, "backend", "auto"))
    prompts = _prompts(model, args, default_n=args.n or 64)
    from interp.analyses.registry import claim_evidence_for

    everything = head_claims.scan(model, prompts, seed=args.seed, evidence=claim_evidence_for(model), progress=not args.quiet,
                                  behaviour=args.behaviour)
    everything = everything.assign(reason=_brief_reasons(everything))
    frame = everything[everything["verdict"] == "supported"] if args.supported_only else everything
    console = _out_console(args)
    shown = frame
    columns = ["label", "claim", "verdict", "p_adjusted", "reason"]
    console.print(_frame_table(shown, title=f"Scan of {args.spec or DEFAULT_SPEC}: claims proposed on half of "
                               f"{len(prompts)} {prompts.kind} prompts, tested on the other half", columns=columns,
                               width=console.width))
    counts = {v: int((everything["verdict"] == v).sum()) for v in VERDICTS}
    behaviour = _behaviour_names(everything)
    console.print(_scan_footer(counts, args.supported_only) + (f"; behaviour: {behaviour}" if behaviour else ""))
    _emit_json(args, "scan", args.spec or DEFAULT_SPEC, {
        "counts": counts, "shown": "supported" if args.supported_only else "all",
        "n_hidden": len(everything) - len(frame), "behaviour": behaviour,
        "claims": _frame_records(frame.drop(columns=[c for c in ("evidence", "reason") if c in frame.columns]))})
    return EXIT_OK


VERDICTS = ("supported", "refuted", "inconclusive")


def _scan_footer(counts: dict[str, int], supported_only: bool) -> str:
    """What the scan found, and what --supported-only hid (never "0 refuted" when they were only hidden)."""
    if not supported_only:
        return ", ".join(f"{counts[v]} {v}" for v in VERDICTS) + " (full reasons in --json)"
    hidden = [f"{counts[v]} {v}" for v in VERDICTS[1:] if counts[v]]
    text = f"{counts['supported']} supported shown"
    return text + (f"; {' and '.join(hidden)} hidden by --supported-only" if hidden else "; none hidden") + \
        " (full reasons in --json)"


def cmd_heads(args) -> int:
    from interp.analyses import report

    _prompt_spec(args)  # bad flags fail before the model loads
    layers, heads = _select(args)
    model = _load(args.spec, args.quiet, getattr(args, "backend", "auto"))
    prompts = _prompts(model, args)
    frame = report.head_metrics(model, prompts, seed=args.seed, layers=layers, heads=heads)
    console = _out_console(args)
    shown, hidden = _heads_columns(frame)
    console.print(_frame_table(frame, title=f"Heads of {args.spec or DEFAULT_SPEC} on {len(prompts)} {prompts.kind} prompts "
                               "(means over prompts)", columns=shown, width=console.width, footer=hidden))
    _emit_json(args, "heads", args.spec or DEFAULT_SPEC, {"heads": _frame_records(frame)})
    return EXIT_OK


def _heads_columns(frame) -> tuple[list[str], list[str]]:
    """The metric means shown in the terminal, and footer lines counting what is left for --json."""
    shown = [c for c in frame.columns if not c.endswith(("_ci_low", "_ci_high", "_argmax")) and c not in ("layer", "head")
             and not frame[c].isna().all()]
    n_ci = sum(c.endswith("_ci_low") and not frame[c].isna().all() for c in frame.columns)
    argmax = [c for c in frame.columns if c.endswith("_argmax") and not frame[c].isna().all()]
    undefined = [c for c in frame.columns if not c.endswith(("_ci_low", "_ci_high")) and c not in ("layer", "head")
                 and frame[c].isna().all()]
    parts = [f"{n_ci} CIs"] + ([f"{len(argmax)} argmax rates"] if argmax else [])
    notes = [f"not shown: {', '.join(parts)} (all in --json)"]
    if undefined:
        notes.append(f"undefined for this model and prompts: {', '.join(undefined)}")
    return shown, notes


def cmd_verify(args) -> int:
    import interp

    model = _load(args.spec, args.quiet, getattr(args, "backend", "auto"))
    frame = interp.verify_hooks(model)
    passed = frame["passed"].astype(bool) if "passed" in frame.columns else None
    console = _out_console(args)
    console.print(_frame_table(frame, title=f"Hook self-test of {args.spec or DEFAULT_SPEC}", width=console.width))
    n_failed = None if passed is None else int((~passed).sum())
    _emit_json(args, "verify", args.spec or DEFAULT_SPEC, {"n_checks": len(frame), "n_failed": n_failed,
                                                           "checks": _frame_records(frame)})
    if n_failed is None:  # no "passed" column
        return EXIT_OK
    console.print(f"{len(frame) - n_failed} of {len(frame)} checks passed")
    return EXIT_FINDING if n_failed else EXIT_OK


def cmd_train(args) -> int:
    import importlib

    try:
        train = importlib.import_module("interp.models.train")
    except ModuleNotFoundError as error:
        raise InputError(f"interp.models.train is not available ({error}).") from None
    argv = [a for a in args.train_args if a != "--"]
    entry = getattr(train, "main", None)
    if entry is None:
        import runpy

        sys.argv = ["interp.models.train", *argv]
        runpy.run_module("interp.models.train", run_name="__main__")
        return EXIT_OK
    try:
        code = entry(argv)
    except SystemExit as exit_:
        code = exit_.code
    return int(code or 0)


def _slug(spec: str) -> str:
    name = Path(spec.split(":")[-1]).name if spec else DEFAULT_SPEC
    name = name.removesuffix(".safetensors").removesuffix(".json")
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name) or "model"


# --------------------------------------------------------------------------- parser


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the line breaks of descriptions and examples."""


def _add_common(p: argparse.ArgumentParser, *, n: bool = True, json_: bool = True, seed: bool = True) -> None:
    if seed:
        p.add_argument("--seed", type=_seed, default=0, help="seed of every random choice (prompts, resampling); default 0")
    if n:
        p.add_argument("--n", type=_positive_int, default=None, metavar="N", help="number of prompts (default: per command)")
    if json_:
        p.add_argument("--json", metavar="FILE|-", default=None, help="also write the result as JSON to FILE, or to stdout with -")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars or status lines")
    p.add_argument("--backend", choices=("auto", "native", "sdpa", "bridge"), default="auto",
                   help="how a Hugging Face model is hooked: native conversion, sdpa interception or the "
                        "TransformerLens bridge; auto (default) converts natively when it can")


def _add_prompts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", metavar="KIND|FILE", default=None,
                   help="prompt kind (repeated, random, text) or a file (.txt one text a line, .json token-id lists); default: repeated")
    p.add_argument("--prefix-len", type=_positive_int, default=None, metavar="N", help="repeated prompts: length of the repeated block")


def _add_behaviour(p: argparse.ArgumentParser) -> None:
    p.add_argument("--behaviour", choices=["next-token", "masked-lm", "embedding"], default=None,
                   help="what necessity, sufficiency, faithfulness and importance measure: next-token loss, masked-LM "
                        "loss, or the sentence-embedding change (default: the model's own: next-token for a causal LM, "
                        "embedding for an encoder)")


def _add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", metavar="L,L|A-B", default=None, help="only these layers, e.g. 0,1 or 0-3")
    p.add_argument("--heads", metavar="LxHy,...", default=None, help="only these heads, e.g. L0H1,L1H2")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a positive finite number")
    return value


def _tol(text: str) -> float:
    """--tol: finite, positive and below 0.05 (the audit itself refuses more than 0.01 for float32 models)."""
    value = _positive_float(text)
    if value >= 0.05:
        raise argparse.ArgumentTypeError(f"{value:g} would call real leaks rounding; pass a value below 0.05 "
                                         "(default 5e-5; rounding measures <= 3e-5 in float32)")
    return value


from interp.validate import SEED_MAX  # noqa: E402  (the API's seed range too: interp.validate.check_seed)


def _seed(text: str) -> int:
    """--seed: an integer in [0, 2**32 - 1] (a larger one overflows torch's generators)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"{value} is outside [0, 2**32 - 1]; pass a smaller non-negative seed")
    return value


SPEC_HELP = f"model spec: built-in name, checkpoint path, package.module:factory or HF folder (default: {DEFAULT_SPEC})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="interp",
        description="Look inside attention, and test what you think you see.",
        epilog=(
            "examples:\n"
            "  interp report                         # report on the embedded toy-induction model\n"
            "  interp audit-leakage my_pkg.models:gpt --json -\n"
            "  interp claims toy-induction examples/claims.toml --strict\n\n"
            "exit codes: 0 ok, 1 a finding (leak, failed check, refuted claim with --strict), 2 bad input.\n"
            "--json writes {command, model, version, schema, result} (see CHANGELOG.md for schema changes).\n"
            "Run `interp COMMAND --help` for each command's options."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction, help="print the toolkit's version and the JSON schema version, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    def command(name: str, handler: Callable, summary: str, example: str, description: str = "") -> argparse.ArgumentParser:
        p = sub.add_parser(
            name, help=summary, description=f"{summary}.\n\n{description}".rstrip(),
            epilog=f"example:\n  {example}", formatter_class=_Formatter,
        )
        p.set_defaults(handler=handler)
        return p

    for add in (_report_parser, _audit_parser, _claims_parser, _scan_parser, _heads_parser, _verify_parser,
                _train_parser, _demo_parser):
        add(command)
    return add_scale_flags(parser)  # --workers / --device / --dtype on every command (interp.launch)


class _VersionAction(argparse.Action):
    """`interp --version`: the toolkit's version and the JSON schema's, looked up only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"interp {toolkit_version()} (JSON schema {JSON_SCHEMA})")
        parser.exit()


def _report_parser(command) -> None:
    p = command("report", cmd_report, "Write a per-head pattern report (HTML, CSV, Markdown, PNG)",
                "interp report toy-induction --n 64 --out reports/toy --force",
                "One card per head (mean pattern, offset profile, metrics with CIs, claims tested), the leakage\n"
                "verdict, head similarity and importance, redundancy findings and a methods section.")
    p.add_argument("spec", nargs="?", default=None, help=SPEC_HELP)
    _add_prompts(p)
    _add_selection(p)
    p.add_argument("--out", metavar="DIR", default=None, help="output directory (default: reports/<model>)")
    p.add_argument("--force", action="store_true", help="replace an earlier report in the output directory (only its own files; other files are never deleted)")
    p.add_argument("--claims", metavar="FILE", default=None, help="also test the claims in this TOML claims file")
    _add_behaviour(p)
    p.add_argument("--max-cards", type=_positive_int, default=None, metavar="N",
                   help="most head cards the report may have (default 64; MiniLM-L6 has 72 heads)")
    p.add_argument("--colour-scale", choices=["common", "per_head"], default="common",
                   help="pattern heat maps on one 0-1 scale (default), or each on its own (said on its colour bar)")
    p.add_argument("--max-len", type=_positive_int, default=None, metavar="N",
                   help="longest sequence the leakage audit runs (default 32, at most the model's context)")
    p.add_argument("--bidirectional", action="store_true",
                   help="the model is meant to attend both ways (an encoder): the leakage audit checks padding and "
                        "batch only (as audit-leakage --bidirectional)")
    _add_common(p)


def _audit_parser(command) -> None:
    p = command("audit-leakage", cmd_audit_leakage, "Check that no output position depends on a later token",
                "interp audit-leakage toy-induction --max-len 64 --json audit.json",
                "Truncation, perturbation, gradient and pattern checks; batch mixing, padding.\n"
                "A model must be causal unless it declares itself an encoder (HookedEncoder,\n"
                "a Hugging Face encoder config) or you pass --bidirectional. Each leak is\n"
                "located at the line of code where it appears (also in --sarif, --junit).\n"
                "Exit 0: causal; 1: a leak, or a check the model calls for could not run;\n"
                "2: bad input.")
    p.add_argument("spec", help=SPEC_HELP.replace(" (default: toy-induction)", ""))
    p.add_argument("--max-len", type=_positive_int, default=None, metavar="N", help="longest sequence audited (default: the model's context)")
    p.add_argument("--tol", type=_tol, default=None, metavar="X", help="relative influence below which a change is numerical noise")
    p.add_argument("--bidirectional", action="store_true",
                   help="the model is meant to attend both ways (an encoder): audit padding and batch only; without it, "
                        "a model that does not declare itself an encoder must be causal")
    p.add_argument("--no-padding", action="store_true",
                   help="skip the padding check (else a model taking an attention_mask must pass it)")
    p.add_argument("--sarif", metavar="FILE|-", default=None,
                   help="also write SARIF 2.1.0 (one result per leak, at the line where it appears) to FILE or stdout")
    p.add_argument("--junit", metavar="FILE|-", default=None, help="also write JUnit XML (one test case per check)")
    _add_common(p)


def _claims_parser(command) -> None:
    p = command("claims", cmd_claims, "Test the claims written in a TOML claims file",
                "interp claims toy-induction examples/claims.toml --strict --json -",
                "FILE format (see interp/specs.py):\n"
                "  model = \"toy-induction\"      # optional when SPEC is given\n"
                "  [prompts]\n  kind = \"repeated\"\n  n = 64\n"
                "  [claims]\n  L1H2 = \"induction\"\n  L0H1 = [\"previous_token\", \"not induction\"]\n"
                "  \"L0H1 ~ L0H3\" = \"redundant\"")
    p.usage = "interp claims [options] [SPEC] FILE"
    p.add_argument("paths", nargs="*", metavar="[SPEC] FILE", help="model spec (optional when the file names one) and the claims file")
    p.add_argument("--list-kinds", action="store_true", help="list the claim kinds a claims file may use, and exit")
    p.add_argument("--strict", action="store_true", help="exit 1 when any claim does not get its expected verdict")
    p.add_argument("--prefix-len", type=_positive_int, default=None, metavar="N", help="override the file's prompts.prefix_len")
    p.add_argument("--seed", type=_seed, default=None, help="override the file's prompts.seed")
    _add_behaviour(p)
    _add_common(p, seed=False)


def _scan_parser(command) -> None:
    p = command("scan", cmd_scan, "Propose a claim for every head and test it on held-out prompts",
                "interp scan toy-induction --n 128 --supported-only")
    p.add_argument("spec", nargs="?", default=None, help=SPEC_HELP)
    _add_prompts(p)
    p.add_argument("--supported-only", action="store_true",
                   help="show only supported claims (the footer counts the hidden ones; --json keeps only the shown)")
    _add_behaviour(p)
    _add_common(p)


def _heads_parser(command) -> None:
    p = command("heads", cmd_heads, "Per-head positional and induction metrics with bootstrap CIs",
                "interp heads toy-induction --prompts repeated --n 64 --json heads.json")
    p.add_argument("spec", nargs="?", default=None, help=SPEC_HELP)
    _add_prompts(p)
    _add_selection(p)
    _add_common(p)


def _verify_parser(command) -> None:
    p = command("verify", cmd_verify, "Prove the model's hooks carry what their names say",
                "interp verify toy-induction",
                "Scores pre-softmax and masked, pattern = softmax(scores), z = pattern @ v, results sum to the\n"
                "attention output, an edit at each hook changes the output. Exit 1 if a check fails.")
    p.add_argument("spec", nargs="?", default=None, help=SPEC_HELP)
    _add_common(p, n=False, seed=False)


def _train_parser(command) -> None:
    p = command("train", cmd_train, "Train a model (wraps python -m interp.models.train; arguments pass through)",
                "interp train -- --help")
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="arguments for interp.models.train")


def _demo_parser(command) -> None:
    p = command("demo", cmd_demo, "Report on the embedded default model and print the strongest findings",
                "interp demo --out reports/toy-induction",
                "Replaces an earlier report in the output directory; refuses any other non-empty directory.")
    p.add_argument("--out", metavar="DIR", default=str(Path("reports") / DEFAULT_SPEC), help="output directory")
    _add_common(p, json_=False)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if getattr(args, "command", None) == "train":
        args.train_args = [*unknown, *args.train_args]  # interp.models.train parses its own flags
    elif unknown:
        parser.parse_args(argv)  # the usual "unrecognized arguments" error, exit 2
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_INPUT
    debug = bool(os.environ.get("INTERP_DEBUG"))
    try:
        with _fenced_stdout(args):
            code = args.handler(args)
        sys.stdout.flush()  # here, not at exit: a closed pipe must raise where it is handled
        return code
    except KeyboardInterrupt:
        print(f"interp {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        return _report_error(args.command, error, debug)


def _report_error(command: str, error: BaseException, debug: bool) -> int:
    """The one place an exception becomes an exit code (`interp.errors.exit_code_for`) and a message.

    Bad input and a failing user model: exit 2, one line naming what failed and where (the
    traceback with INTERP_DEBUG=1). A closed stdout: exit 0, silently. A bug: exit 3, traceback.
    """
    from interp.errors import EXIT_INTERNAL as INTERNAL, EXIT_OK as OK, as_reported, exit_code_for

    if isinstance(error, BrokenPipeError) or _stdout_closed(error):
        _silence_stdout()
        return OK
    error = as_reported(error)  # raised inside the user's own model or factory: their input, not our bug
    code = exit_code_for(error)
    if code == INTERNAL:
        import traceback

        traceback.print_exception(error)
        print(f"interp {command}: internal error ({type(error).__name__}); please report it with the traceback above.",
              file=sys.stderr)
        return code
    if debug:
        import traceback

        traceback.print_exception(error)
    print(f"interp {command}: error: {_message(error)}", file=sys.stderr)
    return code


def _stdout_closed(error: BaseException) -> bool:
    """An OSError of writing to a closed pipe (EPIPE), however the writer wrapped it."""
    import errno

    return isinstance(error, OSError) and error.errno == errno.EPIPE


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's flush at exit does not raise again on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
