"""The causal evidence for a head claim, measured on a behaviour (`interp.behaviour`):

- necessity: mean-ablating the head raises the behaviour loss more than mean-ablating a
  comparable head (the mean over the other heads of its layer), paired per prompt. The
  behaviour (`resolve_behaviour`) is the one passed to `test_claims` / `scan`, else the model's
  own: for a causal LM the next-token loss on the repeated copies for prompts with a repeat period
  (`prompts.repeats`), otherwise on every position; for an encoder the change of the mean-pooled
  sentence embedding (cosine distance from the clean run). Every causal evidence names it
  (`extra["behaviour"]`, the verdict table's `behaviour` column);
- sufficiency: substituting the idealised pattern recovers the behaviour: fraction of loss
  (the behaviour's value) recovered (L_ablated - L_substituted) / (L_ablated - L_clean), against a threshold of 0.5
  ("most"); Olsson et al. 2022 report about 99% for the previous-token heads of 2-layer
  attention-only models;
- faithfulness: replacing the head's pattern by a uniform one and by its own weights permuted
  among the allowed keys both raise the loss (per prompt, the smaller of the two increases);
  a pattern that can be swapped freely explains nothing.

Limits: necessity compares with the *mean* of the other heads of the layer, so two redundant heads
can each pass while either alone is dispensable (see interp.analyses.redundancy).
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Iterator, Literal, get_args

import numpy as np
import torch
from torch import nn

from interp.analyses.claims.common import claim_head_type, subject
from interp.analyses.head_types import HeadType, TargetBatch, WindowTarget, get_head_type
from interp.analyses.induction import repeat_queries
from interp.behaviour import Behaviour, BehaviourLike, UndefinedOnPrompts, as_behaviour, masked_next_token_loss
from interp.capture import MomentAccumulator, stream
from interp.claims import Claim, Context, Evidence, Inconclusive, difference_evidence, ratio_evidence
from interp.data import PromptSet
from interp.heads import head_label
from interp.hooks import attention_sites
from interp.interventions import HeadAblation, PatternSource, PatternSubstitution
from interp.run import Run


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
    key = spec if spec is None or isinstance(spec, str) else spec
    return ctx.cached(("behaviour", ctx.model, key), lambda: as_behaviour(spec, ctx.model))


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


def claims_run(ctx: Context, behaviour: Behaviour) -> Run:
    """The `interp.Run` the claims' causal evidence asks: the context's model, prompts, batch size and seed,
    one hooked forward per intervention (as `test_claims` has always measured), for `behaviour`."""
    base = ctx.cached(("run",), lambda: Run(ctx.model, ctx.prompts, behaviour=behaviour, batch_size=ctx.batch_size,
                                             seed=ctx.seed, strategy="hooked"))
    return base.with_behaviour(behaviour)


@contextlib.contextmanager
def _defined(behaviour: Behaviour) -> Iterator[None]:
    """A behaviour the prompts cannot define makes the evidence inconclusive, not an error."""
    try:
        yield
    except UndefinedOnPrompts as error:
        raise Inconclusive(f"the prompts cannot define the behaviour {behaviour.name}: {error}") from None


def _clean_loss(ctx: Context, behaviour: Behaviour) -> torch.Tensor:
    with _defined(behaviour):
        return claims_run(ctx, behaviour).clean()


def _intervened_loss(ctx: Context, intervention: Any, behaviour: Behaviour) -> torch.Tensor:
    """The behaviour (prompt,) under one intervention (`HeadAblation`, `PatternSubstitution`), via the Run."""
    with _defined(behaviour):
        return claims_run(ctx, behaviour).values(intervention)


def _ablated_loss(ctx: Context, layer: int, head: int, behaviour: Behaviour) -> torch.Tensor:
    return _intervened_loss(ctx, HeadAblation(((layer, head),), "mean"), behaviour)


def _first_copy_loss(ctx: Context) -> torch.Tensor:
    """The next-token loss on the first copy of repeated prompts: the repeat advantage's baseline."""
    return _clean_loss(ctx, FIRST_COPY_LOSS)


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
        layer, head = subject(claim)
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
                                         "loss_clean": float(clean.mean()), "behaviour": behaviour,
                                         "ablation": "mean"}
        group = [(layer, h) for h in range(len(has_role[layer])) if has_role[layer, h]] if has_role is not None else []
        delta_group: float | None = None  # the role group's loss change, with several heads in the role
        if (layer, head) in group and len(group) > 1:
            together = _intervened_loss(ctx, HeadAblation(tuple(group), "mean"), chosen) - clean
            delta_group = extra["delta_loss_role_group"] = float(together.mean())
        notes = ""
        if _has_period(ctx.prompts) and chosen.name == "next_token_loss":
            # how much of the repeated copies' advantage over the first copy the ablation removes
            first = _first_copy_loss(ctx)
            gap = float(first.mean() - clean.mean())
            if gap > 0:
                extra.update(loss_first_copy=float(first.mean()), advantage_removed=delta_loss / gap)
                notes = f"; removes {extra['advantage_removed']:.0%} of the repeat advantage"
                if delta_group is not None:
                    extra["advantage_removed_role_group"] = delta_group / gap
                    labels = "+".join(map(head_label, group))
                    notes += f", {labels} together {extra['advantage_removed_role_group']:.0%}"
        ev = difference_evidence("necessity", delta, delta_others, ctx, what=f"ablating {claim.label} minus comparable heads",
                                 extra=extra)
        return dataclasses.replace(ev, detail=f"{behaviour}: {ev.detail} (dL {extra['delta_loss']:.4g} vs {against}{notes})")


@dataclass(frozen=True)
class IdealPattern:
    """A head type's idealised pattern (uniform over its target keys), built per batch: a `PatternSource`
    for `interp.PatternSubstitution`."""

    head_type: HeadType
    causal: bool = True

    def spec(self) -> dict[str, Any]:
        return {"ideal": self.head_type.name, "window": getattr(self.head_type.target, "window", None),
                "causal": self.causal}

    def __call__(self, run: Run, batch: PromptSet) -> torch.Tensor:  # (batch, query, key)
        return self.head_type.ideal_pattern(TargetBatch.from_prompts(batch, causal=self.causal))


@dataclass(frozen=True)
class HeadMeanPattern:
    """The head's own (query, key) pattern averaged over the run's prompts (unpadded): a `PatternSource`."""

    layer: int
    head: int

    def spec(self) -> dict[str, Any]:
        return {"mean_pattern": [self.layer, self.head]}

    def __call__(self, run: Run, batch: PromptSet) -> torch.Tensor:  # (query, key)
        def compute() -> torch.Tensor:
            acc = stream(run.model, run.prompts, lambda pattern, _: {"pattern": pattern.float()}, layers=[self.layer],
                         batch_size=run.batch_size, accumulator=MomentAccumulator())
            mean = acc.result()["pattern"]["mean"][0].float()  # (head, query, key)
            return mean / mean.sum(-1, keepdim=True)  # renormalise away float error
        return run.cached(("mean-pattern", self.layer), compute)[self.head]


def ideal_for(claim: Claim, causal: bool = True) -> IdealPattern:
    """The idealised pattern the claim describes: its head type's `ideal_pattern` (uniform over the target keys)."""
    head_type = claim_head_type(claim)
    if head_type is None or head_type.sufficiency is None or claim.params.get("ideal") is None:
        raise Inconclusive(f"claim {claim.name!r} describes no idealised pattern to substitute.")
    window = claim.params.get("window")
    if isinstance(head_type.target, WindowTarget) and window is not None and window != head_type.target.window:
        head_type = dataclasses.replace(head_type, target=WindowTarget(int(window)))
    return IdealPattern(head_type, causal)


def content_pattern(batch: PromptSet, kind: str) -> torch.Tensor:
    """(batch, query, key) ideal pattern of head type `kind` (e.g. induction, duplicate_token) from the
    tokens: uniform over the targets; no target: the first real key."""
    return get_head_type(kind).ideal_pattern(TargetBatch.from_prompts(batch, causal=True))


def _substituted(ctx: Context, claim: Claim, pattern: PatternSource | str | None, behaviour: Behaviour,
                 permute: bool = False) -> torch.Tensor:
    """Behaviour loss with the claim's head's pattern replaced by `pattern` (optionally permuted among keys)."""
    return _intervened_loss(ctx, PatternSubstitution(subject(claim), pattern, permute), behaviour)


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
        layer, head = subject(claim)
        pattern = ideal_for(claim, causal=attention_sites(ctx.model)[layer].causal is not False)
        clean = _clean_loss(ctx, chosen)
        ablated = _ablated_loss(ctx, layer, head, chosen)
        substituted = _substituted(ctx, claim, pattern, chosen)
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
        if ctx.prompts.attention_mask is None:  # padded prompts' positions do not line up: no average pattern
            averaged = _substituted(ctx, claim, HeadMeanPattern(layer, head), chosen)
            extra["recovered_by_mean_pattern"] = float((ablated - averaged).mean() / denominator.mean())
            note = f"; the head's own average pattern recovers {extra['recovered_by_mean_pattern']:.3f}"
        ev = ratio_evidence("sufficiency", ablated - substituted, denominator, claim.thresholds["sufficiency"], ctx,
                            what=f"fraction of loss recovered by the ideal {claim.params.get('ideal')} pattern in {claim.label}",
                            extra=extra)
        return dataclasses.replace(ev, detail=f"{behaviour}: {ev.detail} (L clean {extra['loss_clean']:.4f}, "
                                              f"ablated {extra['loss_ablated']:.4f}, substituted {extra['loss_substituted']:.4f}){note}")


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
        uniform = _substituted(ctx, claim, "uniform", chosen)
        permuted = _substituted(ctx, claim, None, chosen, permute=True)
        d_uniform, d_permuted = uniform - clean, permuted - clean
        effect = torch.minimum(d_uniform, d_permuted)
        ev = difference_evidence("faithfulness", effect, torch.zeros_like(effect), ctx, fail_below=1e-6,
                                 what=f"smaller loss increase when {claim.label}'s pattern is swapped",
                                 extra={"delta_loss_uniform": float(d_uniform.mean()),
                                        "delta_loss_permuted": float(d_permuted.mean()), "behaviour": behaviour})
        note = " (the pattern explains nothing: swapping it leaves the loss unchanged)" if ev.passed is False else ""
        return dataclasses.replace(ev, detail=f"{behaviour}: {ev.detail}; uniform +{float(d_uniform.mean()):.4g}, "
                                              f"permuted +{float(d_permuted.mean()):.4g}{note}")


def _has_period(prompts: PromptSet) -> bool:
    return prompts.repeats is not None and prompts.repeats.period is not None
