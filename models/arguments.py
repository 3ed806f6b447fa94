"""Argument types for the training commands (`interp train`, `interp train stdlib-bpe`: `interp.experiments`).

Each factory returns an argparse `type=` function that turns the text into a number in its range or raises
`argparse.ArgumentTypeError` naming the range: argparse then prints "argument --steps: ..." and exits 2,
before the command reads a corpus, builds a model or writes anything. NaN and infinities are refused
everywhere (a float flag holding "nan" would otherwise pass every comparison). Standard library only:
`models/` imports no toolkit.
"""
from __future__ import annotations

import argparse
import math
from typing import Callable


def whole(minimum: int, maximum: int | None = None, *, why: str = "") -> Callable[[str], int]:
    """A whole number in [minimum, maximum]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum or (maximum is not None and value > maximum):
            span = f"at least {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise argparse.ArgumentTypeError(f"{value} must be {span}{why}")
        return value
    return parse


def real(minimum: float | None = None, maximum: float | None = None, *, above: bool = False,
         why: str = "") -> Callable[[str], float]:
    """A finite number at least `minimum` (above it with `above=True`) and at most `maximum`."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        low_ok = minimum is None or (value > minimum if above else value >= minimum)
        if not math.isfinite(value) or not low_ok or (maximum is not None and value > maximum):
            parts = [] if minimum is None else [f"{'above' if above else 'at least'} {minimum:g}"]
            parts += [] if maximum is None else [f"at most {maximum:g}"]
            raise argparse.ArgumentTypeError(f"{text} must be a finite number{' ' if parts else ''}"
                                             f"{' and '.join(parts)}{why}")
        return value
    return parse


__all__ = ["real", "whole"]
