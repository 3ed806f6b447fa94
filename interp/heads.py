"""Heads and their labels: `Head(layer, head)`, labelled `L{layer}H{head}` (0-based), in one place.

Standard library only (the `interp` command parses head flags and claims files before it
imports torch). `Head` is a NamedTuple, so it equals, hashes, unpacks and serialises (JSON: a
list) like the plain `(layer, head)` pair it replaces; its repr is that pair's too, so messages
and files that print heads read as before. The label is `head.label` or `head_label(head)`.

`parse_label` is the toolkit's one parser of head labels (`parse_head`, claims files, CLI flags and the
graph's nodes in `interp.paths` all go through it). It accepts exactly:

    L{layer}H{head}     a (query) head, e.g. 'L1H2'            -> Head(1, 2)
    L{layer}KV{kv_head} a key/value head of grouped-query attention, shared by a group of query
                        heads, e.g. 'L1KV0'                     -> KVHead(1, 0)

with `layer`, `head` and `kv_head` whole numbers written in ASCII digits (0-based; leading zeros are
read as decimal), letters in either case, and spaces allowed around the label and between its two
parts ('l1 h2' is L1H2; 'L 1H2', 'L1H-2' and 'L1.0H2' are refused). A `KVHead` is not a `Head` (it
neither equals nor hashes like one), so a key/value head can never be taken for the query head of the
same index.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple, Union

from interp.errors import BadInput

_LABEL = re.compile(r"^\s*L([0-9]+)\s*(H|KV)([0-9]+)\s*$", re.IGNORECASE)


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


@dataclass(frozen=True, order=True)
class KVHead:
    """One key/value head of a grouped-query attention layer: its layer and its index among the layer's
    key/value heads (0-based), labelled `L{layer}KV{kv_head}`. Not a `Head`: it never equals one."""

    layer: int
    kv_head: int

    @property
    def label(self) -> str:
        """'L1KV0' for KVHead(1, 0)."""
        return f"L{self.layer}KV{self.kv_head}"

    def __str__(self) -> str:
        return self.label


def parse_label(label: str) -> Head | KVHead:
    """A Head from 'L1H2' or a KVHead from 'L1KV0' (the grammar is in the module docstring); BadInput otherwise."""
    match = _LABEL.match(label) if isinstance(label, str) else None
    if match is None:
        raise BadInput(f"{label!r} is not a head label: it is not of the form L{{layer}}H{{head}} (e.g. 'L1H2') or "
                       "L{layer}KV{kv_head} (a key/value head, e.g. 'L1KV0').")
    layer, kind, index = int(match.group(1)), match.group(2).upper(), int(match.group(3))
    return Head(layer, index) if kind == "H" else KVHead(layer, index)


def parse_head(head: HeadLike | list[int]) -> Head:
    """A Head from a label 'L1H2' (`parse_label`) or a (layer, head) pair of integers; a clear error otherwise
    (a key/value head label 'L1KV0' is refused: it names no single query head)."""
    if isinstance(head, str):
        parsed = parse_label(head)
        if isinstance(parsed, KVHead):
            raise BadInput(f"{head!r} names key/value head {parsed.label}, shared by a group of query heads; name one "
                           f"query head here, L{{layer}}H{{head}} (e.g. 'L{parsed.layer}H0').")
        return parsed
    try:
        layer, index = head
        if isinstance(layer, bool) or isinstance(index, bool):
            raise TypeError
        return Head(int(layer), int(index))
    except (TypeError, ValueError):
        raise BadInput(
            f"head {head!r} is not a (layer, head) pair of integers or an 'L{{layer}}H{{head}}' label."
        ) from None
