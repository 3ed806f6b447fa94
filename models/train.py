"""Moved: the training command is `interp train` (the module `interp.experiments.train`).

`python -m interp.models.train ...` is refused (exit 2) with the new command, the same flags after it. Standard
library only: models/ imports no toolkit.
"""
from __future__ import annotations

import sys

MOVED = ("python -m interp.models.train moved: run `interp train ARGS...` (the same flags; the module is "
         "interp.experiments.train).")


def __getattr__(name: str):
    raise AttributeError(f"interp.models.train.{name}: the module moved to interp.experiments.train; import it from there.")


if __name__ == "__main__":
    print(MOVED, file=sys.stderr)
    raise SystemExit(2)
