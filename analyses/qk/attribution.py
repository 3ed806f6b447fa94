"""`attribute`: a head's pre-softmax scores split exactly into (query source x key source) terms.

See the package docstring for the maths; `QKAttribution` for the views.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

import interp.analyses.qk.intercepted as intercepted
from interp.analyses.qk.check import QKCheck, check
from interp.analyses.qk.common import FROZEN_NORM, UNIT, VIEWS, View
from interp.analyses.qk.intercepted import is_intercepted_model
from interp.analyses.qk.items import (
    KeyLike,
    QueryLike,
    allowed_keys,
    check_cost,
    check_request,
    choose,
    count_items,
    queries_of,
)
from interp.analyses.qk.sources import capture, check_qk_head, project_sources, sources
from interp.data import PromptSet
from interp.errors import BadInput
from interp.heads import Head, HeadLike
from interp.run import Run, prompt_fingerprint
from interp.stats import MIN_PROMPTS, bootstrap
from interp.validate import check_inputs

BATCH_SIZE = 8


@dataclass(frozen=True, eq=False)
class QKAttribution:
    """One head's scores at chosen (prompt, query, key) pairs, each split into query source x key source terms.

    Terms are kept factored: `query_terms[i, a] . key_terms[i, b]` is pair (a, b)'s share of pair i's score
    (`attn.scale` folded into the query side), `against_terms` the same at the contrast key. Views:
    "difference" (the default; s(q, k) - s(q, k'), which equals log p_k - log p_k') and "score" (s(q, k))."""

    head: Head
    query_sources: tuple[str, ...]
    key_sources: tuple[str, ...]
    pairs: pd.DataFrame = field(repr=False)  # one row per (prompt, query, key); see `attribute`
    query_terms: torch.Tensor = field(repr=False)  # (pair, query_source, d_head) float64
    key_terms: torch.Tensor = field(repr=False)  # (pair, key_source, d_head) float64
    against_terms: torch.Tensor = field(repr=False)  # (pair, key_source, d_head) float64; 0 where no contrast
    constant_keys: tuple[bool, ...]  # per key source: adds the same to every key's score at a query
    n_prompts: int
    fingerprint: str  # `interp.run.prompt_fingerprint` of the prompts attributed
    seed: int = 0

    @property
    def label(self) -> str:
        return self.head.label

    def _select(self, view: str) -> np.ndarray:
        if view not in VIEWS:
            raise BadInput(f"view={view!r}; expected one of {list(VIEWS)}.")
        keep = np.ones(len(self.pairs), dtype=bool) if view == "score" else (self.pairs["against"].to_numpy() >= 0)
        if not keep.any():
            raise BadInput("no attributed query sees a second key, so there is no score difference to decompose "
                           "(e.g. query 0 of a causal model); use view='score', or choose later queries.")
        return keep

    def terms(self, view: View = "difference") -> tuple[torch.Tensor, np.ndarray]:
        """(pair, query_source, key_source) float64 terms of the view, and which rows of `pairs` they are
        (the difference view leaves out pairs without a contrast key)."""
        keep = self._select(view)
        index = torch.as_tensor(keep.nonzero()[0])
        keys = self.key_terms[index] if view == "score" else self.key_terms[index] - self.against_terms[index]
        return torch.einsum("iad,ibd->iab", self.query_terms[index], keys), keep

    def frame(self, view: View = "difference") -> pd.DataFrame:
        """One row per (prompt, query, key, query_source, key_source): `contribution` in score units. Rows of one
        (prompt, query, key) sum (in float64) to `pairs`' score (view "score") or score difference ("difference").
        View "score" marks `constant_across_keys` rows: their term is the same at every key of the query, so the
        softmax ignores them (in the difference view they are exactly 0)."""
        terms, keep = self.terms(view)
        n, n_q, n_k = terms.shape
        pairs = self.pairs[keep]
        at = np.repeat(np.arange(n), n_q * n_k)
        q_index, k_index = np.tile(np.repeat(np.arange(n_q), n_k), n), np.tile(np.arange(n_k), n * n_q)
        columns: dict[str, Any] = {"layer": self.head.layer, "head": self.head.head}
        for name in ("prompt", "query", "key", "against"):
            columns[name] = pairs[name].to_numpy()[at]
        columns["query_source"] = np.asarray(self.query_sources, dtype=object)[q_index]
        columns["key_source"] = np.asarray(self.key_sources, dtype=object)[k_index]
        columns["contribution"] = terms.reshape(-1).numpy()
        if view == "score":
            columns["constant_across_keys"] = np.asarray(self.constant_keys)[k_index]
        frame = pd.DataFrame(columns)
        frame.attrs.update(view=view, unit=UNIT, frozen_norm=FROZEN_NORM, head=self.label)
        return frame

    def top(self, n: int = 5, view: View = "difference") -> pd.DataFrame:
        """Each (prompt, query, key)'s `n` largest terms by size: `rank` (1 = largest), `contribution`, `share` of
        the pair's total (its score or score difference, `total`)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise BadInput(f"top(n={n!r}); expected a whole number of at least 1.")
        terms, keep = self.terms(view)
        flat = terms.reshape(len(terms), -1)  # (pair, query_source * key_source)
        order = flat.abs().argsort(dim=1, descending=True)[:, :n]  # (pair, n)
        n_k = len(self.key_sources)
        pairs = self.pairs[keep].reset_index(drop=True)
        total = flat.sum(1)
        rows = []
        for i in range(len(flat)):
            for rank, j in enumerate(order[i].tolist(), start=1):
                value = float(flat[i, j])
                rows.append({"layer": self.head.layer, "head": self.head.head, **{c: pairs.at[i, c] for c in
                             ("prompt", "query", "key", "against")}, "rank": rank,
                             "query_source": self.query_sources[j // n_k], "key_source": self.key_sources[j % n_k],
                             "contribution": value, "total": float(total[i]),
                             "share": value / float(total[i]) if float(total[i]) else float("nan")})
        frame = pd.DataFrame(rows)
        frame.attrs.update(view=view, unit=UNIT, head=self.label)
        return frame

    def matrix(self, view: View = "difference", *, prompt: int | None = None, query: int | None = None,
               key: int | None = None) -> pd.DataFrame:
        """Query sources x key sources: the mean term over the attributed pairs that match `prompt`, `query`,
        `key` (None: any); `attrs["n_pairs"]` says how many were averaged."""
        terms, keep = self.terms(view)
        pairs = self.pairs[keep].reset_index(drop=True)
        match = np.ones(len(pairs), dtype=bool)
        for name, value in (("prompt", prompt), ("query", query), ("key", key)):
            if value is not None:
                match &= pairs[name].to_numpy() == value
        if not match.any():
            raise BadInput(f"no attributed pair has prompt={prompt}, query={query}, key={key} in the {view} view; "
                           f"the pairs are in .pairs.")
        mean = terms[torch.as_tensor(match)].mean(0)
        frame = pd.DataFrame(mean.numpy(), index=pd.Index(self.query_sources, name="query_source"),
                             columns=pd.Index(self.key_sources, name="key_source"))
        frame.attrs.update(view=view, unit=UNIT, head=self.label, n_pairs=int(match.sum()))
        return frame

    def per_prompt(self, view: View = "difference") -> tuple[torch.Tensor, list[int]]:
        """(prompt, query_source, key_source): each prompt's mean term over its attributed pairs, and which
        prompts (those with a pair in the view)."""
        terms, keep = self.terms(view)
        owners = self.pairs["prompt"].to_numpy()[keep]
        prompts = sorted(set(owners.tolist()))
        return torch.stack([terms[torch.as_tensor(owners == p)].mean(0) for p in prompts]), prompts

    def aggregate(self, view: View = "difference") -> pd.DataFrame:
        """One row per (query_source, key_source): `mean` over prompts of each prompt's mean term, its 95% bootstrap
        CI (`ci_low`, `ci_high`; NaN with fewer than 2 prompts) and `n_prompts`. Per-prompt values: `per_prompt`."""
        values, prompts = self.per_prompt(view)
        flat = values.reshape(len(values), -1)
        if len(values) >= MIN_PROMPTS:
            mean, low, high = bootstrap(flat, seed=self.seed, label=f"qk_attribution:{view}")
        else:
            mean = flat.mean(0)
            low = high = torch.full_like(mean, float("nan"))
        n_q, n_k = len(self.query_sources), len(self.key_sources)
        frame = pd.DataFrame({"layer": self.head.layer, "head": self.head.head,
                              "query_source": np.repeat(np.asarray(self.query_sources, dtype=object), n_k),
                              "key_source": np.tile(np.asarray(self.key_sources, dtype=object), n_q),
                              "mean": mean.numpy(), "ci_low": low.numpy(), "ci_high": high.numpy(),
                              "n_prompts": len(prompts)})
        frame.attrs.update(view=view, unit=UNIT, head=self.label)
        return frame

    def by_source(self, view: View = "difference") -> pd.DataFrame:
        """One row per (side, source): the source's total over every source of the other side (its row or column
        of `matrix`), mean over prompts with a 95% bootstrap CI; what removing that source from only that side of
        the head's input changes, to first order (the norm's scale frozen: exactly)."""
        values, prompts = self.per_prompt(view)
        parts = []
        for side, names, totals in (("query", self.query_sources, values.sum(2)), ("key", self.key_sources, values.sum(1))):
            if len(totals) >= MIN_PROMPTS:
                mean, low, high = bootstrap(totals, seed=self.seed, label=f"qk_attribution:{view}:{side}")
            else:
                mean, low, high = totals.mean(0), *(torch.full((len(names),), float("nan"), dtype=torch.float64),) * 2
            parts.append(pd.DataFrame({"layer": self.head.layer, "head": self.head.head, "side": side,
                                       "source": list(names), "mean": mean.numpy(), "ci_low": low.numpy(),
                                       "ci_high": high.numpy(), "n_prompts": len(prompts)}))
        frame = pd.concat(parts, ignore_index=True)
        frame.attrs.update(view=view, unit=UNIT, head=self.label)
        return frame

    def check(self, run: Run, n: int = 5, view: View = "difference") -> QKCheck:
        """Patch the top `n` source pairs (by the size of their mean term over prompts) out of the head's input,
        each measured with the norm's scale frozen and live (`interp.analyses.qk.check`)."""
        return check(self, run, n=n, view=view)

    def to_dict(self, top: int = 5) -> dict[str, Any]:
        """Plain data for JSON (the docs' schemas page describes it): the head, the sources, and per pair its
        scores and its `top` terms in both views."""
        views: tuple[View, ...] = ("difference", "score")
        tops: dict[str, dict[tuple[int, int, int], list[dict[str, Any]]]] = {view: {} for view in views}
        for view in views:
            if view == "difference" and not (self.pairs["against"] >= 0).any():
                continue  # no pair has a contrast key
            for r in self.top(top, view).itertuples():
                tops[view].setdefault((r.prompt, r.query, r.key), []).append(
                    {"query_source": r.query_source, "key_source": r.key_source,
                     "contribution": float(r.contribution), "share": _plain(r.share)})
        items = []
        for record in self.pairs.to_dict("records"):
            at = (record["prompt"], record["query"], record["key"])
            items.append({**{k: _plain(v) for k, v in record.items()},
                          **{f"top_{view}": tops[view].get(at, []) for view in views}})
        return {"head": self.label, "layer": self.head.layer, "head_index": self.head.head, "unit": UNIT,
                "frozen_norm": FROZEN_NORM, "n_prompts": self.n_prompts, "query_sources": list(self.query_sources),
                "key_sources": list(self.key_sources),
                "constant_key_sources": [s for s, c in zip(self.key_sources, self.constant_keys) if c], "pairs": items}

    def to_json(self, top: int = 5) -> str:
        return json.dumps(self.to_dict(top), allow_nan=False)


def _plain(value: Any) -> Any:
    """A JSON-able scalar: numpy numbers as Python ones, NaN as None."""
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if not np.isfinite(value) else float(value)
    return value


def attribute(model_or_run: nn.Module | Run, prompts: PromptSet | HeadLike | None = None, head: HeadLike | None = None,
              *, query: QueryLike = None, key: KeyLike = None, against: int | None = None,
              batch_size: int | None = None) -> QKAttribution:
    """Split `head`'s pre-softmax score at chosen (prompt, query, key) pairs exactly into (query source x key
    source) terms (see the package docstring), from one forward per batch of prompts.

    `model_or_run`: a pre-norm model (a HookedGPT, a checkpoint, a converted Hugging Face model) with its
    `prompts`, or a Run (its model, prompts and batch size; `attribute(run, "L1H0")`). `head`: "L1H0" or (1, 0).
    `query`: None (every real query), a position or a list; `key`: None (each query's highest-attention key),
    a position, or "all"; `against`: the difference view's contrast key (None: the highest-scoring other key).

    Cost: for one (prompt, query, key) pair, (query sources x key sources) terms, where a head of layer l has
    about l x (heads + 2) + 4 sources per side: a toy's layer-1 head about 10 x 10, SmolLM2-135M's last layer
    about 320 x 320 (1e5 terms a pair; every (q, k) of one 128-token prompt, key="all", is ~8e8, refused).
    An attribution of more than `items.MAX_ROWS` (5e7) terms is refused before any forward, with its size;
    memory holds the factors, about (query sources + 2 x key sources) x d_head float64 numbers per pair.
    The prompts are streamed `batch_size` at a time (default the Run's, else 8): one forward each, stopped
    after the head's layer."""
    model, prompts, head, batch_size, seed = _inputs(model_or_run, prompts, head, batch_size)
    if is_intercepted_model(model):
        return _attribute_intercepted(model, prompts, head, batch_size, seed, (query, key, against))
    parsed = check_qk_head(model, head)
    attn = model.blocks[parsed.layer].attn
    request = check_request(query, key, against, prompts.n_pos)
    allowed = allowed_keys(attn, prompts)
    queries = queries_of(request, prompts, allowed, attn)
    q_sources, k_sources = sources(model, parsed.layer, "q"), sources(model, parsed.layer, "k")
    check_cost(count_items(request, queries, allowed), len(q_sources), len(k_sources))
    records: list[dict[str, Any]] = []
    factors: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for start in range(0, len(prompts), batch_size):
        part, terms = _batch(model, parsed, prompts[start:start + batch_size], start, request, queries, allowed)
        records += part
        factors.append(terms)
    rotary = model.cfg.positional_embedding_type == "rotary"
    constant = tuple(src.kind in ("ln_bias", "bias") and not rotary for src in k_sources)
    q_terms, k_terms, a_terms = (torch.cat([f[i] for f in factors]) for i in range(3))
    return QKAttribution(parsed, tuple(s.name for s in q_sources), tuple(s.name for s in k_sources),
                         pd.DataFrame(records, columns=PAIR_COLUMNS), q_terms, k_terms, a_terms, constant, len(prompts),
                         prompt_fingerprint(prompts), seed)


PAIR_COLUMNS = ["prompt", "query", "key", "against", "query_token", "key_token", "against_token", "score",
                "against_score", "difference", "weight", "against_weight"]


def _inputs(model_or_run: Any, prompts: Any, head: Any, batch_size: int | None
            ) -> tuple[Any, PromptSet, Any, int, int]:
    """(model, prompts, head, batch size, seed) from a Run or a model with its prompts."""
    if isinstance(model_or_run, Run):
        if head is None and prompts is not None and not isinstance(prompts, PromptSet):
            prompts, head = None, prompts  # attribute(run, "L1H0")
        if prompts is not None:
            raise BadInput("attribute: a Run carries its prompts; pass attribute(run, head) or attribute(model, prompts, "
                           "head).")
        model, prompts, seed = model_or_run.model, model_or_run.prompts, model_or_run.seed
        batch_size = batch_size or model_or_run.batch_size
    else:
        check_inputs("attribute", model_or_run, prompts)
        model, seed = model_or_run, 0
    if head is None:
        raise BadInput("attribute: which head? pass head='L1H0' (or a (layer, head) pair).")
    batch_size = BATCH_SIZE if batch_size is None else batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise BadInput(f"attribute: batch_size={batch_size!r}; expected a whole number of at least 1.")
    return model, prompts, head, batch_size, seed


@torch.no_grad()
def _batch(model: Any, head: Head, batch: PromptSet, start: int, request: Any, queries: list[list[int]],
           allowed: torch.Tensor) -> tuple[list[dict[str, Any]], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The pairs of one batch of prompts (records for `pairs`) and their query, key and contrast-key factors."""
    kept = capture(model, batch, head.layer)
    Q = project_sources(model, batch, head, "q", kept).cpu()  # (source, batch, pos, d_head)
    K = project_sources(model, batch, head, "k", kept).cpu()
    scores = kept[f"blocks.{head.layer}.attn.hook_attn_scores"][:, head.head].double().cpu()  # (batch, query, key)
    pattern = kept[f"blocks.{head.layer}.attn.hook_pattern"][:, head.head].double().cpu()
    return _pairs(batch, start, request, queries, allowed, (Q, K, scores, pattern))


def _pairs(batch: PromptSet, start: int, request: Any, queries: list[list[int]], allowed: torch.Tensor,
           read: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
           ) -> tuple[list[dict[str, Any]], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The chosen pairs of one batch: records and factors from its projected sources Q, K (source, batch, pos,
    d_head), scores and pattern (batch, query, key)."""
    Q, K, scores, pattern = read
    records, at = [], []
    for b in range(len(batch)):
        p = start + b
        for q, k, a in choose(request, queries[p], allowed[p], scores[b]):
            records.append(_record(batch, b, p, q, k, a, scores[b], pattern[b]))
            at.append((b, q, k, max(a, 0), a >= 0))
    if not at:  # no pair in this batch
        none = torch.zeros(0, dtype=torch.long)
        return records, (Q[:, none, none].transpose(0, 1), *(K[:, none, none].transpose(0, 1),) * 2)
    rows, queries_at, keys_at, against_at, has = (torch.tensor(column) for column in zip(*at))
    against = K[:, rows, against_at].transpose(0, 1) * has[:, None, None]
    return records, (Q[:, rows, queries_at].transpose(0, 1), K[:, rows, keys_at].transpose(0, 1), against)


def _attribute_intercepted(model: nn.Module, prompts: PromptSet, head: Any, batch_size: int, seed: int,
                           asked: tuple[QueryLike, KeyLike, int | None]) -> QKAttribution:
    """`attribute` on a model hooked by interception (`interp.analyses.qk.intercepted`)."""
    chosen = intercepted.plan(model, head)
    mask = intercepted.SiteMask(bool(chosen.site.causal))
    request = check_request(*asked, prompts.n_pos)
    allowed = allowed_keys(mask, prompts)  # type: ignore[arg-type]  # what items reads of an attention
    queries = queries_of(request, prompts, allowed, mask)  # type: ignore[arg-type]
    q_sources, k_sources = (intercepted.intercepted_sources(model, chosen.head.layer, side) for side in ("q", "k"))
    check_cost(count_items(request, queries, allowed), len(q_sources), len(k_sources))
    records: list[dict[str, Any]] = []
    factors = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        with torch.no_grad():
            kept = intercepted.capture_intercepted(model, chosen, batch)
            Q, K = (intercepted.project(model, chosen, side, kept).cpu() for side in ("q", "k"))
        scores, pattern = (kept[chosen.site.hooks[role]][:, chosen.head.head].double().cpu()
                           for role in ("attn_scores", "pattern"))
        part, terms = _pairs(batch, start, request, queries, allowed, (Q, K, scores, pattern))
        records += part
        factors.append(terms)
    constant = tuple(src.kind in ("ln_bias", "bias") for src in k_sources)
    q_terms, k_terms, a_terms = (torch.cat([f[i] for f in factors]) for i in range(3))
    return QKAttribution(chosen.head, tuple(s.name for s in q_sources), tuple(s.name for s in k_sources),
                         pd.DataFrame(records, columns=PAIR_COLUMNS), q_terms, k_terms, a_terms, constant, len(prompts),
                         prompt_fingerprint(prompts), seed)


def _record(batch: PromptSet, b: int, p: int, q: int, k: int, a: int, scores: torch.Tensor,
            pattern: torch.Tensor) -> dict[str, Any]:
    tokens = batch.tokens[b]
    none = float("nan")
    score, against = float(scores[q, k]), float(scores[q, a]) if a >= 0 else none
    return {"prompt": p, "query": q, "key": k, "against": a, "query_token": int(tokens[q]),
            "key_token": int(tokens[k]), "against_token": int(tokens[a]) if a >= 0 else -1, "score": score,
            "against_score": against, "difference": score - against, "weight": float(pattern[q, k]),
            "against_weight": float(pattern[q, a]) if a >= 0 else none}
