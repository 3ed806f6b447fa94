"""Moved: stdlib-bpe's training is `interp train stdlib-bpe` (the module `interp.experiments.stdlib_bpe`).

`python -m interp.models.stdlib_bpe ...` is refused (exit 2) with the new command, the same words after it
(`train ...`, `finish ...`). Standard library only: models/ imports no toolkit.
"""
from __future__ import annotations

import sys

MOVED = ("python -m interp.models.stdlib_bpe moved: run `interp train stdlib-bpe train ...` or "
         "`interp train stdlib-bpe finish ...` (the same arguments; the module is interp.experiments.stdlib_bpe).")


def __getattr__(name: str):
    raise AttributeError(f"interp.models.stdlib_bpe.{name}: the module moved to interp.experiments.stdlib_bpe; import it from there.")


if __name__ == "__main__":
    print(MOVED, file=sys.stderr)
    raise SystemExit(2)
