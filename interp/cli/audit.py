"""`interp audit-leakage`: the audit, its verdict table, and the SARIF and JUnit files for CI.

The model is loaded and audited in a child process (`interp.cli.isolate`): whatever the model's code
does (`sys.exit(0)`, `os._exit(0)`, a crash), this command never ends with exit 0 without a verdict,
and every requested output is written, from the child's result or as a failure document
(`interp.cli.main`)."""
from __future__ import annotations

import json
from typing import Any, Callable

from interp.cli.common import _check_max_len_flag, _load_black_box
from interp.cli.isolate import Outcome, capturing_console, console_settings, run
from interp.cli.output import _emit_json, _out_console, _write_text
from interp.cli.tables import _frame_table
from interp.errors import InterpError


def cmd_audit_leakage(args) -> int:
    args.console_settings = console_settings(_out_console(args))  # the child renders as this console would
    outcome = run(args, _audit, f"the model spec {args.spec!r}")
    return deliver(args, "audit-leakage", args.spec, outcome)


def deliver(args, command: str, spec: str | None, outcome: Outcome) -> int:
    """In this process: the text, then the documents (after the table, at fd 1's offset, when one is /dev/stdout). A
    reader closing stdout early still leaves the documents written; a document that cannot be written is the
    command's error, its target named (`failure`: the others still get one)."""
    console = _out_console(args)
    closed: BrokenPipeError | None = None
    if outcome.console and not console.quiet:
        try:
            console.file.write(outcome.console)
            console.file.flush()
        except BrokenPipeError as error:  # `| head`: the documents are still written, then exit 0 as before
            closed = error
    for flag, (text, what) in outcome.documents.items():
        target = getattr(args, flag)
        _write_delivered(target, _write_text, target, text, what)
    if getattr(args, "json", None) is not None:
        _write_delivered(args.json, _emit_json, args, command, spec, outcome.json_result)
    if closed is not None:
        raise closed
    return outcome.exit_code


def _write_delivered(target: Any, write: Callable[..., None], *arguments: Any) -> None:
    """`write(*arguments)`, an InterpError marked with its target (the failure documents leave that one as it was)."""
    try:
        write(*arguments)
    except InterpError as error:
        error.failed_target = str(target)  # type: ignore[attr-defined]
        raise


def _audit(args) -> Outcome:
    """Load and audit the model, render the verdict and the documents (in the child)."""
    from interp.analyses import leakage

    model = _load(args)
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
    kwargs.update(_contract_kwargs(args, model))
    result = leakage.audit(model, **kwargs)
    console = capturing_console(args.console_settings)
    _print_result(console, result, args.spec)
    documents: dict[str, tuple[str, str]] = {}
    if args.sarif is not None:
        documents["sarif"] = (json.dumps(leakage.to_sarif(result), indent=2) + "\n", "SARIF")
    if args.junit is not None:
        documents["junit"] = (leakage.to_junit(result, f"interp audit-leakage {args.spec}"), "JUnit XML")
    json_result = json.loads(result.to_json()) if args.json is not None else None
    return Outcome(result.exit_code, console.file.getvalue(), documents, json_result)


def _contract_kwargs(args, model: Any) -> dict[str, Any]:
    """The contract modes the flags ask for, as `audit`'s arguments (`--doc-sep eos`: the model's eos_token_id)."""
    from interp.analyses.leakage.contracts.documents import eos_of
    from interp.errors import BadInput

    kwargs: dict[str, Any] = {}
    doc_sep = getattr(args, "doc_sep", None)
    if doc_sep == "eos":
        doc_sep = eos_of(model)
        if doc_sep is None:
            raise BadInput("--doc-sep eos: the model's config declares no eos_token_id; give the separator's id")
    if doc_sep is not None:
        kwargs["doc_sep"] = doc_sep
    if getattr(args, "packed_prompts", None) is not None:
        kwargs["packed_prompts"] = _packed_prompts(args.packed_prompts)
    for flag in ("packed", "kv_cache", "compiled"):
        if getattr(args, flag, False):
            kwargs[flag] = True
    for flag in ("window", "attn_impls"):
        if getattr(args, flag, None) is not None:
            kwargs[flag] = getattr(args, flag)
    return kwargs


def _packed_prompts(path: str) -> Any:
    """--packed-prompts FILE.json: the rows as JSON gives them (`audit` checks they are token-id lists)."""
    from interp.errors import BadInput

    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except OSError as error:
        raise BadInput(f"--packed-prompts {path}: cannot read it ({error.strerror}); give a JSON file of token-id "
                       "lists, e.g. [[5, 9, 1, 7, 3]]") from None
    except json.JSONDecodeError as error:
        raise BadInput(f"--packed-prompts {path}: not JSON ({error.msg} at line {error.lineno}); give a JSON list of "
                       "token-id lists, e.g. [[5, 9, 1, 7, 3]]") from None


def _load(args) -> Any:
    """The model, a factory's construction recorded (`origin.recording_construction`: the line that built a mask
    buffer is named in the origin)."""
    from interp.analyses.leakage.origin import recording_construction
    from interp.loading import is_factory_spec

    backend, allow_download = getattr(args, "backend", "auto"), getattr(args, "allow_download", False)
    if not is_factory_spec(args.spec):
        return _load_black_box(args.spec, args.quiet, backend, allow_download=allow_download)
    with recording_construction() as attach:
        return attach(_load_black_box(args.spec, args.quiet, backend))


def _print_result(console, result, spec: str) -> None:
    """The verdict table, the origins, the largest influences and the notes."""
    from rich.markup import escape

    from interp.analyses import leakage

    console.print(_verdict_table(result, spec))
    for kind, contract in result.contracts.items():
        for note in contract.notes:
            console.print(f"note ({kind}): {escape(note)}")
    for kind, origin in result.origins.items():  # where to look first: the line of code
        console.print(f"[bold]origin ({kind})[/bold]: {escape(str(origin))}")
    top = result.table.sort_values("influence", ascending=False)
    top = top[leakage.above_threshold(top, result.tol)]
    if result.leaks and len(top):
        console.print(_frame_table(top, title="Largest influences", max_rows=10,
                                   columns=["method", "site", "length", "query_pos", "source_pos", "influence"],
                                   width=console.width))
    for note in result.notes:
        console.print(f"note: {escape(note)}")
    for reason in result.incomplete.values():
        console.print(f"[red]not checked[/red]: {escape(reason)}")


def _verdict_table(result, spec: str):
    """The audit's verdict as a rich table: one row per method, coloured by the report's own tones."""
    from rich.markup import escape
    from rich.table import Table

    from interp.analyses.leakage import STATUS_TONE

    colours = {"ok": "green", "leak": "red", "neutral": "cyan", "warn": "yellow", "skipped": "dim"}
    colour = colours[result.tone]
    caption = f"lengths {list(result.lengths)}, {result.n_prompts} prompts, {result.seconds:.1f} s"
    if result.float64_checked:
        caption += f"; float64 decided {', '.join(result.float64_checked)}"
    if result.first_leaking_site:
        caption = f"first leaking site: {result.first_leaking_site}; " + caption
    table = Table(title=f"Leakage audit of {escape(spec)}: [bold {colour}]{result.headline}[/bold {colour}]",
                  caption=caption, header_style="bold")
    for column in ("method", "status", "max influence", "margin", "where"):
        table.add_column(column)
    margins = result.margin
    for row in result.summary_rows():
        status = row["status"]
        value = "-" if row["max_influence"] is None else f"{row['max_influence']:.3g}"
        margin = margins.get(row["method"])
        c = colours[STATUS_TONE.get(status, "neutral")]
        table.add_row(row["method"], f"[{c}]{status}[/{c}]", value, "-" if margin is None else f"{margin:.2g}",
                      escape(row["where"]))
    return table
