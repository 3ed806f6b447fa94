"""Where a contract breaks, down to the line: the origin search of the causal audit (`origin.find_origin`) on the
contract's own pair of inputs and call arguments, and, for a dependence that is missing (a document cut by an
over-eager mask), the first attention op whose mask hides a key the contract says is visible.

A bug in how a mask is *built* shows at the op that applies it (the attention call): that line is the origin,
with the mask's words; the line that built it is named where the recorded construction finds it.
"""
from __future__ import annotations

import sys
from typing import Any

import torch

from interp.analyses.leakage.methods import localisation_threshold
from interp.analyses.leakage.origin import OpPair, Origin, _op_name, _run, call_site, find_origin, op_visibility
from interp.analyses.leakage.types import DEFAULT_TOL


def origin_of_change(model: Any, reference: torch.Tensor, variant: torch.Tensor, keep: torch.Tensor, *, kind: str,
                     leak: float, words: str, mask: torch.Tensor | None = None) -> Origin | None:
    """The first op at which an output at `keep` moves between `reference` and `variant` (1, pos), `model` a callable
    of the tokens (and an attention_mask) that adds the contract's arguments (`common.with_arguments`)."""
    pair = OpPair("future" if kind == "future" else kind, reference, variant, 0, keep,
                  lambda q: f"row {q} {words}", mask)
    try:
        origin = find_origin(model, pair, localisation_threshold(leak, DEFAULT_TOL))
    except Exception:  # the model failed on the localisation inputs: the verdict stands without a line
        return None
    if origin is None:
        return None
    return Origin(kind, origin.frame, origin.op, origin.detail, origin.influence, origin.mask, origin.user_frame,
                  origin.built, origin.built_by)


def origin_of_hidden(model: Any, tokens: torch.Tensor, query: int, key: int, *, kind: str, words: str) -> Origin | None:
    """The first op whose mask hides `key` from `query` (tokens (1, pos)): where an over-masking mask is applied."""
    n_pos = tokens.shape[1]
    found: list[Origin] = []

    def visit(index: int, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if found:
            return
        visible = visibility(func, args, kwargs, n_pos)
        if visible is not None and not bool(visible[query, key]):
            site, user = call_site(sys._getframe(1))
            found.append(Origin(kind, site, _op_name(func), words, 0.0,
                                f"the mask hides key {key} from query {query}", user))

    try:
        _run(model, tokens, None, visit)
    except Exception:
        return None
    return found[0] if found else None


def visibility(func: Any, args: tuple, kwargs: dict, n_pos: int) -> torch.Tensor | None:
    """(query, key) bool: what an attention op's mask lets a query of the first row see (any head); None when the op
    takes no square mask over the positions (`op_visibility`)."""
    visible = op_visibility(func, args, kwargs, n_pos)
    if visible is None:
        return None
    first = visible.reshape(-1, *visible.shape[-3:]) if visible.ndim >= 3 else visible[None]
    return first[0].reshape(-1, n_pos, n_pos).any(dim=0).cpu()  # (query, key)


def origin_of_layer(model: Any, tokens: torch.Tensor, layer: int, n_layers: int, query: int, key: int, *, kind: str,
                    words: str) -> Origin | None:
    """The attention op of `layer` (the layer-th op taking a square mask, when there is one per layer; else the first
    whose mask shows `key` to `query`), for a layer whose weights broke its window while the outputs could not say
    (tokens (1, pos))."""
    n_pos = tokens.shape[1]
    ops: list[tuple[Any, str, bool, Any]] = []

    def visit(index: int, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        visible = visibility(func, args, kwargs, n_pos)
        if visible is not None:
            site, user = call_site(sys._getframe(1))
            ops.append((site, _op_name(func), bool(visible[query, key]), user))

    try:
        _run(model, tokens, None, visit)
    except Exception:
        return None
    chosen = ops[layer] if len(ops) == n_layers else next((op for op in ops if op[2]), None)
    if chosen is None:
        return None
    site, op, shows, user = chosen
    seen = f"the mask {'shows' if shows else 'hides'} key {key} to query {query}"
    return Origin(kind, site, op, words, 0.0, seen, user)
