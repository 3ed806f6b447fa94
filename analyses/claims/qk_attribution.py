"""Composition claims' evidence kind `qk_attribution`: how much of the receiver's preference for the key it attends
to the sender's write carries, read off the exact QK attribution (`interp.analyses.qk`). **Supporting only**:
reported beside the verdict, never part of it (`interp.claims.SUPPORTING_KINDS`).

For an edge S -> R via k, R is attributed in the difference view at each *scored query* (the repeated copies'
positions, `Repeats.query_mask`, where the prompts have a repeat structure, as the default next-token loss
scores them; else every real query), at the query's highest-attention key against the highest-scoring other
key, so a pair's terms sum to s(q, k) - s(q, k') = log p_k - log p_k'. The amount of a (prompt, query) is the
sum of the (query source = any, key source = S) terms: what S's write adds to the preference through R's key
alone, exactly, with the norm's scale frozen at its clean value. Via q, the mirror: the (query source = S, key
source = any) terms. Per prompt the amounts are averaged over its scored queries; `effect` is their mean over
prompts (score units) with a studentized-bootstrap CI, and `extra` adds `share` (mean amount / mean score
difference: above 1 when other sources pull the other way), the sender's rank among the same side's sources
and the strongest of them.

passed: True when the CI lies above 0 (S's write pushes R toward the key it attends to), False when it lies
below 0 (away from it), else None. Supporting only, because the attribution reads the score with the norm
frozen, not the behaviour a composition claim is about (path patching, the observational evidence, decides):
a sender can carry R's preference on a path the behaviour never uses. Via v an edge changes what R moves, not
where it attends: no qk_attribution. Cost: one forward per batch of prompts, stopped after R's layer, shared by
every edge into R; at most `interp.analyses.qk.MAX_ROWS` terms (on a large model the last scored queries that fit,
said in the detail).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from interp.analyses.qk import MAX_ROWS, QKAttribution, attribute, sources
from interp.analyses.qk.sources import check_qk_head
from interp.claims import Claim, Context, Evidence, Inconclusive, difference_evidence
from interp.data import PromptSet
from interp.errors import BadInput
from interp.models.gpt import HookedGPT
from interp.paths import Edge, Node

QK_VIAS = ("q", "k")  # the inputs whose reads decide where a head attends
RULE = "supporting only (never in the verdict): CI > 0, the sender's write raises the receiver's preference"


def scored_queries(prompts: PromptSet) -> torch.Tensor:
    """(prompt, pos) bool: the queries the evidence reads, the repeated copies' positions where the prompts have a
    repeat structure, else every real position."""
    real = prompts.real_mask()
    if prompts.repeats is None:
        return real
    return prompts.repeats.query_mask(prompts.tokens, real) & real


def _queries(ctx: Context, receiver: Node, mask: torch.Tensor) -> tuple[list[int] | None, int]:
    """`attribute`'s query=: None (every real query; the scored ones are picked afterwards) when they fit `MAX_ROWS`,
    else the last scored positions that are real in every prompt and fit; and how many scored positions were left
    out."""
    check_qk_head(ctx.model, (receiver.layer, receiver.head))  # a model the attribution covers, else BadInput
    model = cast(HookedGPT, ctx.model)
    per_query = len(sources(model, receiver.layer, "q")) * len(sources(model, receiver.layer, "k"))
    real = ctx.prompts.real_mask()
    if int(real.sum()) * per_query <= MAX_ROWS:
        return None, 0
    scored = mask.any(0)
    usable = (scored & real.all(0)).nonzero().flatten().tolist()  # a query padded in some prompt would be refused
    fits = max(1, MAX_ROWS // (len(ctx.prompts) * per_query))
    chosen = usable[-fits:]
    return chosen, int(scored.sum()) - len(chosen)


def receiver_attribution(ctx: Context, receiver: Node) -> tuple[QKAttribution, torch.Tensor, int]:
    """The receiver's attribution at the scored queries (each query's top key, its top other key as contrast),
    the scored-query mask and how many positions the row limit left out; memoised in `ctx` per receiver."""
    def compute() -> tuple[QKAttribution, torch.Tensor, int]:
        mask = scored_queries(ctx.prompts)
        if not mask.any():
            raise Inconclusive("no prompt has a scored query (the repeated copies are empty)")
        try:
            queries, left_out = _queries(ctx, receiver, mask)
            att = attribute(ctx.model, ctx.prompts, (receiver.layer, receiver.head), query=queries,
                            batch_size=ctx.batch_size)
        except BadInput as error:
            raise Inconclusive(f"no QK attribution of {receiver}: {error}") from None
        return att, mask, left_out

    return ctx.cached(("qk-attribution", ctx.model, ctx.prompts, receiver.layer, receiver.head), compute)


def edge_amounts(att: QKAttribution, sender: str, via: str, mask: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per prompt (those with a scored query that sees a second key): the mean over its scored queries of the
    sender's terms on the `via` side (summed over the other side's sources) and of the whole score difference,
    each (prompt,) float64; and how many (prompt, query) pairs were averaged."""
    names = att.key_sources if via == "k" else att.query_sources
    if sender not in names:
        raise Inconclusive(f"{sender} is no source of {att.label}'s {via} input (sources: {', '.join(names)})")
    amounts, totals, n_pairs = side_amounts(att, via, mask)
    return amounts[names.index(sender)], totals, n_pairs


def side_amounts(att: QKAttribution, via: str, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """`edge_amounts` of every source of the `via` side at once, (source, prompt), from one evaluation of the terms."""
    terms, keep = att.terms("difference")  # (pair, query_source, key_source)
    pairs = att.pairs[keep]
    at = tuple(torch.as_tensor(pairs[c].to_numpy().copy()) for c in ("prompt", "query"))
    scored = mask[at]
    amount = terms.sum(1) if via == "k" else terms.sum(2)  # (pair, source)
    total = terms.sum((1, 2))  # (pair,)
    owners = at[0][scored].numpy()
    prompts = np.unique(owners)
    if not len(prompts):
        raise Inconclusive(f"no scored query of these prompts sees a second key, so {att.label} has no preference "
                           "to explain")
    amount, total = amount[scored], total[scored]
    per_amount = torch.stack([amount[torch.as_tensor(owners == p)].mean(0) for p in prompts], dim=1)  # (source, prompt)
    per_total = torch.stack([total[torch.as_tensor(owners == p)].mean() for p in prompts])
    return per_amount, per_total, int(scored.sum())


def _rank(att: QKAttribution, sender: str, via: str, mask: torch.Tensor) -> tuple[int, str]:
    """The sender's rank (1 = largest mean amount by size) among the sources of its side, and the strongest one."""
    names = att.key_sources if via == "k" else att.query_sources
    means = side_amounts(att, via, mask)[0].mean(1)  # (source,)
    order = sorted(names, key=lambda n: -abs(float(means[names.index(n)])))
    return order.index(sender) + 1, order[0]


@dataclass(frozen=True)
class EdgeAttribution:
    """qk_attribution (supporting only): the sender's exact share of the receiver's score difference at the key it
    attends to, through the edge's input (see the module)."""

    edge: Edge

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        sender, receiver, via = self.edge.sender, self.edge.receiver, self.edge.via
        if via not in QK_VIAS:
            raise Inconclusive(f"{self.edge.label}: a value read changes what {receiver} moves, not where it attends")
        if receiver.kind != "head":
            raise Inconclusive(f"{self.edge.label}: {receiver} is a key/value head, read by several query heads, each with "
                               "its own score difference; attribute one query head's scores (interp.analyses.qk)")
        att, mask, left_out = receiver_attribution(ctx, receiver)
        amounts, totals, n_pairs = edge_amounts(att, sender.label, via, mask)
        rank, strongest = _rank(att, sender.label, via, mask)
        share = float(amounts.mean() / totals.mean()) if float(totals.mean()) else float("nan")
        side = "key" if via == "k" else "query"
        what = (f"{sender}'s terms through {receiver}'s {side} in its score difference at the key it attends to "
                f"(frozen norm, {n_pairs} scored queries)")
        extra: dict[str, float | str] = {
            "share": share, "difference": float(totals.mean()), "rank": float(rank), "strongest_source": strongest,
            "n_queries": float(n_pairs), "queries_left_out": float(left_out), "view": "difference", "unit": "score"}
        ev = difference_evidence("qk_attribution", amounts, torch.zeros_like(amounts), ctx, what=what, unit="score",
                                 fail_below=0.0, extra=extra)
        passed = True if ev.ci_low > 0 else False if ev.ci_high < 0 else None
        word = {True: "raises", False: "lowers", None: "neither clearly raises nor lowers"}[passed]
        detail = (f"{ev.detail}: {word} the preference; share {share:.3g} of the difference {float(totals.mean()):.4g}, "
                  f"rank {rank} of the {side}-side sources (strongest: {strongest})"
                  + (f"; {left_out} earlier scored positions left out to fit the row limit" if left_out else "")
                  + "; supporting only, never in the verdict")
        return Evidence("qk_attribution", effect=ev.effect, ci_low=ev.ci_low, ci_high=ev.ci_high, p_value=ev.p_value,
                        rule=RULE, passed=passed, decisive=False, n_prompts=ev.n_prompts, detail=detail,
                        extra=ev.extra, n_resamples=ev.n_resamples, metric="sender's terms (score units)", values=ev.values)


__all__ = ["EdgeAttribution", "QK_VIAS", "edge_amounts", "receiver_attribution", "scored_queries"]
