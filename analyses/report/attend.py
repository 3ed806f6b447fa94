"""The report's section "Why these heads attend": for each head with a supported claim, the source pairs behind
its preference for the key it attends to (`interp.analyses.qk.attribute`, the difference view).

A head is discussed when a claim about it alone is supported (at most `MAX_HEADS`, in the claims table's order).
Each is attributed at the last real token of up to `N_PROMPTS` prompts (those sharing the most common last
position): an induction head at its induction target (the token after the earlier occurrence of the current
one, on repeated prompts), any other head at its highest-attention key; the contrast is the highest-scoring
other key, so each term is a share of s(q, k) - s(q, k') = log p_k - log p_k'. The section lists the `TOP`
pairs of largest mean term with bootstrap CIs and the strongest source on each side. A model the
decomposition does not cover (post-norm, a head of its own kind) gets the reason instead
(`AttendSection.note`), as the circuit section does.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd
import torch
from torch import nn

from interp.data import PromptSet, Repeats
from interp.errors import BadInput
from interp.heads import head_label
from interp.viewer import MAX_PROMPTS, MAX_TOKENS

MAX_HEADS = 8  # heads attributed: one forward per head and batch of prompts
N_PROMPTS = 16  # prompts per head
TOP = 5  # source pairs shown per head


@dataclass(frozen=True)
class HeadReason:
    """One head's answer: where it was attributed, and the pairs and sources behind its preference."""

    label: str
    claim: str  # the supported claim that brought it into the section, e.g. "induction"
    query: int  # the query position attributed (the prompts' last real token)
    key: str  # which key: "induction target (position 21)" or "highest-attention key"
    n_prompts: int
    weight: float  # mean attention weight on the key
    difference: float  # mean s(q, k) - s(q, k')
    pairs: pd.DataFrame  # TOP rows: query_source, key_source, mean, ci_low, ci_high, n_prompts
    sources: pd.DataFrame  # the strongest source of each side: side, source, mean, ci_low, ci_high

    def to_json(self) -> dict[str, Any]:
        return {"head": self.label, "claim": self.claim, "query": self.query, "key": self.key,
                "n_prompts": self.n_prompts, "weight": self.weight, "difference": self.difference,
                "pairs": _records(self.pairs), "sources": _records(self.sources)}


@dataclass(frozen=True)
class AttendSection:
    """The section's content: one `HeadReason` per discussed head, or why there are none (`note`)."""

    heads: tuple[HeadReason, ...] = ()
    note: str = ""  # why a head, or the whole section, was left out

    def to_json(self) -> dict[str, Any]:
        return {"heads": [h.to_json() for h in self.heads], "note": self.note}


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain JSON values (NaN as null)."""
    return json.loads(frame.to_json(orient="records"))


def discussed_heads(claims: pd.DataFrame, claim_heads: Sequence[tuple[tuple[int, int], ...]]) -> list[tuple[tuple[int, int], str]]:
    """(head, claim) for each head with a supported claim about it alone, first claim first, at most MAX_HEADS;
    an induction claim is preferred (it names a key to attribute)."""
    chosen: dict[tuple[int, int], str] = {}
    for (_, row), heads in zip(claims.iterrows(), claim_heads):
        if row.get("verdict") != "supported" or len(heads) != 1:
            continue
        head, claim = (int(heads[0][0]), int(heads[0][1])), str(row.get("claim", ""))
        if head not in chosen or ("induction" in claim and "induction" not in chosen[head]):
            chosen[head] = claim
    return list(chosen.items())[:MAX_HEADS]


def report_attend(model: nn.Module, prompts: PromptSet, claims: pd.DataFrame,
                  claim_heads: Sequence[tuple[tuple[int, int], ...]]) -> AttendSection:
    """The section (see the module): each discussed head attributed, or the reason none could be."""
    heads = discussed_heads(claims, claim_heads)
    if not heads:
        return AttendSection(note="no claim about a single head was supported, so no head's attention is explained")
    chosen, query = _common_query(prompts)
    reasons, refused = [], dict[str, list[str]]()
    for head, claim in heads:
        try:
            reasons.append(_reason(model, chosen, head, claim, query))
        except BadInput as error:  # one reason shared by many heads (a model that hides its projections) said once
            refused.setdefault(str(error), []).append(head_label(head))
    return AttendSection(tuple(reasons), "; ".join(f"{', '.join(labels)}: {why}" for why, labels in refused.items()))


def _common_query(prompts: PromptSet) -> tuple[PromptSet, int]:
    """Up to N_PROMPTS prompts whose last real token is at the most common position, and that position."""
    real = prompts.real_mask()
    last = real.long().cumsum(1).argmax(1)  # (prompt,) each prompt's last real position
    position = int(torch.mode(last).values)
    rows = (last == position).nonzero().flatten()[:N_PROMPTS]
    return prompts[rows], position


def _reason(model: nn.Module, prompts: PromptSet, head: tuple[int, int], claim: str, query: int) -> HeadReason:
    from interp.analyses import qk

    target = _induction_target(prompts, query) if "induction" in claim else None
    att = qk.attribute(model, prompts, head, query=query, key=target)
    pairs = att.pairs[att.pairs["against"] >= 0]
    if not len(pairs):
        raise BadInput(f"query {query} sees no second key, so there is no preference to explain")
    aggregate = att.aggregate()
    top = aggregate.loc[aggregate["mean"].abs().sort_values(ascending=False, kind="stable").index[:TOP]]
    by_source = att.by_source()
    strongest = by_source.loc[by_source.groupby("side", sort=False)["mean"].apply(lambda m: m.abs().idxmax())]
    key = "highest-attention key" if target is None else f"induction target (position {target})"
    columns = ["query_source", "key_source", "mean", "ci_low", "ci_high", "n_prompts"]
    return HeadReason(head_label(head), claim, query, key, len(set(pairs["prompt"])), float(pairs["weight"].mean()),
                      float(pairs["difference"].mean()), top[columns].reset_index(drop=True),
                      strongest[["side", "source", "mean", "ci_low", "ci_high"]].reset_index(drop=True))


def _induction_target(prompts: PromptSet, query: int) -> int | None:
    """The key an induction head should attend to from `query` on repeated prompts (the token after the previous
    copy of the query's token); None when the prompts have no period or the query is in the first copy."""
    repeats = Repeats.from_meta(prompts.meta or {})
    if repeats is None or repeats.period is None or repeats.start is None or query < repeats.start:
        return None
    return query - repeats.period + 1


# --------------------------------------------------------------------------- the viewer's cells

VIEWER_TOP = 5  # source pairs per viewer cell
MAX_VIEWER_BYTES = 64 * 1024  # the viewer's source pairs, as JSON, at most: heads past it are left out (and said)


def viewer_pairs(model: nn.Module, prompts: PromptSet, heads: Sequence[tuple[int, int]], *,
                 n_prompts: int = MAX_PROMPTS, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """For the report's viewer (`interp.viewer.ViewerData.qk`): for each head, on each of the viewer's prompts, each
    query's highest-attention key with its contrast, score difference and `VIEWER_TOP` largest (query source, key
    source) terms. Positions are the viewer's (real tokens only, the first `max_tokens`). Heads whose cells would take
    the JSON past `MAX_VIEWER_BYTES` are left out and named in `"omitted"`."""
    from interp.analyses import qk

    chosen = prompts[torch.arange(min(n_prompts, len(prompts)))]
    real = [chosen.real_mask()[i].nonzero().flatten()[:max_tokens].tolist() for i in range(len(chosen))]
    out: dict[str, Any] = {"heads": {}, "omitted": [], "top": VIEWER_TOP}
    size = 0
    for head in heads:
        try:
            entry = _viewer_head(qk, model, chosen, head, real)
        except BadInput as error:
            out["omitted"].append(f"{head_label(head)}: {error}")
            continue
        size += len(json.dumps(entry, separators=(",", ":")))
        if size > MAX_VIEWER_BYTES:
            out["omitted"].append(f"{head_label(head)}: past the viewer's budget of {MAX_VIEWER_BYTES // 1024} KB")
            continue
        out["heads"][head_label(head)] = entry
    return out


def _viewer_head(qk: Any, model: nn.Module, prompts: PromptSet, head: tuple[int, int], real: list[list[int]]
                 ) -> dict[str, Any]:
    """One head's cells: per prompt {"q,k": [against, difference, qi, ki, term, qi, ki, term, ...]} in viewer positions."""
    cells: list[dict[str, list[float]]] = []
    names: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    for i, positions in enumerate(real):
        att = qk.attribute(model, prompts[i], head, query=positions, key=None)
        names = (att.query_sources, att.key_sources)
        index = {position: j for j, position in enumerate(positions)}
        pairs = att.pairs[(att.pairs["against"] >= 0) & att.pairs["key"].isin(index) & att.pairs["against"].isin(index)]
        cell: dict[str, list[float]] = {}
        shown = set(zip(pairs["query"], pairs["key"]))
        if shown:
            for (q, k), rows in att.top(VIEWER_TOP).groupby(["query", "key"], sort=False):
                if (q, k) not in shown:
                    continue
                first = rows.iloc[0]
                terms = [x for r in rows.itertuples() for x in (names[0].index(r.query_source),
                         names[1].index(r.key_source), round(float(r.contribution), 3))]
                cell[f"{index[q]},{index[k]}"] = [index[int(first.against)], round(float(first.total), 3), *terms]
        cells.append(cell)
    return {"query_sources": list(names[0]), "key_sources": list(names[1]), "cells": cells}


__all__ = ["AttendSection", "HeadReason", "MAX_HEADS", "MAX_VIEWER_BYTES", "N_PROMPTS", "TOP", "VIEWER_TOP",
           "discussed_heads", "report_attend", "viewer_pairs"]
