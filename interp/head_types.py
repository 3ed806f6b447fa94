"""Head types: one object per kind of head (previous-token, induction, a sink, "two back", a user's own).

A `HeadType` is defined by its *target*: a function of a `TargetBatch` (tokens, real mask,
allowed keys, first real position, repeat structure) giving the (batch, query, key) bool mask
of the keys a head of that type attends to. Everything else follows from it, generically:

- metric: the attention mass on target keys, averaged over the *scored queries* (real queries
  with at least two allowed keys and at least one target; a type may define its own queries,
  as induction does: the repeated positions);
- argmax rate: the share of scored queries whose maximum weight lands on a target key (ties
  split evenly among the tied keys, so a uniform head is credited to no one target);
- ideal pattern: uniform over the target keys; a query without a target attends to the first real
  key (or to itself). It is the toolkit's one ideal pattern: `interp.substitute_pattern` and
  `interp.PatternSubstitution` substitute it by name ("previous_token", "self", "induction", a
  registered type's name), and the claims' sufficiency and faithfulness tests substitute the claim's;
- claims: statement, observational threshold with its citation, shuffled-token expectation
  ("stay": positional, "drop": content), sufficiency threshold, and which prompts it needs
  ("any", "repeats", "bidirectional").

Targets may add fast paths that give the same numbers without building the mask: `at(pattern,
batch)`, the weight on a single target key per query (offsets read a diagonal), `weight(pattern,
batch)`, the mass on the targets, and `has_target(batch)`. The registry (`HEAD_TYPES`,
`register`, `get_head_type`) holds the built-ins; `interp.analyses.positional.focus`,
`interp.analyses.induction.scores`, the claim presets, `scan` and the report read it, so a registered
type gets its metric columns, its claims and its report card without further code:

    >>> two_back = HeadType("two_back", "{label} attends two tokens back (> {threshold:g})", offset_target(-2))
    >>> register(two_back)  # doctest: +SKIP
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Mapping, Protocol, get_args

import torch
import torch.nn.functional as F

from interp.capture import BatchContext, masked_mean
from interp.data import PromptSet, Repeats, ngram_targets
from interp.errors import BadInput, BadType
from interp.validate import check_unit_interval, check_whole

Needs = Literal["any", "repeats", "bidirectional"]
ShuffleExpect = Literal["stay", "drop"]
Fallback = Literal["first", "self"]
NEEDS: tuple[str, ...] = get_args(Needs)
TIE_TOLERANCE = 1e-6  # weights within this of a row's maximum count as tied maxima

# short citations (titles in interp.analyses.claims.presets' references)
CLARK = "Clark et al. 2019"
VOITA = "Voita et al. 2019"
OLSSON = "Olsson et al. 2022"
SINK = "Clark et al. 2019; Xiao et al. 2023"
DUPLICATE = "Olsson et al. 2022; Wang et al. 2022"
ELHAGE = "Elhage et al. 2021; Olsson et al. 2022"


# --------------------------------------------------------------------------- what a target sees


def _at_offset(x: torch.Tensor, offset: int) -> torch.Tensor:
    """x (..., query, key) -> (..., query): x[q, q + offset], zero/False where that key is out of range
    (all of them for an offset as long as the sequence)."""
    if abs(offset) >= x.shape[-1]:
        return torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    diagonal = torch.diagonal(x, offset=offset, dim1=-2, dim2=-1)  # (..., query - |offset|)
    pad = (abs(offset), 0) if offset < 0 else (0, offset)
    if diagonal.dtype == torch.bool:
        return F.pad(diagonal.to(torch.uint8), pad).bool()
    return F.pad(diagonal, pad)


def _at_first(x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """x (batch, head, query, key), first (batch,) -> (batch, head, query): the weight on each prompt's first key."""
    index = first[:, None, None, None].expand(x.shape[0], x.shape[1], x.shape[2], 1)
    return x.gather(-1, index).squeeze(-1)


@dataclass(frozen=True)
class TargetBatch:
    """One batch as a target function sees it (tensors on one device)."""

    tokens: torch.Tensor  # (batch, pos) token ids
    real: torch.Tensor  # (batch, pos) bool: True at real (non-padding) tokens
    allowed: torch.Tensor  # (batch, query, key) bool: the query is real and may attend to the key
    first_real: torch.Tensor  # (batch,) index of each prompt's first real token
    repeats: Repeats | None = None  # the prompt set's repeat structure

    @classmethod
    def from_context(cls, ctx: BatchContext) -> "TargetBatch":
        """The batch a capture reducer is called with (`interp.capture.BatchContext`)."""
        return cls(ctx.tokens, ctx.real, ctx.allowed[:, 0], ctx.first_real, ctx.repeats)

    @classmethod
    def from_prompts(cls, prompts: PromptSet, *, causal: bool = True) -> "TargetBatch":
        """A prompt set's batch for a model that is `causal` (or bidirectional)."""
        tokens = prompts.tokens
        real = torch.ones_like(tokens, dtype=torch.bool) if prompts.attention_mask is None else prompts.attention_mask.bool()
        allowed = real[:, :, None] & real[:, None, :]  # (batch, query, key)
        if causal:
            allowed = allowed & torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool, device=tokens.device).tril()
        return cls(tokens, real, allowed, real.long().argmax(-1), prompts.repeats)

    @property
    def n_pos(self) -> int:
        return self.tokens.shape[1]

    @functools.cached_property
    def scored(self) -> torch.Tensor:
        """(batch, query) bool: real queries with at least two keys to choose from."""
        return self.allowed.sum(-1) >= 2

    @functools.cached_property
    def occurrences(self) -> torch.Tensor:
        """(batch, query, key) bool: earlier occurrences of the query's token (its n-gram, with `match_len`)."""
        match_len = 1 if self.repeats is None or self.repeats.match_len is None else self.repeats.match_len
        return ngram_targets(self.tokens, self.real, match_len)

    @functools.cached_property
    def repeat_queries(self) -> torch.Tensor:
        """(batch, query) bool: the repeated positions (`interp.data.Repeats.query_mask`; no structure: 1-gram repeats)."""
        return (self.repeats or Repeats()).query_mask(self.tokens, self.real)


class Target(Protocol):
    """TargetBatch -> (batch, query, key) bool: the keys the head type attends to."""

    def __call__(self, batch: TargetBatch) -> torch.Tensor: ...


# --------------------------------------------------------------------------- built-in targets


@dataclass(frozen=True)
class OffsetTarget:
    """The key at relative offset `k` (k - q: -1 = previous token, 0 = itself, +1 = next)."""

    k: int

    def __post_init__(self) -> None:
        check_whole(self.k, "k", "OffsetTarget")  # 0.7 is no offset (int() made it 0)

    def __call__(self, batch: TargetBatch) -> torch.Tensor:
        position = torch.arange(batch.n_pos, device=batch.allowed.device)
        return (position[None, :] - position[:, None] == self.k) & batch.allowed  # (query, key): k - q == offset

    def at(self, pattern: torch.Tensor, batch: TargetBatch) -> torch.Tensor:
        """Fast path: (batch, head, query, key) -> (batch, head, query), the diagonal (no mask built)."""
        return _at_offset(pattern, self.k)

    def has_target(self, batch: TargetBatch) -> torch.Tensor:
        return _at_offset(batch.allowed, self.k)  # (batch, query)


@dataclass(frozen=True)
class FirstTarget:
    """The prompt's first real token (a sink: [CLS] / BOS when the prompt has one)."""

    def __call__(self, batch: TargetBatch) -> torch.Tensor:
        first = F.one_hot(batch.first_real, batch.n_pos).bool()  # (batch, key)
        return first[:, None, :] & batch.allowed

    def at(self, pattern: torch.Tensor, batch: TargetBatch) -> torch.Tensor:
        return _at_first(pattern, batch.first_real)

    def has_target(self, batch: TargetBatch) -> torch.Tensor:
        return _at_first(batch.allowed[:, None], batch.first_real)[:, 0]


@dataclass(frozen=True)
class WindowTarget:
    """Keys within `window` positions of the query (|q - k| <= window)."""

    window: int

    def __post_init__(self) -> None:
        check_whole(self.window, "window", "WindowTarget", minimum=0)

    def __call__(self, batch: TargetBatch) -> torch.Tensor:
        position = torch.arange(batch.n_pos, device=batch.allowed.device)
        return ((position[:, None] - position[None, :]).abs() <= self.window) & batch.allowed

    def weight(self, pattern: torch.Tensor, batch: TargetBatch) -> torch.Tensor:
        """Fast path: (batch, head, query), summed diagonal by diagonal."""
        n = pattern.shape[-1]
        total = torch.zeros(pattern.shape[:-1], dtype=pattern.dtype, device=pattern.device)
        for offset in range(-min(self.window, n - 1), min(self.window, n - 1) + 1):
            total += _at_offset(pattern, offset)
        return total

    def has_target(self, batch: TargetBatch) -> torch.Tensor:
        return batch.allowed.diagonal(dim1=-2, dim2=-1)  # the query itself is always in its window


def duplicate_target(batch: TargetBatch) -> torch.Tensor:
    """Earlier occurrences of the query's token (or n-gram: `Repeats.match_len`)."""
    return batch.occurrences


def induction_target(batch: TargetBatch) -> torch.Tensor:
    """The token after each earlier occurrence of the query's token (prefix matching; key <= query)."""
    target = torch.zeros_like(batch.occurrences)
    target[..., 1:] = batch.occurrences[..., :-1]
    return target & batch.real[:, None, :]


def repeat_queries_of(batch: TargetBatch) -> torch.Tensor:
    """The queries content types are scored on: the repeated positions, whether or not a target exists."""
    return batch.repeat_queries


def offset_target(k: int) -> OffsetTarget:
    """The target "the key at relative offset k" (e.g. -2: two tokens back); k a whole number."""
    return OffsetTarget(k)


# --------------------------------------------------------------------------- the head type


@dataclass(frozen=True)
class HeadType:
    """A kind of head, defined by the keys it attends to (see the module docstring)."""

    name: str  # registry key and claim kind, e.g. "previous_token"
    statement: str  # the claim's statement; formatted with label, threshold and `params`
    target: Target  # TargetBatch -> (batch, query, key) bool
    threshold: float = 0.5  # observational threshold on the metric (more than this much attention)
    citation: str = CLARK  # where the threshold comes from
    needs: Needs = "any"  # prompts / models it is defined on: any, prompts with repeats, bidirectional models
    shuffle: ShuffleExpect = "stay"  # on shuffled tokens the metric stays (positional) or drops (content)
    shuffle_decisive: bool = False  # whether failing the shuffled control refutes the claim
    sufficiency: float | None = 0.5  # fraction of loss its ideal pattern must recover; None: no sufficiency test
    metric: str | None = None  # metric column name (default: `name`)
    ideal: str | None = None  # the ideal pattern's name in evidence text (default: `name`)
    fallback: Fallback = "first"  # ideal pattern of a query without a target: the first real key, or itself
    argmax: bool = True  # whether `interp.analyses.positional.focus` reports `{metric}_argmax`
    queries: Callable[[TargetBatch], torch.Tensor] | None = None  # scored queries; default: scored with a target
    position_metric: str | None = None  # shuffle="drop": attention to where the target was (claims.evidence)
    copying: float | None = None  # OV copying-score threshold (induction), None: not checked
    params: tuple[tuple[str, Any], ...] = ()  # further claim parameters, e.g. (("window", 3),)
    description: str = ""  # what the metric column means, for the report's glossary

    def __post_init__(self) -> None:
        if not self.name or not self.name.isidentifier():
            raise BadInput(f"HeadType name {self.name!r} must be an identifier (it names a claim kind and a column).")
        if self.needs not in NEEDS:
            raise BadInput(f"HeadType {self.name!r}: needs={self.needs!r}; expected one of {list(NEEDS)}.")
        if self.shuffle not in get_args(ShuffleExpect):
            raise BadInput(f"HeadType {self.name!r}: shuffle={self.shuffle!r}; expected one of {list(get_args(ShuffleExpect))}.")
        if self.fallback not in get_args(Fallback):
            raise BadInput(f"HeadType {self.name!r}: fallback={self.fallback!r}; expected one of {list(get_args(Fallback))}.")
        if not callable(self.target):
            raise BadInput(f"HeadType {self.name!r}: target must be a callable TargetBatch -> (batch, query, key) bool.")
        check_unit_interval(self.threshold, "threshold", f"HeadType {self.name!r}")  # a share of attention
        check_unit_interval(self.sufficiency, "sufficiency", f"HeadType {self.name!r}", optional=True)
        self._check_statement()

    def _check_statement(self) -> None:
        """The statement formats with label, threshold and the type's params (else every claim of it would fail)."""
        try:
            self.describe("L0H0")
        except (KeyError, IndexError, ValueError, TypeError, AttributeError) as error:
            fields = ["label", "threshold", *dict(self.params)]
            raise BadInput(f"HeadType {self.name!r}: its statement {self.statement!r} does not format "
                           f"({type(error).__name__}: {error}); it may use the fields {{{'}, {'.join(fields)}}} "
                           "(threshold is a number, e.g. {threshold:g}), or add the field to params.") from None

    @property
    def column(self) -> str:
        """The metric's column name (`prev_token` for previous_token)."""
        return self.metric or self.name

    @property
    def ideal_name(self) -> str:
        return self.ideal or self.name

    def mask(self, batch: TargetBatch) -> torch.Tensor:
        """(batch, query, key) bool: the target keys the queries may attend to."""
        target = self.target(batch)
        if not isinstance(target, torch.Tensor):
            raise BadInput(f"head type {self.name!r}: its target returned {type(target).__name__ if target is not None else 'None'}; "
                           f"expected a (batch, query, key) = {tuple(batch.allowed.shape)} bool mask (a torch.Tensor).")
        if target.shape != batch.allowed.shape or target.dtype != torch.bool:
            raise BadInput(f"head type {self.name!r}: its target gave {tuple(target.shape)} {target.dtype}; expected a "
                           f"(batch, query, key) = {tuple(batch.allowed.shape)} bool mask.")
        return target & batch.allowed

    def scored_queries(self, batch: TargetBatch) -> torch.Tensor:
        """(batch, query) bool: the queries the metric averages over."""
        if self.queries is not None:
            return self.queries(batch)
        has = getattr(self.target, "has_target", None)
        return batch.scored & (has(batch) if has is not None else self.mask(batch).any(-1))

    def weight(self, pattern: torch.Tensor, batch: TargetBatch) -> torch.Tensor:
        """pattern (batch, head, query, key) -> (batch, head, query): the attention mass on target keys."""
        for fast in ("at", "weight"):
            method = getattr(self.target, fast, None)
            if method is not None:
                return method(pattern, batch)
        return (pattern * self.mask(batch)[:, None]).sum(-1)

    def metric_values(self, pattern: torch.Tensor, batch: TargetBatch) -> torch.Tensor:
        """(batch, head): per prompt, the mean attention mass on target keys over scored queries (NaN: none)."""
        return masked_mean(self.weight(pattern.float(), batch), self.scored_queries(batch)[:, None])

    def hits(self, pattern: torch.Tensor, batch: TargetBatch, threshold: torch.Tensor, n_max: torch.Tensor) -> torch.Tensor:
        """(batch, head, query): each query's argmax share on target keys (ties split: 1 / n_max per tied key).
        threshold: (batch, head, query) the row maximum minus `TIE_TOLERANCE`; n_max: tied keys per row."""
        at = getattr(self.target, "at", None)
        if at is not None:  # one target key per query
            return (at(pattern, batch) >= threshold).float() / n_max
        tied = (pattern >= threshold[..., None]) & self.mask(batch)[:, None]
        return tied.sum(-1, dtype=torch.float32) / n_max

    def argmax_rate(self, pattern: torch.Tensor, batch: TargetBatch) -> torch.Tensor:
        """(batch, head): per prompt, the share of scored queries whose maximum weight is on a target key."""
        pattern = pattern.float()
        threshold, n_max = argmax_ties(pattern)
        return masked_mean(self.hits(pattern, batch, threshold, n_max), self.scored_queries(batch)[:, None])

    def ideal_pattern(self, batch: TargetBatch) -> torch.Tensor:
        """(batch, query, key): uniform over each query's target keys; a real query without one puts all its
        weight on the first real key (fallback "first") or on itself ("self"); padded queries get zero rows."""
        target = self.mask(batch)
        if self.fallback == "self":
            fallback = torch.eye(batch.n_pos, dtype=torch.bool, device=target.device).expand_as(target)
        else:
            fallback = F.one_hot(batch.first_real, batch.n_pos).bool()[:, None, :].expand_as(target)
        target = torch.where(target.any(-1, keepdim=True), target, fallback & batch.real[:, :, None])
        pattern = target.float()
        return pattern / pattern.sum(-1, keepdim=True).clamp(min=1.0)

    def available(self, prompts: PromptSet, *, causal: bool | None) -> str | None:
        """None when the type is defined for these prompts and this model; else why not, in words."""
        if self.needs == "bidirectional" and causal is not False:
            return f"{self.name} needs a bidirectional model (no query of a causal model sees a later key)"
        if self.needs == "repeats":
            batch = TargetBatch.from_prompts(prompts, causal=bool(causal))
            if not bool(batch.repeat_queries.any(-1).all()):
                return f"{self.name} needs prompts whose every row repeats a token (e.g. interp.data.repeated_tokens)"
        return None

    def describe(self, label: str, threshold: float | None = None, **params: Any) -> str:
        """The claim statement for head `label`."""
        values = {**dict(self.params), **params}
        return self.statement.format(label=label, threshold=self.threshold if threshold is None else threshold, **values)


def argmax_ties(pattern: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """pattern (batch, head, query, key) -> (threshold, n_max), each (batch, head, query): the row maximum
    minus `TIE_TOLERANCE`, and how many keys reach it (at least 1). `out`: a float scratch buffer of
    the pattern's shape (summing floats is ~10x cheaper than summing bools, which converts a copy first).
    Keys a real query may not see have weight 0 < its row max, so they never tie."""
    threshold = pattern.amax(-1) - TIE_TOLERANCE
    if out is None:
        out = torch.empty_like(pattern, dtype=torch.float32)
    n_max = torch.ge(pattern, threshold[..., None], out=out).sum(-1).clamp(min=1)
    return threshold, n_max


def reduce_head_types(pattern: torch.Tensor, ctx: BatchContext, types: tuple[HeadType, ...], *,
                      argmax: bool = True, scratch: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """pattern (batch, head, query, key) -> {column: (batch, head)} for each type's metric and, with
    `argmax`, `{column}_argmax` for types that report one (the tie count computed once for all)."""
    pattern = pattern.float()
    batch = TargetBatch.from_context(ctx)
    out = {t.column: masked_mean(t.weight(pattern, batch), t.scored_queries(batch)[:, None]) for t in types}
    wanted = [t for t in types if t.argmax] if argmax else []
    if wanted:
        threshold, n_max = argmax_ties(pattern, scratch)
        for t in wanted:
            out[f"{t.column}_argmax"] = masked_mean(t.hits(pattern, batch, threshold, n_max), t.scored_queries(batch)[:, None])
    return out


def head_type_reducer(types: tuple[HeadType, ...], *, argmax: bool = True):
    """A capture reducer (`interp.capture.stream`) computing `reduce_head_types` for `types`."""
    return functools.partial(reduce_head_types, types=tuple(types), argmax=argmax)


# --------------------------------------------------------------------------- typed claim parameters


class PlainParams(Mapping):
    """Typed claim parameters that read as the plain mapping `as_dict()` (what claims files, `Claim.spec()`
    and reports have always seen); subclasses are frozen dataclasses defining `as_dict`."""

    def as_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())


@dataclass(frozen=True)
class HeadTypeParams(PlainParams):
    """A head-type claim's parameters: its `HeadType` and parameter values (e.g. window). Reads as the
    plain mapping: metric, ideal, window..., position_metric. (The field is `param_values`, not
    `values`, which would shadow the mapping's `values()`.)"""

    head_type: HeadType
    param_values: tuple[tuple[str, Any], ...] = ()  # (name, value) of the type's parameters, e.g. (("window", 3),)

    def as_dict(self) -> dict[str, Any]:
        t = self.head_type
        plain: dict[str, Any] = {"metric": t.column, "ideal": t.ideal_name if t.sufficiency is not None else None}
        plain.update(self.param_values)
        if t.position_metric is not None:
            plain["position_metric"] = t.position_metric
        return plain


# --------------------------------------------------------------------------- the registry


def _builtins() -> dict[str, HeadType]:
    share = "of its attention)"
    types = [
        HeadType("previous_token", "{label} attends to the previous token (> {threshold:g} " + share, OffsetTarget(-1),
                 metric="prev_token",
                 description="mean attention weight on the previous token (offset -1), over scored queries; in [0, 1]"),
        HeadType("next_token", "{label} attends to the next token (> {threshold:g} " + share, OffsetTarget(1),
                 needs="bidirectional", fallback="self",
                 description="mean attention weight on the next token (offset +1); in [0, 1]; empty for causal models"),
        HeadType("self_token", "{label} attends to its own position (> {threshold:g} " + share, OffsetTarget(0),
                 ideal="self", description="mean attention weight on the query's own position (offset 0); in [0, 1]"),
        HeadType("first_token", "{label} attends to the first position, a sink (> {threshold:g} " + share, FirstTarget(),
                 citation=SINK,
                 description="mean attention weight on the first real token ([CLS] / BOS when the prompt has one); in [0, 1]"),
        HeadType("local_window", "{label} attends within {window} positions of the query (> {threshold:g} " + share,
                 WindowTarget(3), argmax=False, params=(("window", 3),),
                 description="mean attention weight on keys within 3 positions of the query (|key - query| <= 3); in [0, 1]"),
        HeadType("induction", "{label} is an induction head (prefix matching > {threshold:g}, copying OV)", induction_target,
                 citation=OLSSON, needs="repeats", shuffle="drop", shuffle_decisive=True, argmax=False,
                 queries=repeat_queries_of, position_metric="induction_position", copying=0.0,
                 description="mean weight a repeated token puts on the token after its earlier occurrence (prefix "
                             "matching, Olsson et al. 2022); in [0, 1]; repeated prompts only"),
        HeadType("duplicate_token", "{label} attends to earlier occurrences of the current token (> {threshold:g})",
                 duplicate_target, citation=DUPLICATE, needs="repeats", shuffle="drop", shuffle_decisive=True,
                 argmax=False, queries=repeat_queries_of, position_metric="duplicate_position",
                 description="mean weight a repeated token puts on its earlier occurrences; in [0, 1]; repeated prompts only"),
    ]
    return {t.name: t for t in types}


HEAD_TYPES: dict[str, HeadType] = _builtins()  # name -> HeadType, in registration order
BUILTIN_HEAD_TYPES: tuple[str, ...] = tuple(HEAD_TYPES)
# claim kinds that are not head types (interp.analyses.claims.registry: positional, pair and model claims, dispensable) and
# the words of the claims-file syntax ("not induction", the key `model`)
RESERVED = ("positional", "redundant", "backs_up", "dispensable", "causal", "not", "model")


def register(head_type: HeadType, *, replace: bool = False) -> HeadType:
    """Add a head type to the registry (metrics, claims, scan and the report then include it). The type is
    first tried on small test batches (`try_head_type`), so a broken one never reaches the registry."""
    if not isinstance(head_type, HeadType):
        raise BadType(f"register() takes a HeadType, got {type(head_type).__name__}; build one with "
                      "HeadType(name, statement, target).")
    if head_type.name.lower() in RESERVED:
        raise BadInput(f"{head_type.name!r} is a claim kind or a word of the claims-file syntax (reserved: "
                       f"{list(RESERVED)}), so a claim of that head type could not be written; pick another name.")
    if head_type.name != head_type.name.lower():
        raise BadInput(f"head type name {head_type.name!r} has capitals; claims files lowercase claim kinds, so name it "
                       f"{head_type.name.lower()!r}.")
    if not replace and head_type.name in HEAD_TYPES:
        raise BadInput(f"a head type (or claim kind) named {head_type.name!r} exists already; pick another name or pass "
                       "replace=True.")
    if head_type.name in BUILTIN_HEAD_TYPES and replace:
        raise BadInput(f"{head_type.name!r} is a built-in head type and cannot be replaced; register a new name.")
    clash = [t.name for t in HEAD_TYPES.values() if t.column == head_type.column and t.name != head_type.name]
    if clash:
        raise BadInput(f"head type {head_type.name!r} would write column {head_type.column!r}, which {clash[0]!r} writes.")
    try_head_type(head_type)
    HEAD_TYPES[head_type.name] = head_type
    return head_type


def _trial_batches(head_type: HeadType) -> list[tuple[str, TargetBatch]]:
    """Small batches a head type must handle: repeated tokens seen by a causal model (unless the type needs a
    bidirectional one) and by a bidirectional one, and a left-padded set seen causally."""
    from interp.data import pad, repeated_tokens

    repeated = repeated_tokens(2, 3, 8, seed=0)  # (2, 6)
    padded = pad([[1, 2, 1, 2, 3], [4, 5, 4]], padding_side="left")  # (2, 5)
    causal = [] if head_type.needs == "bidirectional" else [("causal", repeated), ("causal, left-padded", padded)]
    return [(f"{kind} {tuple(p.tokens.shape)}", TargetBatch.from_prompts(p, causal=kind.startswith("causal")))
            for kind, p in [*causal, ("bidirectional", repeated)]]


def try_head_type(head_type: HeadType) -> None:
    """Run every part of a head type (target, queries, metric, argmax rate, ideal pattern) on `_trial_batches`;
    a BadInput naming the part, the error and the batch when one fails or gives the wrong shape."""
    for what, batch in _trial_batches(head_type):
        pattern = batch.allowed.float()[:, None]  # (batch, 1, query, key): uniform over the allowed keys
        pattern = pattern / pattern.sum(-1, keepdim=True).clamp(min=1.0)
        parts: list[tuple[str, Callable[[], torch.Tensor], tuple[int, ...]]] = [
            ("target", functools.partial(head_type.mask, batch), tuple(batch.allowed.shape)),
            ("queries", functools.partial(head_type.scored_queries, batch), tuple(batch.real.shape)),
            ("metric", functools.partial(head_type.metric_values, pattern, batch), (batch.tokens.shape[0], 1)),
            ("ideal pattern", functools.partial(head_type.ideal_pattern, batch), tuple(batch.allowed.shape)),
        ]
        if head_type.argmax:
            parts.append(("argmax rate", functools.partial(head_type.argmax_rate, pattern, batch),
                          (batch.tokens.shape[0], 1)))
        for part, run, shape in parts:
            _try_part(head_type, part, run, shape, what)


def _try_part(head_type: HeadType, part: str, run: Callable[[], torch.Tensor], shape: tuple[int, ...], what: str) -> None:
    where = f"tried on a {what} test batch at registration; fix it before registering"
    try:
        got = run()
    except BadInput as error:
        raise BadInput(f"{error} ({where})") from None
    except Exception as error:  # the user's own code: any failure is theirs to fix, named here
        raise BadInput(f"head type {head_type.name!r}: its {part} raised {type(error).__name__}: {error} ({where}).") from None
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape:
        found = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise BadInput(f"head type {head_type.name!r}: its {part} gave {found}; expected shape {shape} ({where}).")


def unregister(name: str) -> None:
    """Remove a registered head type (built-ins stay)."""
    if name in BUILTIN_HEAD_TYPES:
        raise BadInput(f"{name!r} is a built-in head type and cannot be removed.")
    if name not in HEAD_TYPES:
        raise BadInput(f"no head type named {name!r}; registered: {list(HEAD_TYPES)}.")
    del HEAD_TYPES[name]


def get_head_type(name: str) -> HeadType:
    """The registered head type called `name` (or whose metric column is `name`)."""
    if name in HEAD_TYPES:
        return HEAD_TYPES[name]
    for t in HEAD_TYPES.values():
        if t.column == name:
            return t
    raise BadInput(f"unknown head type {name!r}; registered: {list(HEAD_TYPES)} (add one with "
                   "interp.head_types.register).")


def ideal_head_type(name: str) -> HeadType:
    """The registered head type whose ideal pattern is called `name`: its name or its ideal name ("self" is
    self_token's), as `interp.substitute_pattern` and `interp.PatternSubstitution` take them."""
    for t in HEAD_TYPES.values():
        if name in (t.name, t.ideal_name):
            return t
    raise BadInput(f"no head type's ideal pattern is called {name!r}; the names are {ideal_pattern_names()} "
                   "(add one with interp.head_types.register).")


def ideal_pattern_names() -> list[str]:
    """The names `ideal_head_type` takes: each registered type's name, and its ideal name where that differs."""
    return [name for t in HEAD_TYPES.values() for name in dict.fromkeys((t.name, t.ideal_name))]


def head_types(*, needs: tuple[str, ...] | None = None) -> tuple[HeadType, ...]:
    """The registered head types (those whose `needs` is in `needs`), in registration order."""
    return tuple(t for t in HEAD_TYPES.values() if needs is None or t.needs in needs)


def offset_type(k: int | str, *, threshold: float = 0.9) -> HeadType:
    """The positional family: a head whose maximum sits at relative offset `k` (or "first", the first
    position) for at least `threshold` of queries, whatever the tokens (Voita et al. 2019). Its argmax
    rate is what `interp.analyses.claims.positional_head` judges (`argmax_at:K`)."""
    target: Target
    if k == "first":
        target, name = FirstTarget(), "offset_first"
    else:
        k = check_whole(int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k, "k", "offset_type")
        target, name = OffsetTarget(k), f"offset_{'m' if k < 0 else 'p'}{abs(k)}"
    where = "the first position" if k == "first" else f"relative offset {k}"
    return HeadType(name, "{label}'s maximum weight sits at " + where + " for >= {threshold:.0%} of queries",
                    target, threshold=threshold, citation=VOITA, shuffle="stay", shuffle_decisive=True,
                    sufficiency=None, description=f"mean attention weight at {where}")

