"""Every requested output written on every exit code: the documents `audit-leakage` and `claims` write when they fail.

Once the arguments parse, these commands (the ones CI gates read) still write each output asked for on an error
(`--json`, `--sarif`, `--junit`), so that a CI step reading them (an `upload-sarif` step with
`if: always()`, a gate on `.result.causal`) finds a document saying what went wrong rather than a
missing file and a second, misleading error: JSON with `result: null` and `error: {type, message,
exit_code}` (JSON schema 2), SARIF with `invocations[0].executionSuccessful: false` and the error as a
tool execution notification, JUnit with one test case `audit` in error. Written through the CLI's one
write helper (`interp.cli.output`); a document that cannot be written is not an error of its own (the
command's error is the one reported), and a target whose own write failed is left as it was.
"""
from __future__ import annotations

import sys
from typing import Any

FLAGS = ("json", "sarif", "junit")
COMMANDS = ("audit-leakage", "claims")  # the commands CI gates read; they write failure documents


def error_fields(error: BaseException, exit_code: int) -> dict[str, Any]:
    """The JSON envelope's `error`: the type (as the failing process saw it), the message, the exit code."""
    from interp.cli.common import _message

    kind = getattr(error, "kind", None) or type(error).__name__  # a ChildFailure carries the child's own type
    return {"type": kind, "message": _message(error), "exit_code": exit_code}


def write_failure_documents(args: Any, command: str, error: BaseException, exit_code: int) -> None:
    """Each of --json / --sarif / --junit that `args` asks for, as a failure document (see the module docstring)."""
    import interp.cli.output as output
    from interp.errors import InterpError

    if command not in COMMANDS:
        return
    failed = getattr(error, "failed_target", None)  # the target whose own write failed keeps what it held
    targets: dict[str, str] = {flag: str(getattr(args, flag)) for flag in FLAGS
                               if getattr(args, flag, None) is not None and str(getattr(args, flag)) != failed}
    if not targets:
        return
    fields = error_fields(error, exit_code)
    output._PENDING_STDOUT.clear()  # a document half-made for stdout before the error is not the answer
    for flag, target in targets.items():
        try:
            text, what = _document(flag, args, command, fields)
            output._write_text(target, text, what)
        except (InterpError, OSError, ValueError):  # the target itself is the problem: the command's error says enough
            continue
    for text in output._PENDING_STDOUT:  # the fence that writes them after a command is gone with its error
        sys.stdout.write(text)
    output._PENDING_STDOUT.clear()
    sys.stdout.flush()


def _document(flag: str, args: Any, command: str, fields: dict[str, Any]) -> tuple[str, str]:
    import json

    from interp.cli.output import _json_default, envelope

    if flag == "json":
        model = getattr(args, "spec", None)
        payload = envelope(command, model, None, error=fields)
        return json.dumps(payload, indent=2, sort_keys=True, default=_json_default) + "\n", "JSON"
    from interp.analyses.leakage import ci

    if flag == "sarif":
        log = ci.sarif_failure(fields["type"], fields["message"], fields["exit_code"])
        return json.dumps(log, indent=2) + "\n", "SARIF"
    return ci.junit_failure(f"interp {command} {getattr(args, 'spec', '')}".strip(), fields["type"], fields["message"]), "JUnit XML"
