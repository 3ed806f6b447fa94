"""The observational evidence for a head claim and the controls that recompute its metric
(the kinds of `interp.claims`), with the per-prompt head metrics they read (`head_metric`):

- observational: the metric per prompt, mean and bootstrap CI against the threshold;
- control_shuffled: shuffled-token prompts (`interp.data.shuffled`). Positional claims: the
  metric, recomputed there, must still clear the threshold (position does not care which tokens
  sit where). Content claims (induction, duplicate-token), on prompts with a known repeat
  structure: the head's attention to where the repeat target *was* (a fixed relative offset) must
  drop below the threshold, since the tokens have moved. A head that copies from a fixed offset
  looks like an induction head on repeats of one length, keeps that attention, and is refuted;
  conversely a `positional` claim at the repeat distance can hold on the repeated prompts and is
  refuted on shuffled ones when the head really does induction;
- control_random_init: the metric on a randomly initialised model of the same shape (`random_init_model`: our
  models rebuilt from their config with a new seed; any other `nn.Module`, intercepted or not, a deep copy
  re-initialised module by module) must be below the threshold and below the trained model's (paired per
  prompt); a random model that clears the threshold shows the metric is an artefact of architecture or prompt
  length, and refutes the claim. A model some of whose parameters nothing re-initialises gets no copy: the
  control is then "not applicable", names them, and counts neither way.

Limits: the copying score (`interp.analyses.induction.copying_scores`) is read from the weights, with
no interval; a positional claim without an offset takes the modal offset of the prompts it is tested on.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol, cast, get_args

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from interp.analyses.claims.common import subject
from interp.analyses.head_types import (
    HEAD_TYPES,
    TIE_TOLERANCE,
    HeadType,
    HeadTypeParams,
    ShuffleExpect,
    reduce_head_types,
)
from interp.analyses.induction import NoRepeats, copying_scores, repeat_types, scores_per_prompt
from interp.analyses.positional import focus_per_prompt, positional_metrics
from interp.capture import BatchContext, PerPromptAccumulator, stream
from interp.claims import Claim, Context, Evidence, Inconclusive, Threshold, difference_evidence, threshold_evidence
from interp.data import PromptSet, shuffled

REPEAT_POSITION_METRICS = ("induction_position", "duplicate_position")


# --------------------------------------------------------------------------- metrics


def _shuffled(ctx: Context, prompts: PromptSet, *, keep_repeats: bool = False) -> PromptSet:
    """The shuffled-token control of `prompts` (seeded by the context). By default the repeat period
    is dropped (`interp.data.shuffled`), since after shuffling the repeats are wherever the tokens
    went; `keep_repeats=True` keeps the original `repeats`, to measure attention to where they *were*."""
    def make():
        control = shuffled(prompts, seed=ctx.seed)
        if keep_repeats:
            control = dataclasses.replace(control, repeats=prompts.repeats)
        return control
    return ctx.cached(("shuffled", prompts, keep_repeats), make)


class NotReinitialised(Inconclusive):
    """No random-init copy of the model: it cannot be copied, or nothing re-initialises some of its parameters
    (`remained`, their names). The random-init control is then not applicable."""

    def __init__(self, message: str, remained: tuple[str, ...] = ()):
        super().__init__(message)
        self.remained = remained

    @classmethod
    def listing(cls, model_name: str, remained: tuple[str, ...]) -> "NotReinitialised":
        shown = ", ".join(remained[:8]) + (f" and {len(remained) - 8} more" if len(remained) > 8 else "")
        return cls(f"nothing re-initialises {len(remained)} parameter(s) of {model_name}: {shown} (no reset_parameters "
                   "on their module, and not a linear, embedding or norm weight); give that module a reset_parameters() "
                   "that initialises them", remained)


@dataclass(frozen=True)
class RandomInit:
    """A randomly initialised copy of a model, and how it was made."""

    model: nn.Module
    how: str  # "config" (our models: rebuilt from the config with a new seed) or "reset" (a deep copy re-initialised)
    n_parameters: int  # parameter tensors re-initialised (tied ones once)


def random_init_model(model: nn.Module, seed: int) -> nn.Module:
    """A randomly initialised model of the same class and shape; the original is untouched.

    Our models (HookedGPT, HookedEncoder) are rebuilt from their config with a new seed, their own initialisation.
    Any other `nn.Module` (a user's model, intercepted by `interp.hook_sdpa` / `hook_attention` or not) is deep-copied
    and every module with parameters of its own re-initialised (`reset_init`). Raises `NotReinitialised`
    (an `Inconclusive`) naming the parameters nothing re-initialised, if any."""
    return random_init(model, seed).model


def random_init(model: nn.Module, seed: int) -> RandomInit:
    """`random_init_model` with how the copy was made."""
    if _rebuilt_from_config(model):
        cfg: Any = model.cfg  # a dataclass with a seed field (_rebuilt_from_config)
        fresh = cast(Callable[[Any], nn.Module], type(model))(dataclasses.replace(cfg, seed=seed))
        parameter = next(model.parameters())
        fresh = fresh.to(device=parameter.device, dtype=parameter.dtype).eval()
        return RandomInit(fresh, "config", len(list(fresh.parameters())))
    try:
        fresh = copy.deepcopy(model)
    except Exception as error:  # a user's module holding something deepcopy refuses (a lock, a file handle)
        raise NotReinitialised(f"cannot copy {type(model).__name__} to re-initialise it ({error})") from None
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        remained = reset_init(fresh)
    if remained:
        raise NotReinitialised.listing(type(model).__name__, remained)
    return RandomInit(fresh.eval(), "reset", len(list(fresh.parameters())))


def _rebuilt_from_config(model: nn.Module) -> bool:
    """Whether `model` is one of the toolkit's own models, rebuilt from a dataclass config with a seed field."""
    cfg = getattr(model, "cfg", None)
    return (type(model).__module__.startswith("interp.models.") and dataclasses.is_dataclass(cfg)
            and not isinstance(cfg, type) and "seed" in {f.name for f in dataclasses.fields(cfg)})


def reset_init(model: nn.Module) -> tuple[str, ...]:
    """Re-initialise `model`'s parameters in place, module by module, from torch's global generator: a module's
    own `reset_parameters()` (or `_reset_parameters()`, nn.MultiheadAttention's), else `torch.nn.init` where its
    own parameters are a linear or embedding weight (2-D `weight`, normal with std 0.02, the GPT-2 / nanoGPT
    initialisation; `bias` zeros, e.g. Hugging Face's Conv1D) or a norm's (a module named `*Norm*` with a 1-D
    `weight`: ones, `bias` zeros). Returns the names of the parameters nothing re-initialised (tied ones once)."""
    done: set[int] = set()
    for module in model.modules():
        own = dict(module.named_parameters(recurse=False))
        if not own:
            continue
        reset = getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
        if callable(reset):
            reset()
        elif not _init_by_kind(module, own):
            continue
        done.update(id(p) for p in own.values())
    return tuple(name for name, p in model.named_parameters() if id(p) not in done)


def _init_by_kind(module: nn.Module, own: dict[str, nn.Parameter]) -> bool:
    """`torch.nn.init` on a module whose own parameters are a linear / embedding / norm weight and bias."""
    weight, bias = own.get("weight"), own.get("bias")
    if weight is None or set(own) - {"weight", "bias"} or (bias is not None and bias.dim() != 1):
        return False
    if weight.dim() == 2:
        nn.init.normal_(weight, std=0.02)
    elif weight.dim() == 1 and "norm" in type(module).__name__.lower():
        nn.init.ones_(weight)
    else:
        return False
    if bias is not None:
        nn.init.zeros_(bias)
    return True


def _random_model(ctx: Context) -> RandomInit:
    """The context's random-init copy, made once per model (a model that has none is also found out once)."""
    def make() -> RandomInit | NotReinitialised:
        try:
            return random_init(ctx.model, ctx.seed + 7919)
        except NotReinitialised as error:
            return error
    made = ctx.cached(("random_init", ctx.model), make)
    if isinstance(made, NotReinitialised):
        raise NotReinitialised(str(made), made.remained)  # a fresh exception: the memoised one keeps no traceback
    return made


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
    (`Repeats.query_mask`: q >= offset + prefix_len, from the prompts' `repeats`) on the key prefix_len - 1 back
    ("induction_position": where the induction target sits in an unshuffled repeat) and prefix_len
    back ("duplicate_position"). Fixed relative offsets: they do not follow the tokens."""
    repeats = ctx.repeats
    if repeats is None or repeats.period is None or repeats.start is None:
        raise Inconclusive("induction_position / duplicate_position need prompts with a known repeat structure (a "
                           "period, from interp.data.repeated_tokens); these prompts have none.")
    prefix_len = repeats.period
    queries = repeats.query_mask(ctx.tokens, ctx.real)  # (batch, query)
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
        values = ctx.cached(("focus", model, prompts),
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
    return ctx.cached(("head_type", head_type, model, prompts), compute)[head_type.column]


def _repeat_scores(ctx: Context, model: nn.Module, prompts: PromptSet, metric: str) -> dict[str, torch.Tensor]:
    def induction():
        try:
            return scores_per_prompt(model, prompts, batch_size=ctx.batch_size)
        except NoRepeats as error:
            raise Inconclusive(f"the prompts lack what an {metric} claim needs: {error}") from None
    return ctx.cached(("induction", model, prompts), induction)


def _repeat_positions(ctx: Context, model: nn.Module, prompts: PromptSet) -> dict[str, torch.Tensor]:
    repeats = prompts.repeats
    if repeats is None or repeats.period is None or repeats.start is None:  # start is None exactly without a period
        raise Inconclusive("induction_position / duplicate_position need prompts with a known repeat structure (a period, "
                           "from interp.data.repeated_tokens); these prompts have none.")
    if repeats.period < 2:
        raise Inconclusive(f"prefix_len={repeats.period}: the induction target would be the query itself; use prefix_len >= 2.")
    if repeats.start >= prompts.n_pos:
        raise Inconclusive(f"prompts of {prompts.n_pos} positions hold no repeat (prefix_len={repeats.period}).")
    return ctx.cached(("repeat_position", model, prompts), lambda: stream(
        model, prompts, reduce_repeat_positions, batch_size=ctx.batch_size, accumulator=PerPromptAccumulator()).result())


def _argmax_at(ctx: Context, model: nn.Module, prompts: PromptSet, offset: str) -> torch.Tensor:
    """(prompt, layer, head) argmax rate at relative offset `offset` (or "first"): `offset_type(offset)`'s
    argmax rate, read off one pass that counts every offset at once."""
    counts = ctx.cached(("argmax", model, prompts),
                        lambda: argmax_offsets_per_prompt(model, prompts, batch_size=ctx.batch_size))
    if offset == "first":
        return counts["first_hits"] / counts["first_count"]
    k = int(offset)
    index = offset_index(prompts.n_pos, k)
    if not 0 <= index < counts["hits"].shape[-1]:
        raise Inconclusive(f"offset {k} does not fit prompts of {prompts.n_pos} positions.")
    return counts["hits"][..., index] / counts["count"][..., index]


# --------------------------------------------------------------------------- evidence functions


def _claim_metric(claim: Claim, ctx: Context) -> str:
    """The name of the metric the claim is judged on (`argmax_at:auto` resolved to the modal offset)."""
    metric = claim.params["metric"]
    if metric == "argmax_at:auto":
        return f"argmax_at:{modal_offset(ctx, *subject(claim))}"
    return metric


def _claim_measure(claim: Claim, ctx: Context) -> str | HeadType:
    """What `head_metric` measures for the claim: its typed head type, else the metric's name."""
    if isinstance(claim.params, HeadTypeParams):
        return claim.params.head_type
    return _claim_metric(claim, ctx)


def modal_offset(ctx: Context, layer: int, head: int) -> str:
    """The relative offset (or "first") where the head's maximum most often sits, pooled over the context's prompts."""
    def compute():
        counts = ctx.cached(("argmax", ctx.model, ctx.prompts),
                            lambda: argmax_offsets_per_prompt(ctx.model, ctx.prompts, batch_size=ctx.batch_size))
        return _modal_offsets(counts, ctx.prompts.n_pos)
    return ctx.cached(("modal_offset", ctx.model, ctx.prompts), compute)[layer][head]


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
            copying = float(ctx.cached(("copying", ctx.model), lambda: copying_scores(ctx.model))[claim.layer, claim.head])
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
    """The metric on a randomly initialised model of the same shape (`random_init_model`): must be below the
    threshold and below the trained model's (paired per prompt). A random model clearing the threshold refutes.
    On a model with no random-init copy (`NotReinitialised`) the control is not applicable (`extra["applicable"]
    = "no"`, what remained in its detail) and counts neither for nor against the claim."""

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        observe = _metric_evidence(claim)
        try:
            made = _random_model(ctx)
        except NotReinitialised as error:
            return Evidence.unmeasured(
                "control_random_init", rule="not applicable", n_prompts=len(ctx.prompts),
                detail=f"not applicable, counted neither way: {error}", extra={
                    "applicable": "no", "not_reinitialised": ", ".join(error.remained)})
        random_model = made.model
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
                        extra={"random_init": level.effect, "initialised_by": made.how}, n_resamples=gap.n_resamples,
                        metric="trained minus random-init", values=gap.values)
