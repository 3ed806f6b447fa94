"""The toolkit's error classes: who is at fault decides the exit code.

- `BadInput`: the caller gave something wrong (a value, a file, a spec, a flag). Exit 2.
- `ModelError`: the user's own model, factory or checkpoint failed while we ran it. Exit 2:
  it is the user's input too, but the message says which module failed and where.
- `InternalError`: a bug of the toolkit. Exit 3, with a traceback, "please report it".

`BadInput` subclasses `ValueError` (and `ModelError` `RuntimeError`) so code written against
the earlier convention (`except ValueError`) keeps working. Every message names the value,
what was expected and how to fix it.
"""
from __future__ import annotations

EXIT_OK, EXIT_FINDING, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


class InterpError(Exception):
    """Base class of every error the toolkit raises on purpose."""

    exit_code = EXIT_INTERNAL


class BadInput(InterpError, ValueError):
    """Wrong input from the caller: a value, a file, a spec, a flag. Exit code 2."""

    exit_code = EXIT_INPUT


class ModelError(InterpError, RuntimeError):
    """The user's model, factory or checkpoint failed while the toolkit ran it. Exit code 2."""

    exit_code = EXIT_INPUT


class InternalError(InterpError, RuntimeError):
    """A bug in the toolkit itself. Exit code 3."""

    exit_code = EXIT_INTERNAL


def exit_code_for(error: BaseException) -> int:
    """The CLI's exit code for an exception: 2 for the user's input or model, 3 for a bug."""
    if isinstance(error, InterpError):
        return error.exit_code
    return EXIT_INTERNAL
