"""Built-in head claims, the evidence that tests them, and `scan`, which proposes and tests claims for every head.

A claim here is an `interp.claims.Claim` whose evidence functions read the metrics of
`interp.analyses.positional` and `interp.analyses.induction` and intervene with `interp.interventions`.
Each head type of `interp.analyses.head_types` is a preset (`head_type_claim`; a type registered there
becomes one too); the built-ins, each citing where its threshold comes from:

  previous_token   more than half of the attention on query - 1          (Clark et al. 2019)
  next_token       more than half on query + 1 (bidirectional models)    (Clark et al. 2019)
  self_token       more than half on the query's own position            (Clark et al. 2019)
  first_token      more than half on the first position (a sink head)    (Clark et al. 2019; Xiao et al. 2023)
  local_window     more than half within `window` positions of the query (Clark et al. 2019's rule)
  induction        more than half on the token after an earlier occurrence of the current token,
                   on repeated random tokens, with a copying OV circuit   (Olsson et al. 2022)
  duplicate_token  more than half on earlier occurrences of the current token (Olsson et al. 2022;
                   Wang et al. 2022)
  positional       the maximum weight sits at one relative offset (or on the first position) for
                   at least 90% of queries, and still does on shuffled tokens (Voita et al. 2019)

Evidence (the kinds of `interp.claims`), as implemented here:
- observational: the metric per prompt, mean and bootstrap CI against the threshold;
- control_shuffled: shuffled-token prompts (`interp.data.shuffled`). Positional claims: the
  metric, recomputed there, must still clear the threshold (position does not care which tokens
  sit where). Content claims (induction, duplicate-token), on prompts with a known repeat
  structure: the head's attention to where the repeat target *was* (a fixed relative offset) must
  drop below the threshold, since the tokens have moved. A head that copies from a fixed offset
  looks like an induction head on repeats of one length, keeps that attention, and is refuted;
  conversely a `positional` claim at the repeat distance can hold on the repeated prompts and is
  refuted on shuffled ones when the head really does induction;
- control_random_init: the metric on a randomly initialised model of the same shape
  (`type(model)(dataclasses.replace(model.cfg, seed=...))`) must be below the threshold and
  below the trained model's (paired per prompt); a random model that clears the threshold shows
  the metric is an artefact of architecture or prompt length, and refutes the claim;
- necessity: mean-ablating the head raises the behaviour loss more than mean-ablating a
  comparable head (the mean over the other heads of its layer), paired per prompt. The
  behaviour (`interp.behaviour`, `resolve_behaviour`) is the one passed to `test_claims` /
  `scan`, else the model's own: for a causal LM the next-token loss on the repeated copies for
  prompts with a repeat period (`prompts.repeats`), otherwise on every position; for an encoder the
  change of the mean-pooled sentence embedding (cosine distance from the clean run). Every
  causal evidence names it (`extra["behaviour"]`, the verdict table's `behaviour` column);
- sufficiency: substituting the idealised pattern recovers the behaviour: fraction of loss
  (the behaviour's value) recovered (L_ablated - L_substituted) / (L_ablated - L_clean), against a threshold of 0.5
  ("most"); Olsson et al. 2022 report about 99% for the previous-token heads of 2-layer
  attention-only models;
- faithfulness: replacing the head's pattern by a uniform one and by its own weights permuted
  among the allowed keys both raise the loss (per prompt, the smaller of the two increases);
  a pattern that can be swapped freely explains nothing;
- stability (`interp.claims.Stability`, on demand): the observational outcome and the head
  ranking survive random halves of the prompts, another batch composition, and bfloat16.

References: Clark et al. 2019, "What does BERT look at? An analysis of BERT's attention";
Voita et al. 2019, "Analyzing multi-head self-attention: specialized heads do the heavy lifting";
Elhage et al. 2021, "A mathematical framework for transformer circuits"; Olsson et al. 2022,
"In-context learning and induction heads"; Wang et al. 2022, "Interpretability in the wild";
Xiao et al. 2023, "Efficient streaming language models with attention sinks".

Limits: the copying score (`interp.analyses.induction.copying_scores`) is read from the weights, with
no interval; necessity compares with the *mean* of the other heads of the layer, so two
redundant heads can each pass while either alone is dispensable (see interp.analyses.redundancy);
a positional claim without an offset takes the modal offset of the prompts it is tested on.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Mapping, Protocol, Sequence, cast, get_args

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from interp.analyses.head_types import (  # CLARK, OLSSON, SINK, DUPLICATE: re-exported (their home was here)
    CLARK,  # noqa: F401
    DUPLICATE,  # noqa: F401
    ELHAGE,
    HEAD_TYPES,
    OLSSON,  # noqa: F401
    SINK,  # noqa: F401
    TIE_TOLERANCE,
    VOITA,
    HeadType,
    HeadTypeParams,
    PlainParams,
    ShuffleExpect,
    TargetBatch,
    WindowTarget,
    get_head_type,
    head_types,
    offset_type,
    reduce_head_types,
)
from interp.analyses.induction import NoRepeats, copying_scores, repeat_queries, repeat_types, scores_per_prompt
from interp.analyses.positional import focus_per_prompt, positional_metrics
from interp import distributed, launch
from interp.behaviour import Behaviour, BehaviourLike, UndefinedOnPrompts, as_behaviour, masked_next_token_loss, measure
from interp.capture import BatchContext, MomentAccumulator, PerPromptAccumulator, stream
from interp.claims import (
    Claim,
    Context,
    Evidence,
    EvidenceFn,
    Inconclusive,
    Stability,
    Threshold,
    difference_evidence,
    ratio_evidence,
    test_claims,
    threshold_evidence,
)
from interp.data import PromptSet, shuffled
from interp.errors import BadInput
from interp.hooks import attention_sites
from interp.interventions import ablate, reference_activations, substitute_pattern
from interp.launch import Device, DType
from interp.validate import check_inputs

ClaimKind = Literal[
    "previous_token", "next_token", "self_token", "first_token", "local_window", "induction", "duplicate_token",
    "positional",
]
CLAIM_KINDS: tuple[str, ...] = get_args(ClaimKind)  # the built-in kinds; `PRESETS` also has registered head types
# short citations (the titles are in the module docstring's references): CLARK, VOITA, ... from interp.analyses.head_types
SUFFICIENCY = "most of the loss difference; Olsson et al. 2022 report ~99%"
INDUCTION_METRICS = ("induction", "duplicate_token")
REPEAT_POSITION_METRICS = ("induction_position", "duplicate_position")


# --------------------------------------------------------------------------- metrics


def _keep(ctx: Context, obj: Any) -> Any:
    """Hold `obj` for the life of the context, so `id(obj)` keys in the memo stay unique."""
    ctx.memo.setdefault(("keep",), []).append(obj)
    return obj


def _shuffled(ctx: Context, prompts: PromptSet, *, keep_repeats: bool = False) -> PromptSet:
    """The shuffled-token control of `prompts` (seeded by the context). By default the repeat period
    is dropped (`interp.data.shuffled`), since after shuffling the repeats are wherever the tokens
    went; `keep_repeats=True` keeps the original `repeats`, to measure attention to where they *were*."""
    def make():
        control = shuffled(prompts, seed=ctx.seed)
        if keep_repeats:
            control = dataclasses.replace(control, repeats=prompts.repeats)
        return _keep(ctx, control)
    return ctx.cached(("shuffled", id(prompts), keep_repeats), make)


def random_init_model(model: nn.Module, seed: int) -> nn.Module:
    """A freshly initialised model of the same class and shape (our models: a new seed in the config)."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise Inconclusive(
            f"cannot build a randomly initialised {type(model).__name__}: it has no dataclass config to "
            "re-seed; the random-init control applies to HookedGPT / HookedEncoder models."
        )
    try:
        fresh = type(model)(dataclasses.replace(cfg, seed=seed))
    except (TypeError, ValueError) as error:
        raise Inconclusive(f"cannot build a randomly initialised {type(model).__name__}: {error}") from None
    parameter = next(model.parameters())
    return fresh.to(device=parameter.device, dtype=parameter.dtype).eval()


def _random_model(ctx: Context) -> nn.Module:
    return ctx.cached(("random_init", id(ctx.model)), lambda: _keep(ctx, random_init_model(ctx.model, ctx.seed + 7919)))


def reduce_argmax_offsets(pattern: torch.Tensor, ctx: BatchContext) -> dict[str, torch.Tensor]:
    """pattern (batch, head, query, key) -> per relative offset k - q: how many scored queries have their
    maximum there ("hits", ties split evenly, as in `interp.analyses.positional`) and how many could ("count"),
    each (batch, head, 2 * pos - 1); and the same for the first position ("first_hits", "first_count":
    (batch, head)). Scored queries are those with at least two allowed keys."""
    pattern = pattern.float()
    batch, n_heads, n, _ = pattern.shape
    allowed = ctx.allowed  # (batch, 1, query, key)
    scored = allowed.sum(-1) >= 2  # (batch, 1, query)
    valid = allowed & scored[..., None]  # (batch, 1, query, key)
    row_max = pattern.amax(-1, keepdim=True)
    is_max = (pattern >= row_max - TIE_TOLERANCE) & allowed  # (batch, head, query, key)
    share = is_max.float() / is_max.sum(-1, keepdim=True).clamp(min=1) * valid  # (batch, head, query, key)
    position = torch.arange(n, device=pattern.device)
    index = (position[None, :] - position[:, None] + n - 1).flatten()  # (query * key,): offset k - q, shifted
    hits = pattern.new_zeros(batch, n_heads, 2 * n - 1).scatter_add_(-1, index.expand(batch, n_heads, -1), share.flatten(-2))
    count = pattern.new_zeros(batch, 1, 2 * n - 1).scatter_add_(-1, index.expand(batch, 1, -1), valid.flatten(-2).float())
    first = ctx.first_real[:, None, None, None].expand(batch, n_heads, n, 1)
    first_hits = share.gather(-1, first).squeeze(-1).sum(-1)  # (batch, head)
    first_count = scored.float().sum(-1).expand(batch, n_heads)  # (batch, head)
    return {"hits": hits, "count": count.expand(-1, n_heads, -1).contiguous(),
            "first_hits": first_hits, "first_count": first_count.contiguous()}


def reduce_repeat_positions(pattern: torch.Tensor, ctx: BatchContext) -> dict[str, torch.Tensor]:
    """pattern (batch, head, query, key) -> (batch, head): mean weight of the repeat queries
    (q >= offset + prefix_len, from the prompts' `repeats`) on the key prefix_len - 1 back
    ("induction_position": where the induction target sits in an unshuffled repeat) and prefix_len
    back ("duplicate_position"). Fixed relative offsets: they do not follow the tokens."""
    repeats = ctx.repeats
    if repeats is None or repeats.period is None or repeats.start is None:
        raise Inconclusive("induction_position / duplicate_position need prompts with a known repeat structure (a "
                           "period, from interp.data.repeated_tokens); these prompts have none.")
    prefix_len = repeats.period
    queries = ctx.real.clone()  # (batch, query)
    queries[:, : repeats.start] = False
    out = {}
    for name, back in (("induction_position", prefix_len - 1), ("duplicate_position", prefix_len)):
        weight = pattern.float().diagonal(offset=-back, dim1=-2, dim2=-1)  # (batch, head, query - back)
        weight = F.pad(weight, (back, 0))  # (batch, head, query): 0 where the key would be before position 0
        mask = queries[:, None, :].float()
        out[name] = (weight * mask).sum(-1) / mask.sum(-1)
    return out


def argmax_offsets_per_prompt(model: nn.Module, prompts: PromptSet, *, batch_size: int = 32) -> dict[str, torch.Tensor]:
    """{"hits", "count": (prompt, layer, head, offset), "first_hits", "first_count": (prompt, layer, head)}."""
    acc = stream(model, prompts, reduce_argmax_offsets, batch_size=batch_size, accumulator=PerPromptAccumulator())
    return acc.result()


def offset_index(n_pos: int, offset: int) -> int:
    return offset + n_pos - 1


def head_metric(ctx: Context, metric: str | HeadType, *, model: nn.Module | None = None,
                prompts: PromptSet | None = None) -> torch.Tensor:
    """Per-prompt metric (prompt, layer, head) for every head, memoised per (model, prompts).

    `metric`: a `HeadType` (registered ones are read off the shared passes below), or a name: one of
    `interp.analyses.positional.positional_metrics()` (the positional head types' metrics and argmax
    rates, mean_distance, entropy), the metric of a head type that needs repeats (`induction`,
    `duplicate_token`, ...), `induction_position` / `duplicate_position`, or `argmax_at:K` (fraction
    of queries whose maximum weight sits at relative offset K; K may be `first`). Raises
    Inconclusive when the prompts cannot define it.
    """
    model = ctx.model if model is None else model
    prompts = ctx.prompts if prompts is None else prompts
    if isinstance(metric, HeadType):
        if HEAD_TYPES.get(metric.name) is not metric:  # not registered: measured in a pass of its own
            values = _own_pass(ctx, metric, model, prompts)
            return _defined(values, metric.column)
        metric = metric.column
    if metric in positional_metrics():
        values = ctx.cached(("focus", id(model), id(prompts)),
                            lambda: focus_per_prompt(model, prompts, batch_size=ctx.batch_size))[metric]
    elif metric in {t.column for t in repeat_types()}:
        values = _repeat_scores(ctx, model, prompts, metric)[metric]
    elif metric in REPEAT_POSITION_METRICS:
        values = _repeat_positions(ctx, model, prompts)[metric]
    elif metric.startswith("argmax_at:"):
        values = _argmax_at(ctx, model, prompts, metric.split(":", 1)[1])
    else:
        known = list(positional_metrics()) + [t.column for t in repeat_types()] + list(REPEAT_POSITION_METRICS) + ["argmax_at:K"]
        raise ValueError(f"unknown head metric {metric!r}; expected one of {known}.")
    return _defined(values, metric)


def _defined(values: torch.Tensor, metric: str) -> torch.Tensor:
    if torch.isnan(values).all():
        raise Inconclusive(f"{metric} is undefined on these prompts (e.g. next_token on a causal model, or "
                           "an offset longer than every prompt).")
    if torch.isnan(values).any():
        raise Inconclusive(f"{metric} is undefined on some prompts (too short or fully padded); drop them.")
    return values


def _own_pass(ctx: Context, head_type: HeadType, model: nn.Module, prompts: PromptSet) -> torch.Tensor:
    """(prompt, layer, head) metric of an unregistered head type, in one streamed pass."""
    def compute():
        if head_type.needs == "repeats":
            try:
                from interp.analyses.induction import _check_repeats

                _check_repeats(prompts)
            except NoRepeats as error:
                raise Inconclusive(f"the prompts lack what a {head_type.name} claim needs: {error}") from None
        reducer = functools.partial(reduce_head_types, types=(head_type,), argmax=False)
        return stream(model, prompts, reducer, batch_size=ctx.batch_size, accumulator=PerPromptAccumulator()).result()
    _keep(ctx, head_type)
    return ctx.cached(("head_type", id(head_type), id(model), id(prompts)), compute)[head_type.column]


def _repeat_scores(ctx: Context, model: nn.Module, prompts: PromptSet, metric: str) -> dict[str, torch.Tensor]:
    def induction():
        try:
            return scores_per_prompt(model, prompts, batch_size=ctx.batch_size)
        except NoRepeats as error:
            raise Inconclusive(f"the prompts lack what an {metric} claim needs: {error}") from None
    return ctx.cached(("induction", id(model), id(prompts)), induction)


def _repeat_positions(ctx: Context, model: nn.Module, prompts: PromptSet) -> dict[str, torch.Tensor]:
    repeats = prompts.repeats
    if repeats is None or repeats.period is None or repeats.start is None:  # start is None exactly without a period
        raise Inconclusive("induction_position / duplicate_position need prompts with a known repeat structure (a period, "
                           "from interp.data.repeated_tokens); these prompts have none.")
    if repeats.period < 2:
        raise Inconclusive(f"prefix_len={repeats.period}: the induction target would be the query itself; use prefix_len >= 2.")
    if repeats.start >= prompts.n_pos:
        raise Inconclusive(f"prompts of {prompts.n_pos} positions hold no repeat (prefix_len={repeats.period}).")
    return ctx.cached(("repeat_position", id(model), id(prompts)), lambda: stream(
        model, prompts, reduce_repeat_positions, batch_size=ctx.batch_size, accumulator=PerPromptAccumulator()).result())


def _argmax_at(ctx: Context, model: nn.Module, prompts: PromptSet, offset: str) -> torch.Tensor:
    """(prompt, layer, head) argmax rate at relative offset `offset` (or "first"): `offset_type(offset)`'s
    argmax rate, read off one pass that counts every offset at once."""
    counts = ctx.cached(("argmax", id(model), id(prompts)),
                        lambda: argmax_offsets_per_prompt(model, prompts, batch_size=ctx.batch_size))
    if offset == "first":
        return counts["first_hits"] / counts["first_count"]
    k = int(offset)
    index = offset_index(prompts.n_pos, k)
    if not 0 <= index < counts["hits"].shape[-1]:
        raise Inconclusive(f"offset {k} does not fit prompts of {prompts.n_pos} positions.")
    return counts["hits"][..., index] / counts["count"][..., index]


# --------------------------------------------------------------------------- evidence functions


def claim_head_type(claim: Claim) -> HeadType | None:
    """The head type a claim is about: its typed params' (`HeadTypeParams`), else the registered type whose
    metric a plain-dict claim names (None for other claims, e.g. positional ones)."""
    if isinstance(claim.params, HeadTypeParams):
        return claim.params.head_type
    metric = claim.params.get("metric")
    return next((t for t in HEAD_TYPES.values() if t.column == metric), None)


def _claim_metric(claim: Claim, ctx: Context) -> str:
    """The name of the metric the claim is judged on (`argmax_at:auto` resolved to the modal offset)."""
    metric = claim.params["metric"]
    if metric == "argmax_at:auto":
        return f"argmax_at:{modal_offset(ctx, *_subject(claim))}"
    return metric


def _claim_measure(claim: Claim, ctx: Context) -> str | HeadType:
    """What `head_metric` measures for the claim: its typed head type, else the metric's name."""
    if isinstance(claim.params, HeadTypeParams):
        return claim.params.head_type
    return _claim_metric(claim, ctx)


def modal_offset(ctx: Context, layer: int, head: int) -> str:
    """The relative offset (or "first") where the head's maximum most often sits, pooled over the context's prompts."""
    def compute():
        counts = ctx.cached(("argmax", id(ctx.model), id(ctx.prompts)),
                            lambda: argmax_offsets_per_prompt(ctx.model, ctx.prompts, batch_size=ctx.batch_size))
        return _modal_offsets(counts, ctx.prompts.n_pos)
    return ctx.cached(("modal_offset", id(ctx.model), id(ctx.prompts)), compute)[layer][head]


def _modal_offsets(counts: dict[str, torch.Tensor], n_pos: int, min_coverage: float = 0.25) -> list[list[str]]:
    """Per (layer, head): the offset with the highest pooled argmax rate among offsets that at least
    `min_coverage` of the scored queries have (so a rare long offset cannot win by chance)."""
    hits, count = counts["hits"].sum(0), counts["count"].sum(0)  # (layer, head, offset)
    first = counts["first_hits"].sum(0) / counts["first_count"].sum(0)  # (layer, head)
    rate = torch.where(count >= min_coverage * counts["first_count"].sum(0)[..., None], hits / count.clamp(min=1), -1.0)
    best = rate.argmax(-1)  # (layer, head)
    out = []
    for l in range(rate.shape[0]):
        row = []
        for h in range(rate.shape[1]):
            b = int(best[l, h])
            row.append("first" if float(first[l, h]) > float(rate[l, h, b]) else str(b - (n_pos - 1)))
        out.append(row)
    return out


def _subject(claim: Claim) -> tuple[int, int]:
    """The (layer, head) a head claim is about (its first head)."""
    if not claim.heads:
        raise BadInput(f"claim {claim.name!r} is about the whole model; {claim.kinds} evidence needs a head.")
    return claim.heads[0]


class _MetricEvidence(Protocol):
    """Observational evidence whose per-prompt metric the controls recompute (`Observational`)."""

    def __call__(self, claim: Claim, ctx: Context) -> Evidence: ...

    def values(self, claim: Claim, ctx: Context, *, model=None, prompts=None) -> torch.Tensor: ...


def _metric_evidence(claim: Claim) -> _MetricEvidence:
    """The claim's observational evidence as the controls use it: the per-prompt `values` of its metric."""
    return cast(_MetricEvidence, claim.evidence["observational"])


@dataclass(frozen=True)
class Observational:
    """The claim's metric on the prompts, against its observational threshold; for induction claims
    also the copying OV circuit (a head that matches prefixes but does not copy is not an induction head)."""

    def values(self, claim: Claim, ctx: Context, *, model=None, prompts=None) -> torch.Tensor:
        return head_metric(ctx, _claim_measure(claim, ctx), model=model, prompts=prompts)[:, claim.layer, claim.head]

    def head_scores(self, claim: Claim, ctx: Context) -> np.ndarray:
        """(layer, head) mean metric: the head ranking that stability compares."""
        return head_metric(ctx, _claim_measure(claim, ctx)).double().mean(0).numpy()

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        metric = _claim_metric(claim, ctx)
        evidence = threshold_evidence("observational", self.values(claim, ctx), claim.thresholds["observational"], ctx,
                                      what=f"{claim.label} {metric}", decisive=True)
        evidence = dataclasses.replace(evidence, metric=metric)  # the metric measured (argmax_at:auto resolved)
        copy_threshold = claim.thresholds.get("copying")
        if copy_threshold is None:
            return evidence
        try:
            copying = float(ctx.cached(("copying", id(ctx.model)), lambda: copying_scores(ctx.model))[claim.layer, claim.head])
        except TypeError as error:
            return dataclasses.replace(evidence, detail=evidence.detail + f"; copying not checked ({error})")
        detail = evidence.detail + f"; OV copying score {copying:.3f} (needs > {copy_threshold.value:g})"
        extra = {**evidence.extra, "copying": copying}
        if math.isfinite(copying) and copying > copy_threshold.value:
            return dataclasses.replace(evidence, detail=detail, extra=extra)
        return dataclasses.replace(evidence, passed=False, detail=detail + ": the head does not copy", extra=extra)


@dataclass(frozen=True)
class ShuffledControl:
    """The claim's metric on shuffled-token prompts (`interp.data.shuffled`, seeded by the context).

    expect="stay" (positional claims): the metric, recomputed on the shuffled prompts, must still
    clear the threshold: attention tied to position does not care which tokens sit there.
    expect="drop" (content claims, on prompts with a known repeat structure): the head's attention
    to where the repeat *was* before shuffling (`claim.params["position_metric"]`, e.g. the key
    prefix_len - 1 back for induction) must fall below the threshold, and below its value on the
    original prompts (paired). A head that copies from a fixed offset keeps it and is refuted.
    The token-defined metric on the shuffled prompts (does the head follow the moved repeats?) is
    reported beside it, as `follows_tokens`, not judged: shuffled sequences are off the training
    distribution, so real heads weaken there.
    """

    expect: ShuffleExpect = "stay"
    decisive: bool = True

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        if self.expect not in get_args(ShuffleExpect):
            raise ValueError(f"expect={self.expect!r}; expected one of {list(get_args(ShuffleExpect))}.")
        observe = _metric_evidence(claim)
        threshold = claim.thresholds["observational"]
        metric = _claim_metric(claim, ctx)
        if self.expect == "stay":
            values = observe.values(claim, ctx, prompts=_shuffled(ctx, ctx.prompts))
            return threshold_evidence("control_shuffled", values, threshold, ctx, decisive=self.decisive,
                                      what=f"{claim.label} {metric} on shuffled tokens")
        position_metric = claim.params.get("position_metric")
        if position_metric is None:
            raise ValueError(f"claim {claim.name!r} has no params['position_metric'] for expect='drop'; "
                             f"use one of {list(REPEAT_POSITION_METRICS)}.")
        layer, head = claim.layer, claim.head
        original = head_metric(ctx, position_metric)[:, layer, head]
        values = head_metric(ctx, position_metric, prompts=_shuffled(ctx, ctx.prompts, keep_repeats=True))[:, layer, head]
        below = Threshold(threshold.value, threshold.source, "below" if threshold.direction == "above" else "above")
        level = threshold_evidence("control_shuffled", values, below, ctx, decisive=self.decisive, label="shuffled-level",
                                   what=f"{claim.label} attention where the repeat was ({position_metric}) on shuffled tokens")
        drop = difference_evidence("control_shuffled", original, values, ctx, what="drop from shuffling", label="shuffled-drop")
        try:
            follows = float(observe.values(claim, ctx, prompts=_shuffled(ctx, ctx.prompts)).mean())
        except Inconclusive:  # e.g. n-gram repeats (meta match_len) rarely survive shuffling: nothing to follow
            follows = math.nan
        passed = True if (level.passed and drop.passed) else False if level.passed is False else None
        return dataclasses.replace(
            level, passed=passed, p_value=max(level.p_value, drop.p_value), rule=f"shuffled {below.rule()} and drop CI > 0",
            detail=f"{level.detail}; {drop.detail}; {metric} following the shuffled tokens = {follows:.3f}",
            extra={"drop": drop.effect, "follows_tokens": follows})


@dataclass(frozen=True)
class RandomInitControl:
    """The metric on a randomly initialised model of the same shape: must be below the threshold and
    below the trained model's (paired per prompt). A random model clearing the threshold refutes."""

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        observe = _metric_evidence(claim)
        random_model = _random_model(ctx)
        trained = observe.values(claim, ctx)
        random = observe.values(claim, ctx, model=random_model)
        threshold = claim.thresholds["observational"]
        sign = 1.0 if threshold.direction == "above" else -1.0
        below = Threshold(threshold.value, threshold.source, "below" if threshold.direction == "above" else "above")
        level = threshold_evidence("control_random_init", random, below, ctx, decisive=True, label="random-level",
                                   what=f"{claim.label} {_claim_metric(claim, ctx)} at random init")
        gap = difference_evidence("control_random_init", sign * trained, sign * random, ctx, label="random-gap",
                                  what="trained minus random-init")
        if level.passed is False:
            passed = False  # the architecture alone clears the threshold
        elif level.passed and gap.passed:
            passed = True
        else:
            passed = None
        return Evidence("control_random_init", effect=gap.effect, ci_low=gap.ci_low, ci_high=gap.ci_high,
                        p_value=max(level.p_value, gap.p_value), rule=f"random-init {below.rule()} and trained - random CI > 0",
                        passed=passed, decisive=True, n_prompts=len(trained), detail=f"{level.detail}; {gap.detail}",
                        extra={"random_init": level.effect}, n_resamples=gap.n_resamples, metric="trained minus random-init")


# --------------------------------------------------------------------------- behaviour losses


Part = Literal["behaviour", "first_copy"]


def behaviour_mask(prompts: PromptSet, part: Part = "behaviour") -> tuple[torch.Tensor, str]:
    """(prompt, pos - 1) bool over next-token predictions (query q predicts token q + 1), and its name.

    part="behaviour": for prompts with a repeat period (`prompts.repeats`), the predictions of the second
    and later copies that an earlier copy makes predictable (q >= offset + prefix_len); for natural
    repeats (a `match_len` without a period) the predictions right after a repeated n-gram
    (`interp.analyses.induction.repeat_queries`); otherwise every prediction of a real token. part="first_copy": the same predictions inside the first copy
    (q = offset .. offset + prefix_len - 2), where nothing repeats yet: the baseline against which
    the repeated copies' loss advantage is measured.
    """
    if part not in get_args(Part):
        raise ValueError(f"part={part!r}; expected one of {list(get_args(Part))}.")
    n = prompts.n_pos
    real = torch.ones(len(prompts), n, dtype=torch.bool) if prompts.attention_mask is None else prompts.attention_mask.bool()
    mask = real[:, 1:] & real[:, :-1]  # (prompt, pos - 1)
    repeats = prompts.repeats
    query = torch.arange(n - 1)
    if repeats is None or repeats.period is None or repeats.start is None:  # start is None exactly without a period
        if part == "first_copy":
            raise Inconclusive("the prompts have no repeated copy (no meta prefix_len), so no first-copy baseline.")
        if repeats is not None and repeats.match_len is not None:  # natural repeats: right after a repeated n-gram
            return mask & repeat_queries(prompts)[:, :-1], f"next-token loss after a repeated {repeats.match_len}-gram"
        return mask, "next-token loss on every position"
    offset, prefix_len, start = repeats.offset, repeats.period, repeats.start
    if start > n - 2:
        raise Inconclusive(f"prompts of {n} positions have no repeated copy to predict (prefix_len={prefix_len}).")
    if part == "first_copy":
        return mask & (query >= offset) & (query <= start - 2), "next-token loss on the first copy"
    return mask & (query >= start), "next-token loss on the repeated copies"


def resolve_behaviour(ctx: Context, behaviour: BehaviourLike = None) -> Behaviour:
    """The behaviour causal evidence measures: the evidence's own, else the context's, else the model's
    default (`interp.behaviour.default_behaviour`: for a causal LM the next-token loss on the repeated
    copies when the prompts repeat, else on every position; for an encoder the embedding change)."""
    spec = ctx.behaviour if behaviour is None else behaviour
    key = spec if spec is None or isinstance(spec, str) else id(spec)
    return ctx.cached(("behaviour", id(ctx.model), key), lambda: as_behaviour(_keep(ctx, spec), ctx.model))


def behaviour_text(ctx: Context, behaviour: Behaviour) -> str:
    """The behaviour in words for the context's prompts; Inconclusive when the prompts cannot define it."""
    if behaviour.name == "next_token_loss" and dict(behaviour.params).get("positions") == "auto":
        return behaviour_mask(ctx.prompts)[1]  # raises Inconclusive for repeats with nothing to predict
    return behaviour.describe(ctx.prompts)


def _first_copy(logits: torch.Tensor, prompts: PromptSet) -> torch.Tensor:
    """Next-token loss inside the first copy of repeated prompts (`behaviour_mask(part="first_copy")`)."""
    return masked_next_token_loss(logits, prompts, behaviour_mask(prompts, "first_copy")[0])


FIRST_COPY_LOSS = Behaviour("next_token_loss", "logits", _first_copy, description="next-token loss on the first copy",
                            unit="nats", params=(("positions", "first_copy"),))


@torch.no_grad()
def behaviour_loss(
    ctx: Context, key: tuple, intervene: Callable[[PromptSet], contextlib.AbstractContextManager] | None = None,
    *, part: Part = "behaviour", behaviour: BehaviourLike = None,
) -> torch.Tensor:
    """Per-prompt behaviour value (prompt,) under an intervention (a context manager per batch),
    memoised by `key`. `behaviour`: see `resolve_behaviour`. part="first_copy": the next-token
    loss on the first copy of repeated prompts, whatever the behaviour (the repeat-advantage baseline)."""
    model, prompts = ctx.model, ctx.prompts
    if part not in get_args(Part):
        raise ValueError(f"part={part!r}; expected one of {list(get_args(Part))}.")
    chosen = FIRST_COPY_LOSS if part == "first_copy" else resolve_behaviour(ctx, behaviour)

    def clean_reference():
        return ctx.cached(("behaviour-clean", id(model), id(prompts), id(chosen)), lambda: measure_clean(ctx, chosen))

    def compute() -> torch.Tensor:
        clean = clean_reference() if chosen.compares_to_clean else None
        try:
            return measure(model, prompts, chosen, intervene=intervene, clean=clean, batch_size=ctx.batch_size,
                           what=" ".join(map(str, key)))
        except UndefinedOnPrompts as error:
            raise Inconclusive(f"the prompts cannot define the behaviour {chosen.name}: {error}") from None

    return ctx.cached(("loss", id(model), id(prompts), part, id(chosen)) + key, compute)


def measure_clean(ctx: Context, behaviour: Behaviour) -> torch.Tensor | None:
    """What the clean run is kept as for a behaviour that compares with it (e.g. pooled embeddings); None
    for a behaviour that does not."""
    from interp.behaviour import clean_summaries

    return clean_summaries(ctx.model, ctx.prompts, behaviour, batch_size=ctx.batch_size)


def _reference(ctx: Context, behaviour: Behaviour | None = None):
    """Mean-ablation values over the prompts the model reads under the behaviour (masked for masked-LM)."""
    behaviour = behaviour or resolve_behaviour(ctx)
    prompts = behaviour.model_prompts(ctx.prompts)
    return ctx.cached(("reference", id(ctx.model), id(ctx.prompts), id(behaviour)),
                      lambda: reference_activations(ctx.model, _keep(ctx, prompts), batch_size=ctx.batch_size))


def _clean_loss(ctx: Context, behaviour: Behaviour) -> torch.Tensor:
    return behaviour_loss(ctx, ("clean",), behaviour=behaviour)


def _ablated_loss(ctx: Context, layer: int, head: int, behaviour: Behaviour) -> torch.Tensor:
    reference = _reference(ctx, behaviour)
    return behaviour_loss(ctx, ("ablate", layer, head),
                          lambda batch: ablate(ctx.model, [(layer, head)], "mean", reference=reference, seed=ctx.seed),
                          behaviour=behaviour)


def comparable_heads(model: nn.Module, layer: int, head: int, has_role: np.ndarray | None = None) -> list[tuple[int, int]]:
    """Heads to compare an ablation with: those of the same layer that do not share the claimed role
    (`has_role`: (layer, head) bool from the claim's metric); failing that, such heads in later layers.
    Earlier layers are never used: they may feed the head (an induction head needs its previous-token
    head), so their ablation effect is not a fair baseline. Empty when every candidate shares the role."""
    from interp.interventions import all_heads

    lacks = (lambda l, h: True) if has_role is None else (lambda l, h: not bool(has_role[l, h]))
    heads = [(l, h) for l, h in all_heads(model) if (l, h) != (layer, head) and lacks(l, h)]
    same = [(l, h) for l, h in heads if l == layer]
    return same or [(l, h) for l, h in heads if l > layer]


@dataclass(frozen=True)
class Necessity:
    """Mean-ablating the head raises the behaviour loss more than mean-ablating a comparable head: per
    prompt, dL(head) - mean over comparable heads of dL(other), with a sign-flip test. Comparable heads
    lack the claimed role (`comparable_heads`); when every head of the layer shares it (redundant
    heads), the comparison is with zero, and the detail says so. With several heads in the role, the
    loss when they are ablated together is reported too (`delta_loss_role_group`). The loss is the
    `behaviour`'s value (`resolve_behaviour`: this field, else the test's, else the model's)."""

    behaviour: BehaviourLike = dataclasses.field(default=None, compare=False)

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        chosen = resolve_behaviour(ctx, self.behaviour)
        behaviour = behaviour_text(ctx, chosen)
        clean = _clean_loss(ctx, chosen)
        layer, head = _subject(claim)
        delta = _ablated_loss(ctx, layer, head, chosen) - clean  # (prompt,)
        observe = claim.evidence["observational"]
        head_scores = getattr(observe, "head_scores", None)  # Observational's (layer, head) ranking, where it has one
        scores = head_scores(claim, ctx) if head_scores is not None else None
        threshold = claim.thresholds["observational"]
        has_role = None if scores is None else np.vectorize(lambda v: threshold.judge(v, v) is True)(scores)
        others = comparable_heads(ctx.model, layer, head, has_role)
        if others:
            delta_others = torch.stack([_ablated_loss(ctx, l, h, chosen) - clean for l, h in others]).mean(0)
            against = f"{float(delta_others.mean()):.4g} for {len(others)} comparable heads without the role"
        else:
            delta_others = torch.zeros_like(delta)
            against = "0 (every other head of this layer and later shares the role: compared with no effect)"
        delta_loss = float(delta.mean())
        extra: dict[str, float | str] = {"delta_loss": delta_loss, "delta_loss_comparable": float(delta_others.mean()),
                                         "loss_clean": float(clean.mean()), "behaviour": behaviour}
        group = [(layer, h) for h in range(len(has_role[layer])) if has_role[layer, h]] if has_role is not None else []
        delta_group: float | None = None  # the role group's loss change, with several heads in the role
        if (layer, head) in group and len(group) > 1:
            reference = _reference(ctx, chosen)
            together = behaviour_loss(ctx, ("ablate-group",) + tuple(group), lambda batch: ablate(
                ctx.model, group, "mean", reference=reference, seed=ctx.seed), behaviour=chosen) - clean
            delta_group = extra["delta_loss_role_group"] = float(together.mean())
        notes = ""
        if _has_period(ctx.prompts) and chosen.name == "next_token_loss":
            # how much of the repeated copies' advantage over the first copy the ablation removes
            first = behaviour_loss(ctx, ("clean",), part="first_copy")
            gap = float(first.mean() - clean.mean())
            if gap > 0:
                extra.update(loss_first_copy=float(first.mean()), advantage_removed=delta_loss / gap)
                notes = f"; removes {extra['advantage_removed']:.0%} of the repeat advantage"
                if delta_group is not None:
                    extra["advantage_removed_role_group"] = delta_group / gap
                    labels = "+".join(f"L{l}H{h}" for l, h in group)
                    notes += f", {labels} together {extra['advantage_removed_role_group']:.0%}"
        ev = difference_evidence("necessity", delta, delta_others, ctx, what=f"ablating {claim.label} minus comparable heads",
                                 extra=extra)
        return dataclasses.replace(ev, detail=f"{behaviour}: {ev.detail} (dL {extra['delta_loss']:.4g} vs {against}{notes})")


def ideal_for(claim: Claim, causal: bool = True) -> Callable[[PromptSet], Any]:
    """The idealised pattern the claim describes, as batch -> a (batch, query, key) tensor for
    `substitute_pattern`: its head type's `ideal_pattern` (uniform over the target keys)."""
    head_type = claim_head_type(claim)
    if head_type is None or head_type.sufficiency is None or claim.params.get("ideal") is None:
        raise Inconclusive(f"claim {claim.name!r} describes no idealised pattern to substitute.")
    window = claim.params.get("window")
    if isinstance(head_type.target, WindowTarget) and window is not None and window != head_type.target.window:
        head_type = dataclasses.replace(head_type, target=WindowTarget(int(window)))
    return lambda batch: head_type.ideal_pattern(TargetBatch.from_prompts(batch, causal=causal))


def content_pattern(batch: PromptSet, kind: str) -> torch.Tensor:
    """(batch, query, key) ideal pattern of head type `kind` (e.g. induction, duplicate_token) from the
    tokens: uniform over the targets; no target: the first real key."""
    return get_head_type(kind).ideal_pattern(TargetBatch.from_prompts(batch, causal=True))


def _substituted(ctx: Context, claim: Claim, pattern: Callable[[PromptSet], Any], tag: tuple, behaviour: Behaviour,
                 permute: bool = False) -> torch.Tensor:
    """Behaviour loss with the claim's head's pattern replaced by `pattern(batch)` (optionally permuted among keys)."""
    layer, head = _subject(claim)
    return behaviour_loss(ctx, ("substitute", layer, head) + tag, lambda batch: substitute_pattern(
        ctx.model, layer, head, pattern(batch), permute_keys=permute, seed=ctx.seed), behaviour=behaviour)


@dataclass(frozen=True)
class Sufficiency:
    """Substituting the idealised pattern recovers the behaviour: fraction of loss recovered
    (L_ablated - L_substituted) / (L_ablated - L_clean), against the claim's sufficiency threshold.

    Beside it (extra `recovered_by_mean_pattern`, not judged): the fraction recovered by the head's
    own average pattern over the prompts, a content-free version of what it really does. When the
    idealised pattern fails but the average one recovers, the head's role is positional but not the
    exact one the claim describes (e.g. a 'previous-token' head whose readers need its mix of
    previous, current and earlier tokens)."""

    behaviour: BehaviourLike = dataclasses.field(default=None, compare=False)

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        chosen = resolve_behaviour(ctx, self.behaviour)
        behaviour = behaviour_text(ctx, chosen)
        layer, head = _subject(claim)
        pattern = ideal_for(claim, causal=attention_sites(ctx.model)[layer].causal is not False)
        clean = _clean_loss(ctx, chosen)
        ablated = _ablated_loss(ctx, layer, head, chosen)
        substituted = _substituted(ctx, claim, pattern, ("ideal", claim.params.get("ideal")), chosen)
        denominator = ablated - clean
        extra: dict[str, float | str] = {"loss_clean": float(clean.mean()), "loss_ablated": float(ablated.mean()),
                                         "loss_substituted": float(substituted.mean()), "behaviour": behaviour}
        scale = max(float(clean.mean().abs()), 1e-3)
        if float(denominator.mean()) <= 1e-3 * scale:
            return Evidence.unmeasured(
                "sufficiency", rule=claim.thresholds["sufficiency"].rule(), n_prompts=len(clean), extra=extra,
                detail=f"{behaviour}: ablating {claim.label} does not raise the loss (dL = {float(denominator.mean()):.3g}), "
                       "so the fraction recovered is undefined")
        note = ""
        mean_pattern = _mean_pattern(ctx, layer, head)
        if mean_pattern is not None:
            averaged = _substituted(ctx, claim, lambda batch: mean_pattern, ("mean-pattern",), chosen)
            extra["recovered_by_mean_pattern"] = float((ablated - averaged).mean() / denominator.mean())
            note = f"; the head's own average pattern recovers {extra['recovered_by_mean_pattern']:.3f}"
        ev = ratio_evidence("sufficiency", ablated - substituted, denominator, claim.thresholds["sufficiency"], ctx,
                            what=f"fraction of loss recovered by the ideal {claim.params.get('ideal')} pattern in {claim.label}",
                            extra=extra)
        return dataclasses.replace(ev, detail=f"{behaviour}: {ev.detail} (L clean {extra['loss_clean']:.4f}, "
                                              f"ablated {extra['loss_ablated']:.4f}, substituted {extra['loss_substituted']:.4f}){note}")


def _mean_pattern(ctx: Context, layer: int, head: int) -> torch.Tensor | None:
    """The head's (query, key) pattern averaged over the prompts; None for padded prompts, whose
    positions do not line up."""
    if ctx.prompts.attention_mask is not None:
        return None

    def compute() -> torch.Tensor:
        acc = stream(ctx.model, ctx.prompts, lambda pattern, _: {"pattern": pattern.float()}, layers=[layer],
                     batch_size=ctx.batch_size, accumulator=MomentAccumulator())
        mean = acc.result()["pattern"]["mean"][0].float()  # (head, query, key)
        return mean / mean.sum(-1, keepdim=True)  # renormalise away float error
    return ctx.cached(("mean-pattern", id(ctx.model), id(ctx.prompts), layer), compute)[head]


@dataclass(frozen=True)
class Faithfulness:
    """Swapping the head's pattern for a uniform one, and for its own weights permuted among the allowed
    keys, both raise the behaviour loss (per prompt, the smaller increase, must have CI > 0). If the loss
    does not move, the pattern explains nothing (fails, not decisive)."""

    behaviour: BehaviourLike = dataclasses.field(default=None, compare=False)

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        chosen = resolve_behaviour(ctx, self.behaviour)
        behaviour = behaviour_text(ctx, chosen)
        clean = _clean_loss(ctx, chosen)
        uniform = _substituted(ctx, claim, lambda batch: "uniform", ("uniform",), chosen)
        permuted = _substituted(ctx, claim, lambda batch: None, ("permuted",), chosen, permute=True)
        d_uniform, d_permuted = uniform - clean, permuted - clean
        effect = torch.minimum(d_uniform, d_permuted)
        ev = difference_evidence("faithfulness", effect, torch.zeros_like(effect), ctx, fail_below=1e-6,
                                 what=f"smaller loss increase when {claim.label}'s pattern is swapped",
                                 extra={"delta_loss_uniform": float(d_uniform.mean()),
                                        "delta_loss_permuted": float(d_permuted.mean()), "behaviour": behaviour})
        note = " (the pattern explains nothing: swapping it leaves the loss unchanged)" if ev.passed is False else ""
        return dataclasses.replace(ev, detail=f"{behaviour}: {ev.detail}; uniform +{float(d_uniform.mean()):.4g}, "
                                              f"permuted +{float(d_permuted.mean()):.4g}{note}")


# --------------------------------------------------------------------------- presets


def _label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def _has_period(prompts: PromptSet) -> bool:
    return prompts.repeats is not None and prompts.repeats.period is not None


def head_type_claim(head_type: HeadType | str, layer: int, head: int, *, threshold: float | None = None,
                    sufficiency: float | None = None, copying: float | None = None, **params: Any) -> Claim:
    """The claim "head (layer, head) is a `head_type` head", with every evidence kind that applies:
    observational (the metric against `threshold`, default the type's), the shuffled control the type
    expects, the random-init control, necessity, faithfulness, stability, and sufficiency (its ideal
    pattern recovers the behaviour) when the type has a sufficiency threshold. `params` override the
    type's own (e.g. window); `copying` the OV copying threshold of types that check one."""
    t = get_head_type(head_type) if isinstance(head_type, str) else head_type
    unknown = sorted(set(params) - set(dict(t.params)))
    if unknown:
        raise TypeError(f"{t.name} claims take no parameter {unknown[0]!r}; they take threshold, sufficiency"
                        f"{''.join(', ' + k for k in dict(t.params))}.")
    threshold = t.threshold if threshold is None else threshold
    values = {**dict(t.params), **params}
    evidence: dict[str, Any] = {
        "observational": Observational(),
        "control_shuffled": ShuffledControl(t.shuffle, decisive=t.shuffle_decisive),
        "control_random_init": RandomInitControl(),
        "necessity": Necessity(),
        "faithfulness": Faithfulness(),
        "stability": Stability(),
    }
    thresholds = {"observational": Threshold(threshold, t.citation)}
    if t.sufficiency is not None:
        evidence["sufficiency"] = Sufficiency()
        thresholds["sufficiency"] = Threshold(t.sufficiency if sufficiency is None else sufficiency, SUFFICIENCY)
    if t.copying is not None:
        thresholds["copying"] = Threshold(t.copying if copying is None else copying, ELHAGE)
    return Claim(t.name, ((layer, head),), t.describe(_label(layer, head), threshold, **values),
                 HeadTypeParams(t, tuple(values.items())), thresholds, evidence)


def previous_token_head(layer: int, head: int, *, threshold: float = 0.5, sufficiency: float = 0.5) -> Claim:
    """More than `threshold` of the head's attention on the previous token (Clark et al. 2019: > 0.5)."""
    return head_type_claim("previous_token", layer, head, threshold=threshold, sufficiency=sufficiency)


def next_token_head(layer: int, head: int, *, threshold: float = 0.5, sufficiency: float = 0.5) -> Claim:
    """More than `threshold` of the attention on the next token (Clark et al. 2019: > 0.5). Defined for
    bidirectional models only: on a causal model the metric is undefined and the verdict inconclusive."""
    return head_type_claim("next_token", layer, head, threshold=threshold, sufficiency=sufficiency)


def self_token_head(layer: int, head: int, *, threshold: float = 0.5, sufficiency: float = 0.5) -> Claim:
    """More than `threshold` of the attention on the query's own position (Clark et al. 2019's rule)."""
    return head_type_claim("self_token", layer, head, threshold=threshold, sufficiency=sufficiency)


def first_token_head(layer: int, head: int, *, threshold: float = 0.5, sufficiency: float = 0.5) -> Claim:
    """A sink head: more than `threshold` of the attention on the first position (Clark et al. 2019's
    [CLS] heads; Xiao et al. 2023's attention sinks)."""
    return head_type_claim("first_token", layer, head, threshold=threshold, sufficiency=sufficiency)


def local_window_head(layer: int, head: int, *, threshold: float = 0.5, window: int = 3, sufficiency: float = 0.5) -> Claim:
    """More than `threshold` of the attention within `window` positions of the query (|q - k| <= window),
    Clark et al. 2019's majority rule applied to a band. The random-init control matters most here:
    on short prompts even a uniform head puts most of its weight near the query."""
    if window != 3:
        raise ValueError(f"window={window}: interp.analyses.positional measures local_window with window=3; use window=3.")
    return head_type_claim("local_window", layer, head, threshold=threshold, sufficiency=sufficiency, window=window)


def induction_head(layer: int, head: int, *, threshold: float = 0.5, copying: float = 0.0, sufficiency: float = 0.5) -> Claim:
    """An induction head (Olsson et al. 2022): on repeated random tokens, more than `threshold` of the
    attention of repeat queries on the token after the earlier occurrence of the current token
    (prefix matching), an OV circuit that copies (eigenvalue copying score > `copying`), and no such
    attention to where the target *was* once the tokens are shuffled (copying from a fixed offset fails)."""
    return head_type_claim("induction", layer, head, threshold=threshold, sufficiency=sufficiency, copying=copying)


def duplicate_token_head(layer: int, head: int, *, threshold: float = 0.5, sufficiency: float = 0.5) -> Claim:
    """More than `threshold` of the attention of repeat queries on earlier occurrences of the current token
    (Olsson et al. 2022; Wang et al. 2022), not to where they *were* once the tokens are shuffled."""
    return head_type_claim("duplicate_token", layer, head, threshold=threshold, sufficiency=sufficiency)


@dataclass(frozen=True)
class PositionalParams(PlainParams):
    """A positional claim's parameters: the relative offset (an int, "first", or None: the modal offset
    of the tested prompts). Reads as the plain mapping {"metric": "argmax_at:K", "offset": K}."""

    offset: int | str | None = None

    @property
    def head_type(self) -> HeadType | None:
        """The positional head type judged (`interp.analyses.head_types.offset_type`); None until the offset is known."""
        return None if self.offset is None else offset_type(self.offset)

    def as_dict(self) -> dict[str, Any]:
        return {"metric": "argmax_at:auto" if self.offset is None else f"argmax_at:{self.offset}", "offset": self.offset}


def positional_head(layer: int, head: int, *, offset: int | str | None = None, threshold: float = 0.9) -> Claim:
    """Positional, not content-based (Voita et al. 2019): the maximum weight sits at relative offset
    `offset` (an int k - q, or "first" for position 0) for at least `threshold` of the queries, and still
    does on shuffled tokens. `offset=None` takes the modal offset of the prompts under test.

    Choosing the offset on the tested prompts does not inflate the test when threshold > 0.5:
    each query has one maximum, so the offsets' argmax rates sum to one and at most one offset
    can pass; "the modal offset passes" is then the same event as "some offset passes"."""
    if offset is None and threshold <= 0.5:
        raise ValueError(
            f"positional_head with offset=None needs threshold > 0.5 (got {threshold}): below that, several "
            "offsets could pass and picking one on the tested prompts would bias the test; name the offset."
        )
    if offset is not None and offset != "first":
        offset = int(offset)
    where = ("the first position" if offset == "first" else "one relative offset" if offset is None
             else f"relative offset {offset}")
    evidence: dict[str, EvidenceFn] = {
        "observational": Observational(),
        "control_shuffled": ShuffledControl("stay", decisive=True),
        "control_random_init": RandomInitControl(),
        "stability": Stability(),
    }
    return Claim("positional", ((layer, head),),
                 f"{_label(layer, head)} is positional: its maximum weight sits at {where} for >= {threshold:.0%} of queries, "
                 "whatever the tokens",
                 PositionalParams(offset), {"observational": Threshold(threshold, VOITA)}, evidence)


_NAMED_PRESETS: dict[str, Callable[..., Claim]] = {
    "previous_token": previous_token_head,
    "next_token": next_token_head,
    "self_token": self_token_head,
    "first_token": first_token_head,
    "local_window": local_window_head,
    "induction": induction_head,
    "duplicate_token": duplicate_token_head,
    "positional": positional_head,
}


class _Presets(Mapping):
    """kind -> claim factory (layer, head, **params): the built-in presets, then one per head type
    registered since (`interp.analyses.head_types.register`), read live from the registry."""

    def __getitem__(self, kind: str) -> Callable[..., Claim]:
        if kind in _NAMED_PRESETS:
            return _NAMED_PRESETS[kind]
        if kind in HEAD_TYPES:
            return functools.partial(head_type_claim, HEAD_TYPES[kind])
        raise KeyError(kind)

    def __iter__(self) -> Iterator[str]:
        return iter([*_NAMED_PRESETS, *(name for name in HEAD_TYPES if name not in _NAMED_PRESETS)])

    def __len__(self) -> int:
        return len(list(iter(self)))


PRESETS: Mapping[str, Callable[..., Claim]] = _Presets()


def make_claim(kind: str, layer: int, head: int, **params) -> Claim:
    """A preset claim by kind name (`CLAIM_KINDS`, or a registered head type), e.g. make_claim("induction", 1, 2)."""
    if kind not in PRESETS:
        raise ValueError(f"unknown claim kind {kind!r}; expected one of {list(PRESETS)}.")
    return PRESETS[kind](layer, head, **params)


# --------------------------------------------------------------------------- scan


def propose(model: nn.Module, prompts: PromptSet, *, batch_size: int = 32,
            device: Device = None, dtype: DType = None) -> list[Claim]:
    """Claims suggested by the metrics on `prompts`: for every head, each head type (`interp.analyses.head_types`,
    those the model and prompts define) whose point estimate clears its threshold, and a positional claim
    where the maximum sits at one offset for >= 90% of queries; a head that clears none gets its closest
    head type (so every head is tested). `device` / `dtype`: measured on a moved copy (`interp.launch.move`)."""
    check_inputs("propose", model, prompts)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    ctx = Context(model, prompts, batch_size=batch_size)
    causal = attention_sites(model)[0].causal
    means = _defined_means(ctx, [t for t in head_types() if t.available(prompts, causal=causal) is None])
    kinds = [t for t in head_types() if t.name in means]
    counts = ctx.cached(("argmax", id(model), id(prompts)), lambda: argmax_offsets_per_prompt(model, prompts, batch_size=batch_size))
    modes = _modal_offsets(counts, prompts.n_pos)
    claims: list[Claim] = []
    n_layers, n_heads = next(iter(means.values())).shape
    for layer in range(n_layers):
        for head in range(n_heads):
            chosen = []
            ratios = {}
            for t in kinds:
                ratios[t.name] = float(means[t.name][layer, head]) / t.threshold
                if ratios[t.name] > 1:
                    chosen.append(PRESETS[t.name](layer, head))
            mode = modes[layer][head]
            rate = _rate_at(counts, prompts.n_pos, layer, head, mode)
            if rate >= 0.9:
                chosen.append(positional_head(layer, head, offset=mode if mode == "first" else int(mode)))
            if not chosen:
                best = max(ratios, key=ratios.__getitem__)
                chosen.append(PRESETS[best](layer, head))
            claims.extend(chosen)
    return claims


def _defined_means(ctx: Context, kinds: list[HeadType]) -> dict[str, torch.Tensor]:
    """{type name: (layer, head) mean metric} of the types the prompts define; a type undefined on them (an
    offset no prompt reaches, a next token on a causal model) proposes nothing, as unavailable types do."""
    means = {}
    for t in kinds:
        try:
            means[t.name] = head_metric(ctx, t).double().mean(0)
        except Inconclusive:
            continue
    return means


def _rate_at(counts: dict[str, torch.Tensor], n_pos: int, layer: int, head: int, mode: str) -> float:
    if mode == "first":
        return float(counts["first_hits"][:, layer, head].sum() / counts["first_count"][:, layer, head].sum())
    i = offset_index(n_pos, int(mode))
    return float(counts["hits"][:, layer, head, i].sum() / counts["count"][:, layer, head, i].sum().clamp(min=1))


def scan(
    model: nn.Module,
    prompts: PromptSet,
    *,
    seed: int = 0,
    alpha: float = 0.05,
    evidence: Sequence[str] | None = None,
    batch_size: int = 32,
    progress: bool = False,
    behaviour: BehaviourLike = None,
    device: Device = None,
    dtype: DType = None,
) -> pd.DataFrame:
    """Propose claims for every head on one half of the prompts and test them on the other half.

    Claims are never tested on the prompts that proposed them. Returns the verdict table of
    `interp.claims.test_claims` (one row per proposed claim, p-values corrected over all of them),
    with `proposed_on` / `tested_on` prompt counts. `behaviour` is what necessity, sufficiency and
    faithfulness measure (`interp.behaviour`; default: the model's own); the `behaviour` column says which.
    `device` / `dtype`: both halves run on one moved copy of the model (`interp.launch.move`).
    """
    _, seed = check_inputs("scan", model, prompts, seed=seed)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    propose_half, test_half = prompts.split(0.5, seed=seed)
    claims = propose(model, propose_half, batch_size=batch_size)
    table = test_claims(model, claims, test_half, alpha=alpha, seed=seed, evidence=evidence, batch_size=batch_size,
                        progress=progress, behaviour=behaviour)
    table.insert(table.columns.get_loc("n_prompts"), "proposed_on", len(propose_half))
    return table
