"""The top-n circuits of an edge ranking: MIB's fractions of the edges, the top n by score, dangling edges pruned.
Shared by the faithfulness curve (`curve`: every fraction, on held-out prompts) and EAP discovery (`discovery`:
the smallest fraction whose circuit is faithful on the proposing prompts).

    kept = top_n(ranked(scores, graph(model), absolute=True), MIB_FRACTIONS, kv_readers(model))  # (n, pruned sets)
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from interp.errors import BadInput
from interp.paths import Edge, Node

MIB_FRACTIONS: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def prune(edges: set[Edge], untested: Iterable[Edge] = (), readers: Mapping[Node, Iterable[Node]] | None = None
          ) -> set[Edge]:
    """Drop edges from senders with no kept input (but the embeddings) and into receivers with no kept output
    (but the logits), until none is left to drop: patching those changes nothing. `untested` edges (their sender's
    write is the same under the corruption, so no patch can test them) are never dropped for their sender's inputs,
    only when nothing reads their receiver. `readers` (`interp.paths.kv_readers`): each key/value head's query
    heads, on grouped-query models: a key/value head's outputs are its query heads', and a query head has input
    when its key/value head has."""
    kept, exempt = set(edges), set(untested)
    groups = {kv: tuple(heads) for kv, heads in (readers or {}).items()}
    unknown = sorted({e.receiver.label for e in kept if e.receiver.kind == "kv" and e.receiver not in groups})
    if unknown:
        raise BadInput(f"prune: edges into key/value heads {unknown} need their query heads (readers="
                       "interp.paths.kv_readers(model)).")
    kv_of = {head: kv for kv, heads in groups.items() for head in heads}
    while True:
        has_input = {e.receiver for e in kept}
        has_input |= {head for head, kv in kv_of.items() if kv in has_input}
        has_output = {e.sender for e in kept}
        has_output |= {kv for kv, heads in groups.items() if has_output.intersection(heads)}
        drop = {e for e in kept if (e.sender.kind != "embed" and e.sender not in has_input and e not in exempt)
                or (e.receiver.kind != "logits" and e.receiver not in has_output)}
        if not drop:
            return kept
        kept -= drop


def ranked(scores: dict[str, float], every: list[Edge], absolute: bool) -> list[Edge]:
    """Edges by score, descending (|score| with `absolute`); ties in graph order (stable)."""
    key = (lambda e: -abs(scores[e.label])) if absolute else (lambda e: -scores[e.label])
    return sorted(every, key=key)


def top_n(order: list[Edge], fractions: Sequence[float], readers: Mapping[Node, Iterable[Node]] | None = None
          ) -> tuple[list[int], list[frozenset[Edge]]]:
    """Per fraction: int(fraction x edges) selected from the top of `order`, then dangling edges pruned (`prune`)."""
    selected = [int(fraction * len(order)) for fraction in fractions]
    return selected, [frozenset(prune(set(order[:n]), readers=readers)) for n in selected]


__all__ = ["MIB_FRACTIONS", "prune", "ranked", "top_n"]
