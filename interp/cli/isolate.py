"""The user's model in a child process: `audit-leakage` and `claims --strict` cannot end green by accident.

A model module without an `if __name__ == "__main__":` guard, a factory or a forward may call
`sys.exit(0)`, `os._exit(0)`, crash in native code, or close file descriptor 1. Run in the `interp`
process itself, `sys.exit(0)` would end the command with exit 0 and no verdict: a CI gate passes
without any check. So these commands run the work that touches the model (loading it, the audit or
the claims, rendering the terminal output and the documents) in a forked child, which sends back one
JSON document (`Outcome`) through a pipe of its own. The parent, which never runs the user's code,
prints what the child rendered and writes the requested outputs through the CLI's one write helper
(`interp.cli.output`). When the child ends without a document, or with an error, the parent raises
`ChildFailure`: exit 2 for the user's model (or input), 3 for a bug of the toolkit, and `interp.cli.main`
writes every requested output as a failure document.

Fork (not spawn) keeps the parent's state (the parsed arguments, `--device`, a test's monkeypatches) and
costs no second import of torch. Where forking is not safe, the work runs in this process as before: in
a process group (`--workers`, torchrun: the collectives belong to this process), and after CUDA has been
initialised here (a forked child cannot use it).
"""
from __future__ import annotations

import io
import json
import os
import signal
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from interp.errors import EXIT_INPUT, InterpError


@dataclass
class Outcome:
    """What the work sent back: its exit code, the terminal text it rendered, and the documents to write
    (flag -> (text, what), e.g. "sarif" -> (the log, "SARIF")) and the JSON result (None without --json);
    `relayed`: what the child wrote to a stdout or stderr that is not a file descriptor here (a test's capture, a
    notebook's stream), for this process to write there."""

    exit_code: int
    console: str = ""
    documents: dict[str, tuple[str, str]] = field(default_factory=dict)
    json_result: Any = None
    relayed: dict[str, str] = field(default_factory=dict)


class ChildFailure(InterpError):
    """The child running the model failed (an error, `sys.exit`, `os._exit`, a crash): the exit code it calls for,
    the error's type name as the child saw it, and its traceback text (printed for an internal error)."""

    def __init__(self, message: str, *, kind: str, exit_code: int, child_traceback: str = ""):
        super().__init__(message)
        self.kind, self.exit_code, self.child_traceback = kind, exit_code, child_traceback


@dataclass(frozen=True)
class ConsoleSettings:
    """How the parent's console renders (its width, whether it is a terminal, its colours), so the child's text
    looks as if printed here."""

    width: int
    terminal: bool
    color_system: str | None
    quiet: bool
    stderr: bool


def console_settings(console: Any) -> ConsoleSettings:
    return ConsoleSettings(width=console.width, terminal=console.is_terminal, color_system=console.color_system,
                           quiet=console.quiet, stderr=console.stderr)


def capturing_console(settings: ConsoleSettings) -> Any:
    """A rich Console that renders into a string as the parent's console would (`.file.getvalue()`)."""
    from rich.console import Console

    return Console(file=io.StringIO(), width=settings.width, force_terminal=settings.terminal,
                   color_system=settings.color_system, highlight=False)  # type: ignore[arg-type]


def isolation_possible(args: Any) -> bool:
    """Whether the work may run in a forked child (see the module docstring)."""
    if (getattr(args, "workers", 1) or 1) > 1 or "WORLD_SIZE" in os.environ:
        return False
    torch = sys.modules.get("torch")
    return not (torch is not None and torch.cuda.is_initialized()) and hasattr(os, "fork")


def run(args: Any, work: Callable[[Any], Outcome], what: str) -> Outcome:
    """`work(args)` in a forked child (in this process where that is not possible); its `Outcome`, or a
    `ChildFailure` naming what went wrong. `what` names the model for the messages ("the model spec 'mygpt:build'")."""
    if not isolation_possible(args):
        return work(args)
    import multiprocessing

    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(writer, work, args, what), name="interp-model", daemon=False)
    sys.stdout.flush()
    sys.stderr.flush()
    child.start()
    writer.close()  # the child holds the only writing end: its end is our EOF
    try:
        data = reader.recv_bytes()
    except EOFError:
        data = None
    finally:
        reader.close()
        child.join()
    if data is None:
        raise ChildFailure(_died(child.exitcode, what), kind="ProcessEnded", exit_code=EXIT_INPUT)
    document = json.loads(data.decode("utf-8"))
    for name, text in document.get("relayed", {}).items():  # the child's writes to a stream without a descriptor
        getattr(sys, name).write(text)
    if document.get("error"):
        error = document["error"]
        raise ChildFailure(error["message"], kind=error["type"], exit_code=error["exit_code"],
                           child_traceback=error.get("traceback", ""))
    return Outcome(document["exit_code"], document["console"], {k: tuple(v) for k, v in document["documents"].items()},
                   document["json_result"])


def _died(exit_code: int | None, what: str) -> str:
    """Why a child that sent nothing ended, in words."""
    if exit_code is not None and exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        how = f"was killed by {name} (a crash in native code, or the system ran out of memory)"
    else:
        how = (f"ended with exit status {exit_code} before it had a result (the model's code called os._exit, or "
               "closed the pipe the result is sent through)")
    return (f"the process running {what} {how}; no check ran. A model must not end the process: remove the call, "
            "or guard a script's entry point with `if __name__ == \"__main__\":`.")


def _child(writer: Any, work: Callable[[Any], Outcome], args: Any, what: str) -> None:
    """The child: run the work, send one document (its outcome or its error, and what it wrote to streams that
    have no file descriptor), and end."""
    relayed = _relay_streams()
    try:
        outcome = work(args)
        document: dict[str, Any] = {"exit_code": outcome.exit_code, "console": outcome.console,
                                    "documents": outcome.documents, "json_result": outcome.json_result, "error": None}
    except BaseException as error:  # SystemExit and KeyboardInterrupt too: the parent decides what they mean
        document = {"error": describe(error, what)}
    document["relayed"] = {name: buffer.getvalue() for name, buffer in relayed.items()}
    try:
        writer.send_bytes(json.dumps(document, default=_jsonable).encode("utf-8"))
    except BaseException as error:  # a result that cannot be sent: say so, once
        writer.send_bytes(json.dumps({"error": describe(error, what)}).encode("utf-8"))
    finally:
        writer.close()


def _relay_streams() -> dict[str, io.StringIO]:
    """In the child: sys.stdout / sys.stderr that write to no file descriptor (pytest's capture, a notebook's stream
    objects: the child's copies of them are lost with it) replaced by buffers sent back to the parent; a stream on a
    descriptor is left as it is, so progress bars stay live."""
    relayed: dict[str, io.StringIO] = {}
    for name in ("stdout", "stderr"):
        try:
            getattr(sys, name).fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
            relayed[name] = io.StringIO()
            setattr(sys, name, relayed[name])
    return relayed


def describe(error: BaseException, what: str) -> dict[str, Any]:
    """An error raised in the child as the parent reports it: type, message, exit code (2 for the user's model or
    input, 3 for a bug of the toolkit, 130 for an interrupt) and traceback."""
    from interp.cli.common import _message
    from interp.errors import EXIT_INTERNAL, as_reported, exit_code_for, toolkit_roots, user_frame

    text = "".join(traceback.format_exception(error))
    if isinstance(error, SystemExit):
        where = user_frame(error, toolkit_roots())
        at = f" at {where}" if where else ""
        return {"type": "SystemExit", "exit_code": EXIT_INPUT, "traceback": text,
                "message": f"{what} called sys.exit({error.code!r}){at} (in its module, factory or forward); no check "
                           "ran. A model must not end the process: remove the call, or guard a script's entry point "
                           "with `if __name__ == \"__main__\":`."}
    if isinstance(error, KeyboardInterrupt):
        return {"type": "KeyboardInterrupt", "exit_code": 130, "traceback": "", "message": "interrupted"}
    reported = as_reported(error)
    code = exit_code_for(reported)
    return {"type": type(reported).__name__, "exit_code": code, "message": _message(reported),
            "traceback": text if code == EXIT_INTERNAL or os.environ.get("INTERP_DEBUG") else ""}


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)
