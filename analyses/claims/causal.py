"""The causal evidence for a head claim, measured on a behaviour (`interp.behaviour`). Each test
asks about the claimed *role*, not only whether the head matters:

- necessity (`Necessity`): knocking out the attention the role predicts costs more than knocking out
  an equal mass of other attention. The targeted knockout (`interp.interventions.AttentionKnockout`)
  removes the head's weight on the role's target keys (`RoleTargets`: the head type's target mask,
  where its ideal pattern is > 0 minus the no-target fallback; a positional claim: the key at its
  offset) and renormalises each row over the rest; a row left with under `NEAR_ZERO_REMAINDER`
  instead moves its mass to the head's mean off-target pattern over the prompts (never dividing by a
  near-zero remainder). The control takes the same mass per row from non-target keys (emptied in a
  random order seeded per prompt; what a row cannot match, from the prompt's other rows), moved the
  same way. Evidence: per prompt dL(targeted) - dL(control), CI above 0 and mean above the
  behaviour's practical minimum (`interp.claims.min_effect`).
  When the head puts no attention outside the targets no control exists: "inconclusive: no control".
  The whole-head mean-ablation cost stays in `extra["delta_loss"]`, not judged;
- sufficiency (`Sufficiency`): substituting the idealised pattern recovers the behaviour: fraction of
  loss recovered (L_ablated - L_substituted) / (L_ablated - L_clean), whole-head mean ablation,
  against a threshold of 0.5 ("most": the toolkit's convention). Tautology guard: when the real
  pattern's mean L1 distance per query to the ideal is under `TAUTOLOGY_TOLERANCE` the substitution
  changes nothing, and the evidence is "not informative" (undecided, `extra["informative"] = "no"`,
  which `interp.claims.decide` counts neither for nor against the claim);
- faithfulness (`Faithfulness`): the claim's own ideal reproduces the effect of the attention it
  describes: 1 - (L_ideal - L_clean) / (L_knocked - L_clean), L_knocked the costlier of the targeted
  knockout and the whole-head mean ablation (`extra["knocked_out"]` says which), ratio of
  means with a bootstrap CI against 0.5 (`FAITHFULNESS`, the toolkit's convention). A false role's
  ideal moves the attention elsewhere and reproduces little. The same tautology guard as sufficiency
  applies (an ideal equal to the real pattern reproduces everything by construction).

The behaviour (`resolve_behaviour`) is the one passed to `test_claims` / `scan`, else the model's
own: for a causal LM the next-token loss at the repeated positions (`prompts.repeats.query_mask`: the
repeated copies of prompts with a period, right after a repeated n-gram for natural repeats), otherwise on
every position; for an encoder the change of the mean-pooled
sentence embedding (cosine distance from the clean run). Every causal evidence names it
(`extra["behaviour"]`, the verdict table's `behaviour` column).

Overlapping roles: targets can contain one another. A local_window claim's targets (|q - k| <= 3)
contain the previous, current and next token, so on a previous-token head a local_window claim
knocks out the previous-token attention too and passes necessity (MiniLM L0H2: 0.0072 cosine
distance, as the previous-token claim's 0.0068); necessity tells a role from an unrelated one, not
a role from a wider role that contains it (faithfulness and sufficiency, whose ideal is uniform over
the window, can).

Limits: a head that attends almost only to its targets leaves the control little mass to move (the
detail says how much it matched); necessity then reads "the targets' attention matters", and a
wider role containing the targets passes as well (above). A false role whose few targets carry
some of a concentrated head's signal can pass necessity with a small effect (toy-induction L0H2,
self_token: 0.036 nats against the previous-token role's 6.6); the observational test refutes it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterator, Literal, get_args

import torch

from interp.analyses.circuits.power import WriteChange, ablation_write_changes
from interp.analyses.claims.common import PositionalParams, claim_head_type, subject, with_power
from interp.analyses.head_types import HeadType, TargetBatch, WindowTarget, get_head_type, offset_type
from interp.behaviour import (
    Behaviour,
    BehaviourLike,
    UndefinedOnPrompts,
    as_behaviour,
    next_token_description,
    next_token_mask,
)
from interp.capture import MomentAccumulator, stream
from interp.claims import (
    Claim,
    Context,
    Evidence,
    Inconclusive,
    Threshold,
    difference_evidence,
    min_effect,
    ratio_evidence,
)
from interp.data import PromptSet
from interp.hooks import attention_sites
from interp.interventions import (
    NEAR_ZERO_REMAINDER,
    AttentionKnockout,
    HeadAblation,
    PatternSource,
    PatternSubstitution,
)
from interp.models.gpt import masked_next_token_loss
from interp.paths import Node
from interp.run import Run, Strategy

Part = Literal["behaviour", "first_copy"]


def behaviour_mask(prompts: PromptSet, part: Part = "behaviour") -> tuple[torch.Tensor, str]:
    """(prompt, pos - 1) bool over next-token predictions (query q predicts token q + 1), and its name.

    part="behaviour": the default next-token loss's predictions, `interp.behaviour.next_token_mask(prompts,
    "auto")`: those whose query is a repeated position (`prompts.repeats.query_mask`: the second and later
    copies of prompts with a repeat period, right after a repeated n-gram for natural repeats), or every
    prediction of a real token without a repeat structure. part="first_copy": the predictions inside the
    first copy of prompts with a period (q = offset .. offset + prefix_len - 2), where nothing repeats yet:
    the baseline against which the repeated copies' loss advantage is measured.
    Inconclusive where the prompts cannot define the part.
    """
    if part not in get_args(Part):
        raise ValueError(f"part={part!r}; expected one of {list(get_args(Part))}.")
    repeats = prompts.repeats
    if part == "behaviour":
        try:
            return next_token_mask(prompts, "auto"), next_token_description(prompts, "auto")
        except UndefinedOnPrompts as error:
            raise Inconclusive(str(error)) from None
    if repeats is None or repeats.period is None or repeats.start is None:  # start is None exactly without a period
        raise Inconclusive("the prompts have no repeated copy (no meta prefix_len), so no first-copy baseline.")
    n, offset, prefix_len, start = prompts.n_pos, repeats.offset, repeats.period, repeats.start
    if start > n - 2:
        raise Inconclusive(f"prompts of {n} positions have no repeated copy to predict (prefix_len={prefix_len}).")
    query = torch.arange(n - 1)
    mask = next_token_mask(prompts, "all")
    return mask & (query >= offset) & (query <= start - 2), "next-token loss on the first copy"


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
    return masked_next_token_loss(logits, prompts.tokens, behaviour_mask(prompts, "first_copy")[0])


FIRST_COPY_LOSS = Behaviour("next_token_loss", "logits", _first_copy, description="next-token loss on the first copy",
                            unit="nats", params=(("positions", "first_copy"),))


def claims_run(ctx: Context, behaviour: Behaviour) -> Run:
    """The `interp.Run` the claims' causal evidence asks, for `behaviour`: the context's (`test_claims(run, ...)`'s,
    or the one `test_claims(model, ...)` built), else, for a context made by hand, one built once on its model,
    prompts, batch size and seed, one hooked forward per intervention (as `test_claims` has always measured)."""
    if ctx.run is None:
        ctx.run = Run(ctx.model, ctx.prompts, behaviour=behaviour, batch_size=ctx.batch_size, seed=ctx.seed,
                      strategy=Strategy.HOOKED)
    run: Run = ctx.run
    return run.with_behaviour(behaviour)


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


def _mean_ablation_power(ctx: Context, behaviour: Behaviour, layer: int, head: int) -> WriteChange | None:
    """How much the whole-head mean ablation changes the head's write (`interp.analyses.circuits.power`; None on a model
    without a graph): a head writing the same on every prompt is not changed by it."""
    changes = ablation_write_changes(claims_run(ctx, behaviour), HeadAblation(((layer, head),), "mean"))
    return changes.get(Node(layer, "head", head))


def _first_copy_loss(ctx: Context) -> torch.Tensor:
    """The next-token loss on the first copy of repeated prompts: the repeat advantage's baseline."""
    return _clean_loss(ctx, FIRST_COPY_LOSS)


# A real pattern closer to the ideal than this (mean L1 distance per query, out of at most 2) makes
# substituting the ideal a near no-op: the substituted run is the clean run, so "the ideal recovers
# the behaviour" holds by construction and tests nothing. 0.05 moves at most 2.5% of a query's attention.
TAUTOLOGY_TOLERANCE = 0.05
# The control could match less than this share of the target mass: it is nearly no perturbation, and
# the detail says so (the head attends almost only to the targets).
WEAK_CONTROL = 0.5
# When the head matters as a whole (its mean ablation costs the practical minimum), knocking out the
# claimed attention must cost at least this fraction of that: the role carries most of what the head
# does. A false role on an important head can put a little mass on keys that matter (a self-token head's
# 8% on the previous token) and beat an equal-mass control, yet explain a few percent of the head.
ROLE_SHARE = Threshold(0.5, "toolkit convention: the claimed attention carries most of the head's effect")
# The faithfulness threshold when a claim carries none: the toolkit's convention, not a paper's.
FAITHFULNESS = Threshold(0.5, "toolkit convention: the ideal reproduces most of the effect of the attention it describes")


def role_type(claim: Claim, ctx: Context) -> HeadType:
    """The head type whose targets the claim names: its own (with the claim's window), or for a positional
    claim the offset's type (`offset_type`; offset None: the modal offset of the context's prompts)."""
    from interp.analyses.claims.evidence import modal_offset

    if isinstance(claim.params, PositionalParams):
        offset = claim.params.offset if claim.params.offset is not None else modal_offset(ctx, *subject(claim))
        return offset_type(offset)
    head_type = claim_head_type(claim)
    if head_type is None:
        raise Inconclusive(f"claim {claim.name!r} names no head type, so no target keys to knock out.")
    window = claim.params.get("window")
    if isinstance(head_type.target, WindowTarget) and window is not None and window != head_type.target.window:
        head_type = dataclasses.replace(head_type, target=WindowTarget(int(window)))
    return head_type


@dataclass(frozen=True)
class RoleTargets:
    """A head type's target keys per batch, (batch, query, key) bool: a `TargetSource` for
    `interp.interventions.AttentionKnockout`. Only the true targets: the ideal pattern's fallback key
    (a query without a target attends to the first key or itself) is not part of the claimed role."""

    head_type: HeadType
    causal: bool = True

    def spec(self) -> dict[str, Any]:
        target = self.head_type.target
        return {"targets": self.head_type.name, "target": getattr(target, "__qualname__", repr(target)),
                "causal": self.causal}

    def __call__(self, run: Run, batch: PromptSet) -> torch.Tensor:  # (batch, query, key)
        return self.head_type.mask(TargetBatch.from_prompts(batch, causal=self.causal))


def _causal(ctx: Context, layer: int) -> bool:
    return attention_sites(ctx.model)[layer].causal is not False


def pattern_stats(ctx: Context, behaviour: Behaviour, layer: int, head: int, head_type: HeadType) -> dict[str, torch.Tensor]:
    """Per prompt (prompt,), from the head's clean pattern on the prompts the model reads: `target` and
    `matched` (attention mass on the target keys summed over queries, and the part of it an equal-mass
    control can take from the prompt's non-target attention), `queries` (the scored queries), `near_all` (share of queries with target mass left under
    `NEAR_ZERO_REMAINDER`, whose knockout moves the mass to the mean off-target pattern), `l1` (mean L1
    distance per scored query between the pattern and the type's ideal)."""
    def reduce(pattern: torch.Tensor, bctx: Any) -> dict[str, torch.Tensor]:  # (batch, head, query, key)
        batch = TargetBatch.from_context(bctx)
        own = pattern[:, head].float()  # (batch, query, key)
        target = head_type.mask(batch)
        others = batch.allowed & ~target
        on = (own * target).sum(-1) * others.any(-1)  # (batch, query): mass a knockout can move (not a lone key's)
        off = (own * others).sum(-1)
        scored = batch.scored.float()
        l1 = ((own - head_type.ideal_pattern(batch)).abs().sum(-1) * scored).sum(-1) / scored.sum(-1).clamp(min=1)
        has = (on > 0).float()
        near_all = ((on > 1 - NEAR_ZERO_REMAINDER).float() * has).sum(-1) / has.sum(-1).clamp(min=1)
        return {name: value[:, None] for name, value in
                {"target": on.sum(-1), "matched": on.sum(-1).minimum(off.sum(-1)), "queries": scored.sum(-1),
                 "near_all": near_all, "l1": l1}.items()}

    def compute() -> dict[str, torch.Tensor]:
        prompts = behaviour.model_prompts(ctx.prompts)
        result = stream(ctx.model, prompts, reduce, layers=[layer], batch_size=ctx.batch_size).result()
        return {name: value[:, 0, 0].double() for name, value in result.items()}  # (prompt, layer, 1) -> (prompt,)
    return ctx.cached(("pattern-stats", ctx.model, ctx.prompts, behaviour, layer, head, RoleTargets(head_type).spec()["target"],
                       head_type.name), compute)


@dataclass(frozen=True)
class Necessity:
    """Knocking out the attention the claim predicts costs more than knocking out an equal mass of other
    attention: per prompt, dL(targeted knockout) - dL(control), paired, against the behaviour's practical
    minimum (`interp.claims.min_effect`). The targeted knockout (`interp.interventions.AttentionKnockout`)
    removes the head's weight on the role's target keys (`RoleTargets`; a positional claim: the offset's
    key) and renormalises over the rest; rows left with almost nothing move the mass to the head's mean
    off-target pattern instead. The control takes the same mass from non-target keys (seeded per prompt;
    per row, and what a row cannot match from the prompt's other rows), moved the same way; when the head attends almost only to its targets the control can match little
    mass and the detail says so; when no non-target attention exists at all, no control can be built
    and the evidence is inconclusive. A false role on an important head puts little mass on its
    targets, so its knockout costs about as much as the control, and fails. The old whole-head mean
    ablation cost is kept as `extra["delta_loss"]`, not judged. The loss is the `behaviour`'s value
    (`resolve_behaviour`: this field, else the test's, else the model's)."""

    behaviour: BehaviourLike = dataclasses.field(default=None, compare=False)

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        chosen = resolve_behaviour(ctx, self.behaviour)
        behaviour = behaviour_text(ctx, chosen)
        layer, head = subject(claim)
        head_type = role_type(claim, ctx)
        targets = RoleTargets(head_type, _causal(ctx, layer))
        clean = _clean_loss(ctx, chosen)
        stats = pattern_stats(ctx, chosen, layer, head, head_type)
        target_mass, matched = float(stats["target"].sum()), float(stats["matched"].sum())
        whole = _ablated_loss(ctx, layer, head, chosen) - clean  # (prompt,)
        delta_loss = float(whole.mean())
        extra: dict[str, float | str] = {"delta_loss": delta_loss, "loss_clean": float(clean.mean()), "behaviour": behaviour,
                                         "target_mass": float((stats["target"] / stats["queries"].clamp(min=1)).mean()),
                                         "control_mass_matched": matched / target_mass if target_mass > 0 else math.nan,
                                         "rows_moved_to_mean": float(stats["near_all"].mean()),
                                         "knockout": "targeted vs equal-mass control, renormalised",
                                         "ablation": "attention knockout"}  # the report's ablation column
        rule = f"CI > 0 and effect >= {min_effect(chosen.unit):g} {chosen.unit}"
        if target_mass > 0 and matched <= 0:
            return Evidence.unmeasured("necessity", rule=rule, n_prompts=len(clean), extra=extra, detail=(
                f"{behaviour}: inconclusive: no control: {claim.label} puts no attention outside the {head_type.name} "
                "targets, so no equal mass of other attention can be knocked out to compare with"))
        targeted = _intervened_loss(ctx, AttentionKnockout((layer, head), targets), chosen) - clean  # (prompt,)
        control = _intervened_loss(ctx, AttentionKnockout((layer, head), targets, control=True), chosen) - clean
        extra.update(delta_loss_targeted=float(targeted.mean()), delta_loss_control=float(control.mean()))
        notes = self._repeat_notes(ctx, chosen, clean, float(targeted.mean()), extra)
        floor = min_effect(chosen.unit)
        if max(abs(delta_loss), float(targeted.mean().abs()), float(control.mean().abs())) < floor:
            notes += f"; no effect: neither knockout nor ablating the whole head moves the behaviour by {floor:g} {chosen.unit}"
        if target_mass > 0 and matched < WEAK_CONTROL * target_mass:
            notes += (f"; the control matched only {matched / target_mass:.0%} of the target mass ({claim.label} attends "
                      "almost only to its targets), so the comparison is nearly with no change")
        ev = difference_evidence("necessity", targeted, control, ctx, min_effect=min_effect(chosen.unit), unit=chosen.unit,
                                 what=f"knocking out {claim.label}'s {head_type.name} attention minus an equal mass of other "
                                      "attention", extra=extra)
        ev = _with_role_share(ev, claim, ctx, targeted, whole, floor)
        return dataclasses.replace(ev, detail=(
            f"{behaviour}: {ev.detail} (targeted dL {extra['delta_loss_targeted']:.4g}, control "
            f"{extra['delta_loss_control']:.4g}, mean mass on the targets {extra['target_mass']:.3g} per query; whole-head "
            f"ablation dL {delta_loss:.4g}{notes})"))

    @staticmethod
    def _repeat_notes(ctx: Context, chosen: Behaviour, clean: torch.Tensor, delta: float,
                      extra: dict[str, float | str]) -> str:
        """How much of the repeated copies' advantage over the first copy the targeted knockout removes."""
        if not (_has_period(ctx.prompts) and chosen.name == "next_token_loss"):
            return ""
        first = _first_copy_loss(ctx)
        gap = float(first.mean() - clean.mean())
        if gap <= 0:
            return ""
        extra.update(loss_first_copy=float(first.mean()), advantage_removed=delta / gap)
        return f"; the targeted knockout removes {extra['advantage_removed']:.0%} of the repeat advantage"


def _with_role_share(ev: Evidence, claim: Claim, ctx: Context, targeted: torch.Tensor, whole: torch.Tensor,
                     floor: float) -> Evidence:
    """Necessity also needs the targeted knockout to cost `ROLE_SHARE` of the whole-head ablation, when
    that ablation costs at least `floor` (a head that barely matters as a whole, e.g. a sink whose output is
    near-constant, is judged on the knockout alone). Either requirement failing fails necessity."""
    if float(whole.mean()) < floor:
        return ev
    share = ratio_evidence("necessity", targeted, whole, ROLE_SHARE, ctx, label="role-share",
                           what=f"share of {claim.label}'s whole-head ablation cost that its claimed attention carries")
    passed = False if False in (ev.passed, share.passed) else None if None in (ev.passed, share.passed) else True
    return dataclasses.replace(ev, passed=passed, p_value=max(ev.p_value, share.p_value),
                               rule=f"{ev.rule}; role share {ROLE_SHARE.rule()}", detail=f"{ev.detail}; {share.detail}",
                               extra={**ev.extra, "role_share": share.effect})


@dataclass(frozen=True)
class IdealPatternSource:
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


def ideal_for(claim: Claim, causal: bool = True) -> IdealPatternSource:
    """The idealised pattern the claim describes: its head type's `ideal_pattern` (uniform over the target keys)."""
    head_type = claim_head_type(claim)
    if head_type is None or head_type.sufficiency is None or claim.params.get("ideal") is None:
        raise Inconclusive(f"claim {claim.name!r} describes no idealised pattern to substitute.")
    window = claim.params.get("window")
    if isinstance(head_type.target, WindowTarget) and window is not None and window != head_type.target.window:
        head_type = dataclasses.replace(head_type, target=WindowTarget(int(window)))
    return IdealPatternSource(head_type, causal)


def content_pattern(batch: PromptSet, kind: str) -> torch.Tensor:
    """(batch, query, key) ideal pattern of head type `kind` (e.g. induction, duplicate_token) from the
    tokens: uniform over the targets; no target: the first real key."""
    return get_head_type(kind).ideal_pattern(TargetBatch.from_prompts(batch, causal=True))


def _substituted(ctx: Context, claim: Claim, pattern: PatternSource | str | None, behaviour: Behaviour) -> torch.Tensor:
    """Behaviour loss with the claim's head's pattern replaced by `pattern`."""
    return _intervened_loss(ctx, PatternSubstitution(subject(claim), pattern), behaviour)


def _not_informative(ev: Evidence, distance: float, detail: str) -> Evidence:
    """The tautology guard's outcome: undecided, saying why, and marked `extra["informative"] = "no"`
    so a verdict can leave it out of the support it counts."""
    return dataclasses.replace(ev, passed=None, extra={**ev.extra, "informative": "no"}, detail=(
        f"not informative: the pattern already is the ideal (mean L1 distance per query {distance:.4f} < "
        f"{TAUTOLOGY_TOLERANCE:g}), {detail}"))


@dataclass(frozen=True)
class Sufficiency:
    """Substituting the idealised pattern recovers the behaviour: fraction of loss recovered
    (L_ablated - L_substituted) / (L_ablated - L_clean), against the claim's sufficiency threshold
    (whole-head mean ablation).

    Tautology guard: beside it, the mean L1 distance per query between the head's real pattern and the
    ideal (`extra["ideal_distance"]`). Below `TAUTOLOGY_TOLERANCE` the substitution barely changes the
    run, so the fraction recovered is ~1 by construction: the evidence is undecided (passed None), "not
    informative: the pattern already is the ideal", and does not count as support.

    Beside it too (extra `recovered_by_mean_pattern`, not judged): the fraction recovered by the head's
    own average pattern over the prompts, a content-free version of what it really does. When the
    idealised pattern fails but the average one recovers, the head's role is positional but not the
    exact one the claim describes (e.g. a 'previous-token' head whose readers need its mix of
    previous, current and earlier tokens).

    Power (`write_change`): how much the mean ablation changes the head's write; a head writing the same on every
    prompt is not changed by it (the mean of a constant is the constant), so the fraction is undefined and the
    evidence says why (`interp.analyses.circuits.power`)."""

    behaviour: BehaviourLike = dataclasses.field(default=None, compare=False)

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        chosen = resolve_behaviour(ctx, self.behaviour)
        behaviour = behaviour_text(ctx, chosen)
        layer, head = subject(claim)
        pattern = ideal_for(claim, causal=_causal(ctx, layer))
        clean = _clean_loss(ctx, chosen)
        ablated = _ablated_loss(ctx, layer, head, chosen)
        substituted = _substituted(ctx, claim, pattern, chosen)
        denominator = ablated - clean
        distance = float(pattern_stats(ctx, chosen, layer, head, pattern.head_type)["l1"].mean())
        extra: dict[str, float | str] = {"loss_clean": float(clean.mean()), "loss_ablated": float(ablated.mean()),
                                         "loss_substituted": float(substituted.mean()), "ideal_distance": distance,
                                         "behaviour": behaviour, "ablation": "mean"}
        scale = max(float(clean.mean().abs()), 1e-3)
        power = _mean_ablation_power(ctx, chosen, layer, head)
        if float(denominator.mean()) <= 1e-3 * scale:
            return with_power(Evidence.unmeasured(
                "sufficiency", rule=claim.thresholds["sufficiency"].rule(), n_prompts=len(clean), extra=extra,
                detail=f"{behaviour}: ablating {claim.label} does not raise the loss (dL = {float(denominator.mean()):.3g}), "
                       "so the fraction recovered is undefined"), power)
        note = ""
        if ctx.prompts.attention_mask is None:  # padded prompts' positions do not line up: no average pattern
            averaged = _substituted(ctx, claim, HeadMeanPattern(layer, head), chosen)
            extra["recovered_by_mean_pattern"] = float((ablated - averaged).mean() / denominator.mean())
            note = f"; the head's own average pattern recovers {extra['recovered_by_mean_pattern']:.3f}"
        ev = ratio_evidence("sufficiency", ablated - substituted, denominator, claim.thresholds["sufficiency"], ctx,
                            what=f"fraction of loss recovered by the ideal {claim.params.get('ideal')} pattern in {claim.label}",
                            extra=extra)
        detail = (f"{behaviour}: {ev.detail} (L clean {extra['loss_clean']:.4f}, ablated {extra['loss_ablated']:.4f}, "
                  f"substituted {extra['loss_substituted']:.4f}; mean L1 distance per query to the ideal {distance:.4f}){note}")
        if distance < TAUTOLOGY_TOLERANCE:
            return with_power(_not_informative(ev, distance, f"so substituting it changes nothing; {detail}"), power)
        return with_power(dataclasses.replace(ev, detail=detail), power)


@dataclass(frozen=True)
class Faithfulness:
    """The claim's own ideal pattern reproduces the effect of the attention it describes:
    faithfulness = 1 - (L_ideal - L_clean) / (L_knocked - L_clean)
                 = (L_knocked - L_ideal) / (L_knocked - L_clean), a ratio of means over prompts with a bootstrap CI (`ratio_evidence`), against the claim's
    faithfulness threshold (default `FAITHFULNESS`, 0.5: the toolkit's convention).

    L_knocked is the costlier (on average) of the targeted knockout of `Necessity` (the role's target
    attention removed) and the whole head's mean ablation (`extra["knocked_out"]` says which): a false
    role's targets get little attention, so its targeted knockout is nearly free and the whole-head
    ablation is used, never a near-zero denominator. A false role's ideal sends the head's attention
    elsewhere, so L_ideal is about L_knocked or above and faithfulness is about 0 or below: it fails.
    When neither costs the practical minimum (`min_effect`) there is no effect to reproduce: inconclusive.
    The loss increase with a uniform pattern is kept as `extra["delta_loss_uniform"]`.
    Tautology guard as in `Sufficiency`: a real pattern within `TAUTOLOGY_TOLERANCE` of the ideal makes
    the evidence "not informative" (undecided)."""

    behaviour: BehaviourLike = dataclasses.field(default=None, compare=False)

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        chosen = resolve_behaviour(ctx, self.behaviour)
        behaviour = behaviour_text(ctx, chosen)
        layer, head = subject(claim)
        ideal = ideal_for(claim, causal=_causal(ctx, layer))
        threshold = claim.thresholds.get("faithfulness", FAITHFULNESS)
        clean = _clean_loss(ctx, chosen)
        knocked, which = self._knocked(claim, ctx, chosen, clean)
        with_ideal = _substituted(ctx, claim, ideal, chosen)
        uniform = _substituted(ctx, claim, "uniform", chosen)
        extra: dict[str, float | str] = {"loss_clean": float(clean.mean()), "loss_ideal": float(with_ideal.mean()),
                                         "loss_knocked_out": float(knocked.mean()), "knocked_out": which,
                                         "delta_loss_uniform": float((uniform - clean).mean()), "behaviour": behaviour,
                                         "ablation": "attention knockout" if which == "targeted knockout" else "mean"}
        if which == "nothing":
            return Evidence.unmeasured("faithfulness", rule=threshold.rule(), n_prompts=len(clean), extra=extra, detail=(
                f"{behaviour}: inconclusive: no effect: neither knocking out {claim.label}'s {ideal.head_type.name} attention "
                f"nor ablating the head costs {min_effect(chosen.unit):g} {chosen.unit}, so there is no effect to reproduce"))
        distance = extra["ideal_distance"] = float(pattern_stats(ctx, chosen, layer, head, ideal.head_type)["l1"].mean())
        ev = ratio_evidence("faithfulness", knocked - with_ideal, knocked - clean, threshold, ctx,
                            what=f"share of the {which} effect the ideal {ideal.head_type.ideal_name} pattern reproduces in "
                                 f"{claim.label}", extra=extra)
        detail = (f"{behaviour}: {ev.detail} (L clean {extra['loss_clean']:.4g}, ideal {extra['loss_ideal']:.4g}, {which} "
                  f"{extra['loss_knocked_out']:.4g}; uniform pattern +{extra['delta_loss_uniform']:.4g}; mean L1 distance "
                  f"per query to the ideal {distance:.4f})")
        if distance < TAUTOLOGY_TOLERANCE:  # the ideal is the real pattern: it reproduces everything by construction
            return _not_informative(ev, distance, detail)
        return dataclasses.replace(ev, detail=detail)

    @staticmethod
    def _knocked(claim: Claim, ctx: Context, chosen: Behaviour, clean: torch.Tensor) -> tuple[torch.Tensor, str]:
        """The knocked-out loss (prompt,) and which knockout: of the targeted knockout and the whole head's
        mean ablation, the one that costs more on average (the head's effect as the stronger one shows it,
        so a false role's near-free knockout never makes a near-zero denominator); "nothing" when neither
        costs the practical minimum."""
        layer, head = subject(claim)
        targets = RoleTargets(role_type(claim, ctx), _causal(ctx, layer))
        targeted = _intervened_loss(ctx, AttentionKnockout((layer, head), targets), chosen)
        ablated = _ablated_loss(ctx, layer, head, chosen)
        knocked, which = ((targeted, "targeted knockout") if float(targeted.mean()) >= float(ablated.mean())
                          else (ablated, "whole-head ablation"))
        if float((knocked - clean).mean()) < max(min_effect(chosen.unit), 1e-9):
            return knocked, "nothing"
        return knocked, which


def _has_period(prompts: PromptSet) -> bool:
    return prompts.repeats is not None and prompts.repeats.period is not None
