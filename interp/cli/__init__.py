"""The `interp` command: one console script, one subcommand per job.

    interp report [SPEC]            per-head pattern report (HTML, CSV, Markdown, PNG)
    interp audit-leakage SPEC       does any output depend on a later token?
    interp claims [SPEC] FILE       test the claims written in a TOML claims file
    interp scan [SPEC]              propose a claim for every head and test it on held-out prompts
    interp heads [SPEC]             per-head positional and induction metrics with CIs
    interp circuit [SPEC]           discover the circuit behind the behaviour, test it and draw it
    interp qk [SPEC] --head L1H0    why a head attends where it does: its score split into source pairs
    interp verify [SPEC]            prove that the model's hooks carry what their names say
    interp train [ARGS...]          train a shipped model's recipe (`interp.experiments`; `stdlib-bpe ...` too)
    interp demo                     `interp report` on the embedded default, then the highlights

SPEC is anything `interp.load` accepts: a built-in name (`toy-induction`, the default;
`smollm2-135m` with the `real` extra), a checkpoint (NAME.safetensors + NAME.json), a GGUF file,
`package.module:factory`, a local Hugging Face model folder, or a hub id `org/name[@revision]` from
the local Hugging Face cache (`--allow-download` fetches one that is missing).

Exit codes: 0 ok; 1 a finding (a leak, a failed hook check, a refuted claim with --strict);
2 a usage or input error (message on stderr, no traceback; set INTERP_DEBUG=1 for one);
3 an internal error (a bug: the traceback is printed).

Help and output fit the terminal ($COLUMNS, else its width; tested at 80 and 120 columns): help
paragraphs are filled at spaces (`parser._Formatter`), tables leave out the columns that do not fit
and name them (`tables`), and `--json` keeps everything. Error lines on stderr are filled at spaces
too, when stderr is a terminal or $COLUMNS is set, and stay one line each otherwise (logs, CI greps:
`output.stderr_width`).

Parsing flags imports neither torch nor transformer_lens (about 3 s here): every handler
imports what it needs when it runs, so `interp --help` answers at once. No flag may be abbreviated
(`allow_abbrev=False` on every parser). Before any handler runs, every output flag (`--json`, `--sarif`,
`--junit`, `--png`) is checked: writable, not one of the command's input files, not another output
(`interp.outdir.check_outputs`).

The package: `parser` (flags), `commands`, `audit`, `circuit` and `qk` (the handlers), `common` (loading the
model, prompts, exit codes), `output` (consoles, stdout fencing, the JSON envelope), `tables`
(DataFrames as terminal tables); here, `main` turns each outcome into an exit code. The public
names (`__all__`) are the ones callers import from `interp.cli`.
"""
from __future__ import annotations

import os
import sys

from interp.cli.common import EXIT_INPUT, _input_files, _message
from interp.cli.output import (
    JSON_SCHEMA,
    _fenced_stdout,
    check_targets,
    envelope,
    integers,
    print_error,
    toolkit_version,
)
from interp.cli.parser import build_parser

__all__ = ["JSON_SCHEMA", "build_parser", "envelope", "integers", "main", "toolkit_version"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if getattr(args, "command", None) == "train":
        args.train_args = [*unknown, *args.train_args]  # interp.experiments' commands parse their own flags
    elif unknown:
        _refuse_unknown(parser, args, unknown)
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_INPUT
    debug = bool(os.environ.get("INTERP_DEBUG"))
    try:  # every output writable and none an input, before any work; a refused output gets no failure document
        check_targets(args, _input_files(args))
    except Exception as error:
        return _report_error(args.command, error, debug)
    try:
        with _fenced_stdout(args):
            code = args.handler(args)
        sys.stdout.flush()  # here, not at exit: a closed pipe must raise where it is handled
        return code
    except KeyboardInterrupt as error:
        print_error(f"interp {args.command}: interrupted")
        _failure_documents(args, error, 130)
        return 130
    except Exception as error:
        code = _report_error(args.command, error, debug)
        if code != 0:  # a closed stdout (exit 0) is no failure
            _failure_documents(args, error, code)
        return code


def _failure_documents(args, error: BaseException, code: int) -> None:
    """Every output the command was asked for, as a failure document (`interp.cli.failure`)."""
    from interp.cli.failure import write_failure_documents

    write_failure_documents(args, args.command, error, code)


def _refuse_unknown(parser, args, unknown: list[str]) -> None:
    """The usage error for arguments no flag takes (exit 2), from the subcommand's own parser, with the flags
    closest to an unknown option (abbreviations are not expanded: `--out` is not `--output`)."""
    import argparse
    import difflib

    commands = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None) or {}
    sub = commands.get(str(getattr(args, "command", "")), parser)
    known = [o for a in sub._actions if a.help != argparse.SUPPRESS for o in a.option_strings]
    hints = [f"{word}: did you mean {' or '.join(close)}?" for word in unknown if word.startswith("-")
             for close in [difflib.get_close_matches(word.split("=")[0], known, n=2, cutoff=0.8)] if close]
    sub.error(f"unrecognized arguments: {' '.join(unknown)}" + (f" ({'; '.join(hints)})" if hints else ""))


def _report_error(command: str, error: BaseException, debug: bool) -> int:
    """The one place an exception becomes an exit code (`interp.errors.exit_code_for`) and a message.

    Bad input and a failing user model: exit 2, one message naming what failed and where (the
    traceback with INTERP_DEBUG=1), filled to the terminal (`output.print_error`). A closed stdout:
    exit 0, silently. A bug: exit 3, traceback.
    """
    from interp.errors import EXIT_INTERNAL as INTERNAL
    from interp.errors import EXIT_OK as OK
    from interp.errors import as_reported, exit_code_for

    if isinstance(error, BrokenPipeError) or _stdout_closed(error):
        _silence_stdout()
        return OK
    error = as_reported(error)  # raised inside the user's own model or factory: their input, not our bug
    code = exit_code_for(error)
    child_traceback = getattr(error, "child_traceback", "")  # raised in the child that ran the model
    if code == INTERNAL:
        import traceback

        if child_traceback:
            print(child_traceback, file=sys.stderr, end="")
        else:
            traceback.print_exception(error)
        print_error(f"interp {command}: internal error ({type(error).__name__}); please report it with the traceback "
                    "above.")
        return code
    if debug:
        import traceback

        if child_traceback:
            print(child_traceback, file=sys.stderr, end="")
        else:
            traceback.print_exception(error)
    print_error(f"interp {command}: error: {_message(error)}")
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
