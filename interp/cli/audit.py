"""`interp audit-leakage`: the audit, its verdict table, and the SARIF and JUnit files for CI."""
from __future__ import annotations

import json
from typing import Any

from interp.cli.common import _check_max_len_flag, _load_black_box
from interp.cli.output import _emit_json, _out_console, _write_text
from interp.cli.tables import _frame_table


def cmd_audit_leakage(args) -> int:
    from interp.analyses import leakage

    model = _load_black_box(args.spec, args.quiet, getattr(args, "backend", "auto"),
                            allow_download=getattr(args, "allow_download", False))
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
    from interp.analyses.leakage import ci as leakage_ci

    if args.sarif is not None:
        _write_text(args.sarif, json.dumps(leakage_ci.to_sarif(result), indent=2) + "\n", "SARIF")
    if args.junit is not None:
        _write_text(args.junit, leakage_ci.to_junit(result, f"interp audit-leakage {args.spec}"), "JUnit XML")


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
