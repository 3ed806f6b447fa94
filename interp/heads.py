"""Heads and their labels: `Head(layer, head)`, labelled `L{layer}H{head}` (0-based), in one place.

Standard library only (the `interp` command parses head flags and claims files before it
imports torch). `Head` is a NamedTuple, so it equals, hashes, unpacks and serialises (JSON: a
list) like the plain `(layer, head)` pair it replaces; its repr is that pair's too, so messages
and files that print heads read as before. The label is `head.label` or `head_label(head)`.
"""
from __future__ import annotations

import re
from typing import NamedTuple, Union

from interp.errors import BadInput

_LABEL = re.compile(r"^\s*L(\d+)\s*H(\d+)\s*$", re.IGNORECASE)


class Head(NamedTuple):
    """One attention head: its layer and its index within the layer, both 0-based."""

    layer: int
    head: int

    @property
    def label(self) -> str:
        """'L1H2' for Head(1, 2)."""
        return head_label(self)

    def __repr__(self) -> str:
        return f"({self.layer!r}, {self.head!r})"


HeadLike = Union[tuple[int, int], str]  # a Head, a (layer, head) pair or a label "L1H3"


def head_label(head: tuple[int, int]) -> str:
    """'L1H2' for Head(1, 2) or the pair (1, 2)."""
    layer, index = head
    return f"L{layer}H{index}"


def parse_head(head: HeadLike | list[int]) -> Head:
    """A Head from a label 'L1H2' (case and spaces ignored) or a (layer, head) pair of integers; a clear error otherwise."""
    if isinstance(head, str):
        match = _LABEL.match(head)
        if not match:
            raise BadInput(f"{head!r} is not a head label: it is not of the form L{{layer}}H{{head}} (e.g. 'L1H2').")
        return Head(int(match.group(1)), int(match.group(2)))
    try:
        layer, index = head
        if isinstance(layer, bool) or isinstance(index, bool):
            raise TypeError
        return Head(int(layer), int(index))
    except (TypeError, ValueError):
        raise BadInput(
            f"head {head!r} is not a (layer, head) pair of integers or an 'L{{layer}}H{{head}}' label."
        ) from None
