"""Which (prompt, query, key) pairs an attribution covers, checked before any forward runs.

`query`: None (every real query), a position or a list of positions; `key`: None (each query's
highest-attention key), a position, or "all" (every key the query may attend to); `against`: the
contrast key of the difference view, None (the highest-scoring key other than `key`) or a position.
Positions index the prompts' tensors (padding included, as the model sees them); negative ones count
back from the end. Every refusal names the prompt and position and says what to pass instead.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Literal, Sequence, Union

import torch

from interp.data import PromptSet
from interp.errors import BadInput
from interp.models.components import Attention

KeyLike = Union[int, Literal["all"], None]
QueryLike = Union[int, Sequence[int], None]
MAX_ROWS = 50_000_000  # rows of one attribution (pairs x source pairs) beyond which it is refused, cost stated


@dataclass(frozen=True)
class Request:
    """`attribute`'s query=, key=, against=, normalised to non-negative positions."""

    queries: tuple[int, ...] | None
    key: int | str | None  # a position, "all", or None
    against: int | None


def _position(value: object, n_pos: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise BadInput(f"{what}={value!r}; expected a position (an int), e.g. {what}=-1 for the last one.")
    if not -n_pos <= int(value) < n_pos:
        raise BadInput(f"{what}={value} is outside the prompts' {n_pos} positions (0..{n_pos - 1}; negative positions "
                       "count back from the end).")
    return int(value) % n_pos


def _scalar(value: Any) -> Any:
    """A one-element integer tensor as a Python int (positions may come from torch); anything else as it is."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        return int(value)
    return value


def check_request(query: QueryLike, key: KeyLike, against: int | None, n_pos: int) -> Request:
    """The request with every position in range (negative ones counted from the end)."""
    queries = None
    if isinstance(query, torch.Tensor):
        query = query.tolist()
    if query is not None:
        listed = [query] if isinstance(query, numbers.Integral) else list(query) if isinstance(
            query, (list, tuple, range)) else None
        if not listed:
            raise BadInput(f"query={query!r}; expected a position, a non-empty list of positions, or None (every query).")
        queries = tuple(sorted({_position(q, n_pos, "query") for q in listed}))
    key, against = _scalar(key), _scalar(against)
    if isinstance(key, str):
        if key != "all":
            raise BadInput(f"key={key!r}; expected a position, 'all' (every key) or None (each query's top key).")
        checked_key: int | str | None = key
    else:
        checked_key = None if key is None else _position(key, n_pos, "key")
    checked_against = None if against is None else _position(against, n_pos, "against")
    if checked_against is not None and checked_against == checked_key:
        raise BadInput(f"against={against} is the key itself; the contrast key must be another key the query sees "
                       "(or against=None: the highest-scoring other key).")
    return Request(queries, checked_key, checked_against)


def allowed_keys(attn: Attention, prompts: PromptSet) -> torch.Tensor:
    """(prompt, query, key) bool: the query is a real token and may attend to the key (causal mask,
    sliding window, padding)."""
    n, n_pos = prompts.tokens.shape
    mask = attn.mask(n_pos, prompts.attention_mask)  # broadcasts to (batch, head, query, key)
    allowed = torch.ones(n, 1, n_pos, n_pos, dtype=torch.bool) if mask is None else mask.cpu().expand(n, 1, n_pos, n_pos)
    return allowed[:, 0] & prompts.real_mask()[:, :, None]


def _where(prompts: PromptSet, p: int) -> str:
    return f"prompt {prompts.row_numbers([p])[0]}"


def check_key(prompts: PromptSet, allowed: torch.Tensor, p: int, q: int, k: int, what: str, attn: Attention) -> None:
    """Refuse a key the query cannot attend to, saying why: padding, after the query, outside the window."""
    real = prompts.real_mask()[p]
    if not real[k]:
        where = real.nonzero().flatten()
        raise BadInput(f"{what}={k} is padding in {_where(prompts, p)} (attention_mask 0): a padded key gets no attention. "
                       f"Choose a real position ({int(where[0])}..{int(where[-1])} there).")
    if not allowed[p, q, k]:
        if attn.causal and k > q:
            raise BadInput(f"{what}={k} comes after query {q}: a causal model's query sees only keys at or before it. "
                           f"Choose {what} <= {q}, or key=None (each query's highest-attention key).")
        raise BadInput(f"query {q} cannot attend to {what}={k} in {_where(prompts, p)} (outside its sliding window of "
                       f"{attn.cfg.window_size} keys); choose a key it sees.")


def queries_of(request: Request, prompts: PromptSet, allowed: torch.Tensor, attn: Attention) -> list[list[int]]:
    """Each prompt's queries, checked (real tokens; each may attend to an explicit key and contrast)."""
    out = []
    real = prompts.real_mask()
    for p in range(len(prompts)):
        if request.queries is None:
            chosen = [q for q in range(prompts.n_pos) if real[p, q]]
            if isinstance(request.key, int):  # an explicit key: the queries that can see it
                chosen = [q for q in chosen if allowed[p, q, request.key]]
                if not chosen:
                    check_key(prompts, allowed, p, prompts.n_pos - 1, request.key, "key", attn)  # padding says so
                    raise BadInput(f"no query of {_where(prompts, p)} can attend to key={request.key}; choose another "
                                   "key, or key=None (each query's highest-attention key).")
        else:
            chosen = list(request.queries)
            for q in chosen:
                if not real[p, q]:
                    raise BadInput(f"query={q} is padding in {_where(prompts, p)} (attention_mask 0); a padded query "
                                   "attends to nothing. Choose a real position.")
                if isinstance(request.key, int):
                    check_key(prompts, allowed, p, q, request.key, "key", attn)
        if request.against is not None:
            for q in chosen:
                check_key(prompts, allowed, p, q, request.against, "against", attn)
        out.append(chosen)
    return out


def count_items(request: Request, queries: list[list[int]], allowed: torch.Tensor) -> int:
    """How many (prompt, query, key) pairs the request names (before the forward picks the top keys)."""
    if request.key != "all":
        return sum(len(q) for q in queries)
    return sum(int(allowed[p, q].sum()) - (request.against is not None) for p, qs in enumerate(queries) for q in qs)


def check_cost(n_items: int, n_query_sources: int, n_key_sources: int) -> None:
    """Refuse an attribution of more than `MAX_ROWS` rows, stating what it would cost."""
    rows = n_items * n_query_sources * n_key_sources
    if rows > MAX_ROWS:
        raise BadInput(f"this attribution would have {rows:.2g} rows ({n_items} (prompt, query, key) pairs x "
                       f"{n_query_sources} query sources x {n_key_sources} key sources; about {rows * 8 / 2**30:.1f} GiB "
                       f"of float64 terms before any table), above the limit of {MAX_ROWS:.0e}. Narrow it: query= a few "
                       "positions, key=None (each query's top key) or one position, or fewer prompts.")


def choose(request: Request, queries: list[int], allowed: torch.Tensor, scores: torch.Tensor
           ) -> list[tuple[int, int, int]]:
    """(query, key, against) for one prompt from its (query, key) scores; against -1 where the query sees
    no other key. `allowed` (query, key) bool."""
    out = []
    for q in queries:
        seen = allowed[q]
        keys = seen.nonzero().flatten().tolist() if request.key == "all" else [
            int(scores[q].masked_fill(~seen, float("-inf")).argmax()) if request.key is None else int(request.key)]
        for k in keys:
            if request.against is not None:
                if k == request.against:
                    if request.key == "all":
                        continue
                    raise BadInput(f"against={k} is query {q}'s highest-attention key itself; choose another contrast "
                                   "key, or against=None (the highest-scoring other key).")
                out.append((q, k, request.against))
                continue
            others = seen.clone()
            others[k] = False
            against = int(scores[q].masked_fill(~others, float("-inf")).argmax()) if others.any() else -1
            out.append((q, k, against))
    return out
