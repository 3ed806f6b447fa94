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


class BadType(BadInput, TypeError):
    """An argument of the wrong type (a float tensor for token ids, an int for a spec). Exit code 2."""


class ModelError(InterpError, RuntimeError):
    """The user's model, factory or checkpoint failed while the toolkit ran it. Exit code 2."""

    exit_code = EXIT_INPUT


class CheckpointError(ModelError, ValueError):
    """A checkpoint file that cannot be read or does not describe the model it claims. Exit code 2.

    Also a `ValueError`, as checkpoint mismatches always were."""


class InternalError(InterpError, RuntimeError):
    """A bug in the toolkit itself. Exit code 3."""

    exit_code = EXIT_INTERNAL


# exceptions that carry the caller's bad input when they are not ours: a ValueError / KeyError /
# missing file raised with a message naming the value (the convention before `BadInput` existed)
_LEGACY_INPUT = (ValueError, KeyError, OSError)  # OSError: a missing or unwritable file, a full disk: not a bug of ours


def exit_code_for(error: BaseException) -> int:
    """The CLI's exit code for an exception: 2 for the user's input or model, 3 for a bug.

    A closed stdout (`BrokenPipeError`, e.g. `interp verify | head -1`) is no failure of ours: 0.
    """
    if isinstance(error, InterpError):
        return error.exit_code
    if isinstance(error, BrokenPipeError):
        return EXIT_OK
    if isinstance(error, _LEGACY_INPUT):
        return EXIT_INPUT
    return EXIT_INTERNAL


def toolkit_roots() -> tuple[str, ...]:
    """The folders of the toolkit's own packages (interp, analyses, models), each ending in a separator."""
    import os
    from pathlib import Path

    here = Path(__file__).resolve().parent  # interp/; in a checkout models/ and analyses/ are linked in from beside it
    return tuple(dict.fromkeys(str(folder) + os.sep for folder in (here, (here / "analyses").resolve(),
                                                                      (here / "models").resolve())))


def user_failure(error: BaseException, what: str) -> ModelError | None:
    """A ModelError for `error` when it was raised in the user's own code (see `user_frame`), else None.

    `what` names the model or factory; our own errors and input checks (InterpError, ValueError)
    are left as they are, and so is anything raised in the toolkit: a bug there must stay a bug.
    """
    if isinstance(error, (InterpError, ValueError, KeyboardInterrupt)):
        return None
    where = user_frame(error, toolkit_roots())
    if where is None:
        return None
    return ModelError(f"{what} raised {type(error).__name__} at {where}: {error}")


def user_frame(error: BaseException, toolkit_roots: tuple[str, ...]) -> str | None:
    """`file:line` of the innermost traceback frame in the user's own code, or None.

    User code is any file outside the toolkit (`toolkit_roots`), the standard library and
    installed packages: the module a `package.module:factory` spec or a test defines. An
    exception raised there is the user's model failing (exit 2), not a toolkit bug (exit 3).
    """
    import sys
    import sysconfig

    library = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")} | {sys.prefix, sys.base_prefix})
    found = None
    traceback = error.__traceback__
    while traceback is not None:
        filename = traceback.tb_frame.f_code.co_filename
        if not filename.startswith(("<", *library, *toolkit_roots)):
            found = f"{filename}:{traceback.tb_lineno}"
        traceback = traceback.tb_next
    return found


def model_code_failure(error: BaseException, where: str) -> ModelError:
    """The ModelError for `error` raised at `where` (`file:line`) in the user's own model or factory code."""
    text = str(error)
    if isinstance(error, KeyError) and text.startswith(("'", '"')):
        text = text[1:-1]
    return ModelError(f"the model's own code raised {type(error).__name__} at {where}: {text or type(error).__name__}")


def as_reported(error: BaseException) -> BaseException:
    """`error` as the CLI classifies it: a would-be internal error (exit 3) raised inside the user's own
    code (`user_frame`) becomes the `model_code_failure` there (exit 2); anything else is returned as is."""
    if exit_code_for(error) != EXIT_INTERNAL:
        return error
    where = user_frame(error, toolkit_roots())
    return error if where is None else model_code_failure(error, where)


class RemoteFailure:
    """An exception raised in another process (a worker rank), as picklable data, so that the parent can
    raise the same class with the same message (and so exit with the same code).

    `of(error, process)` in the failing process: the error as the CLI would classify it there
    (`as_reported`, which needs the traceback's frames), pickled when that round-trips, else its class
    name and message. `rebuild()` in the parent: that exception again, with a note naming the process
    and carrying its traceback; a class that cannot be rebuilt becomes an InternalError naming it.
    """

    def __init__(self, pickled: bytes | None, name: str, message: str, process: str, traceback: str):
        self.pickled, self.name, self.message, self.process, self.traceback = pickled, name, message, process, traceback

    @classmethod
    def of(cls, error: BaseException, process: str) -> "RemoteFailure":
        import pickle
        import traceback

        reported = as_reported(error)
        text = "".join(traceback.format_exception(error))
        pickled: bytes | None
        try:
            data = pickle.dumps(reported)
            pickle.loads(data)  # our own bytes; a class pickle cannot find by name fails here, not in the parent
            pickled = data
        except Exception:  # any pickling failure: fall back to the name and message
            pickled = None
        return cls(pickled, type(reported).__name__, str(reported), process, text)

    def rebuild(self) -> BaseException:
        import pickle

        error: BaseException | None = None
        if self.pickled is not None:
            try:
                error = pickle.loads(self.pickled)  # bytes our own worker process wrote, never a user's file
            except Exception:  # the class cannot be rebuilt here
                error = None
        if not isinstance(error, BaseException):
            error = InternalError(f"{self.process} failed with {self.name}: {self.message}")
        error.add_note(f"raised in {self.process}:\n{self.traceback.rstrip()}")
        return error
