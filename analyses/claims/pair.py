"""Claims about pairs of heads (and "dispensable" about one), tested by ablation: `redundant_claim(a, b)`
(together much more than apart), `dispensable_claim(a)` (cheap alone), `backup_claim(a, b)` (A's direct
contribution rises when B is ablated), and `redundancy_claims`, which tests a batch of them.

`interp.claims` objects, tested with `interp.claims.test_claims`; their evidence is read from
`interp.Run` effects (one Run per claim context and behaviour) and `interp.analyses.redundancy.compensation`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd
import torch
from torch import nn

from interp.ablation import resumable
from interp.analyses.circuits.power import WriteChange, ablation_write_changes
from interp.analyses.claims.common import weakest, with_power
from interp.analyses.redundancy.common import DEFAULT_MARGIN, MARGIN_SOURCE, _check_n, _parse_pairs, redundancy_run
from interp.analyses.redundancy.interaction import compensation
from interp.behaviour import BehaviourLike
from interp.claims import (
    MIN_EFFECT,
    Claim,
    Context,
    Evidence,
    Threshold,
    difference_evidence,
    min_effect,
    ratio_evidence,
    test_claims,
    threshold_evidence,
)
from interp.data import PromptSet
from interp.heads import HeadLike, head_label, parse_head
from interp.interventions import AblationKind, HeadAblation, check_heads
from interp.run import Run
from interp.validate import check_head_pair, check_inputs


def pair_run(ctx: Context, behaviour: BehaviourLike, batch_size: int) -> Run:
    """The `interp.Run` pair claims measure with, for the claim's behaviour (else the test's: `ctx.behaviour`; by
    default the model's own as `interp.Run` measures it, as `importance`): the context's Run (`test_claims`'),
    else, for a context made by hand, one on its model and prompts with `batch_size`."""
    chosen = behaviour if behaviour is not None else ctx.behaviour
    if ctx.run is not None:  # test_claims' Run (the user's, or the one it built): its memo keeps every effect
        _check_n(ctx.run.prompts)
        run: Run = ctx.run.with_behaviour(chosen)
        return run
    return ctx.cached(("pair-run", chosen, batch_size), lambda: redundancy_run(
        ctx.model, ctx.prompts, "pair claims", behaviour=chosen, batch_size=batch_size, seed=ctx.seed))


@dataclass(frozen=True)
class _AblationDeltas:
    """Evidence gatherer base: per-prompt loss changes of ablating head sets, as `Run.effect`s."""

    method: AblationKind = "mean"
    batch_size: int = 16
    behaviour: BehaviourLike = field(default=None, compare=False)  # what the loss is; default: the model's own

    def named(self, ctx: Context, **extra) -> dict:
        """Evidence extras, with the behaviour measured (the verdict table's `behaviour` column)."""
        return {**extra, "behaviour": pair_run(ctx, self.behaviour, self.batch_size).behaviour.describe(ctx.prompts)}

    def deltas(self, ctx: Context, head_sets: Sequence[tuple[tuple[int, int], ...]]) -> list[torch.Tensor]:
        run = pair_run(ctx, self.behaviour, self.batch_size)
        return [e.values for e in run.effects([HeadAblation(tuple(sorted(heads)), self.method) for heads in head_sets])]

    def power(self, ctx: Context, heads: Sequence[tuple[int, int]]) -> WriteChange | None:
        """The ablated head whose write the ablation changes least (`common.weakest`): a head whose write is the same
        on every prompt is not changed by mean or resample ablation, so an effect of 0 tests nothing. Each head's
        change alone is its change in any set (the ablation replaces its own z whatever else is ablated)."""
        run = pair_run(ctx, self.behaviour, self.batch_size)
        return weakest(change for head in sorted(set(heads))
                       for change in ablation_write_changes(run, HeadAblation((head,), self.method)).values())


@dataclass(frozen=True)
class _Superadditive(_AblationDeltas):
    """observational: the pair costs more together than the sum of each alone (interaction), by at least the
    practical minimum of the behaviour's unit, with a CI."""

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        a, b = claim.heads
        delta_a, delta_b, both = self.deltas(ctx, [(a,), (b,), (a, b)])
        unit = pair_run(ctx, self.behaviour, self.batch_size).behaviour.unit
        ev = difference_evidence("observational", both, delta_a + delta_b, ctx, margin=0.0, decisive=True,
                                 min_effect=min_effect(unit), unit=unit,
                                 what=f"interaction delta({claim.label}) - delta({head_label(a)}) - delta({head_label(b)})",
                                 extra=self.named(ctx, delta_a=float(delta_a.mean()), delta_b=float(delta_b.mean()),
                                                  delta_both=float(both.mean())))
        return with_power(ev, self.power(ctx, (a, b)))


@dataclass(frozen=True)
class _EachAloneLess(_AblationDeltas):
    """necessity: ablating both costs clearly more than the costlier of the two alone (per prompt), by at least
    the practical minimum, with a CI: each can stand in for the other."""

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        a, b = claim.heads
        delta_a, delta_b, both = self.deltas(ctx, [(a,), (b,), (a, b)])
        unit = pair_run(ctx, self.behaviour, self.batch_size).behaviour.unit
        ev = difference_evidence("necessity", both, torch.maximum(delta_a, delta_b), ctx, margin=0.0, decisive=True,
                                 min_effect=min_effect(unit), unit=unit,
                                 what=f"delta({claim.label}) - the larger of delta({head_label(a)}), delta({head_label(b)})",
                                 extra=self.named(ctx))
        return with_power(ev, self.power(ctx, (a, b)))


@dataclass(frozen=True)
class _Cheap(_AblationDeltas):
    """observational: ablating the head alone costs less than the margin."""

    margin: float = DEFAULT_MARGIN

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        (delta,) = self.deltas(ctx, [tuple(claim.heads)])
        ev = threshold_evidence("observational", delta, Threshold(self.margin, MARGIN_SOURCE, "below"), ctx,
                                what=f"loss change ablating {claim.label}", decisive=True, extra=self.named(ctx))
        return with_power(ev, self.power(ctx, claim.heads))


BACKUP_FRACTION_SOURCE = ("a backup's response must make up at least this fraction of what the ablated head's loss "
                          "would be without it (toolkit convention, interp.claims.MIN_EFFECT['fraction'])")


@dataclass(frozen=True)
class _DirectBackup:
    """Backup evidence from `compensation` with B ablated, in the behaviour's unit on one baseline (the
    B-ablated run): the rise of A's direct contribution = the behaviour change of putting A's clean write
    back in place of its new one. "observational": the rise clears the practical minimum (CI);
    "necessity": it recovers at least `MIN_EFFECT["fraction"]` of B's effect with A's response frozen."""

    kind: str = "observational"
    method: AblationKind = "mean"
    batch_size: int = 16
    behaviour: BehaviourLike = field(default=None, compare=False)

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        a, b = claim.heads
        if a[0] <= b[0]:
            return Evidence.unmeasured(self.kind, rule="A after B", passed=False, decisive=True, n_prompts=len(ctx.prompts),
                                       detail=f"{head_label(a)} (layer {a[0]}) is not in a later layer than {head_label(b)} "
                                              f"(layer {b[0]}), so it cannot respond to {head_label(b)}'s ablation")
        run = pair_run(ctx, self.behaviour, self.batch_size)
        unit, named = run.behaviour.unit, {"behaviour": run.behaviour.describe(run.prompts), "ablation": self.method}
        if not resumable(run.model):
            return Evidence.unmeasured(
                self.kind, rule="a frozen direct path", n_prompts=len(ctx.prompts), extra=named,
                detail=f"{head_label(a)}'s direct contribution is not defined on a {type(run.model).__name__} whose "
                       "blocks are not sequential pre-norm (every later LayerNorm mixes a head's write into the rest, "
                       "so no direct path to the output can be frozen); backup needs a pre-norm model")
        result = ctx.cached(("pair-compensation", self.method, self.behaviour, self.batch_size, b),
                            lambda: compensation(run, method=self.method, heads=[b]))
        values = result.per_prompt[(b, a)]
        rise, frozen, floor = values["compensation"], values["frozen_effect"], min_effect(unit)
        total_b = result.effects.set_index("label").loc[head_label(b), "total_effect"]
        extra: dict[str, float | str] = {
            "takeover": float(values["takeover"].mean()), "alignment": float(values["alignment"].mean()),
            "total_effect_b": float(total_b), "frozen_effect_b": float(frozen.mean()), **named}
        if float(frozen.mean()) < max(floor, 1e-12):
            return Evidence.unmeasured(
                self.kind, rule=f"{head_label(b)} has an effect", n_prompts=len(rise), extra=extra,
                detail=f"no effect to back up: ablating {head_label(b)} changes the behaviour by {float(frozen.mean()):.3g} "
                       f"{unit} even with {head_label(a)}'s response frozen, below the practical minimum {floor:g} {unit}")
        if self.kind == "observational":
            return difference_evidence("observational", rise, torch.zeros_like(rise), ctx, margin=0.0, decisive=True,
                                       min_effect=floor, unit=unit, extra=extra,
                                       what=f"rise of {head_label(a)}'s direct contribution when {head_label(b)} is "
                                            f"ablated (its new write against its clean write, both on the "
                                            f"{head_label(b)}-ablated run)")
        threshold = Threshold(MIN_EFFECT["fraction"], BACKUP_FRACTION_SOURCE, "above")
        return ratio_evidence("necessity", rise, frozen, threshold, ctx, decisive=True, extra=extra,
                              what=f"fraction of {head_label(b)}'s effect (with {head_label(a)}'s response frozen) "
                                   f"that {head_label(a)}'s direct response recovers")


def redundant_claim(a: HeadLike, b: HeadLike, *, method: AblationKind = "mean", batch_size: int = 16,
                    behaviour: BehaviourLike = None) -> Claim:
    """"A and B are redundant": together they matter much more than apart, so each stands in for the other.

    observational: the interaction delta(both) - delta(A) - delta(B) clears the practical minimum of the
    behaviour's unit (`interp.claims.min_effect`) with its CI above 0; necessity: ablating both costs
    clearly more than the costlier one alone (per prompt, same minimum). Both are decisive. Whether
    either head alone is cheap to remove is a separate claim (`dispensable_claim`): two heads that each
    matter can still be redundant with each other (a partial backup).
    """
    a, b = parse_head(a), parse_head(b)
    check_head_pair(a, b, "redundant")
    common: dict[str, Any] = dict(method=method, batch_size=batch_size, behaviour=behaviour)
    return Claim(
        "redundant", (a, b), f"{head_label(a)} and {head_label(b)} are redundant", params={"method": method},
        evidence={"observational": _Superadditive(**common), "necessity": _EachAloneLess(**common)},
    )


def dispensable_claim(a: HeadLike, *, margin: float = DEFAULT_MARGIN, method: AblationKind = "mean", batch_size: int = 16, behaviour: BehaviourLike = None) -> Claim:
    """"A is dispensable": ablating it alone changes the loss by less than `margin` (CI wholly below)."""
    a = parse_head(a)
    return Claim("dispensable", (a,), f"{head_label(a)} is dispensable", params={"margin": margin, "method": method},
                 thresholds={"observational": Threshold(margin, MARGIN_SOURCE, "below")},
                 evidence={"observational": _Cheap(method=method, batch_size=batch_size, margin=margin,
                                                    behaviour=behaviour)})


def backup_claim(a: HeadLike, b: HeadLike, *, method: AblationKind = "mean", batch_size: int = 16,
                 behaviour: BehaviourLike = None) -> Claim:
    """"A backs up B": when B is ablated, A's *direct* contribution to the behaviour rises, by enough to matter.

    From `compensation` with B ablated. The rise is measured in the behaviour's unit on one baseline, the
    B-ablated run: the behaviour change of putting A's clean write back in place of its new one in the
    final residual stream (later layers frozen). (Differencing A's direct effects on the clean and on the
    ablated run would credit a head whose write did not change, since a loss's curvature differs
    between the two; see `compensation`.) For a behaviour on the final hidden state
    (`embedding_change`) the same holds with the embedding change in place of the loss.
    observational: the rise clears `min_effect(unit)` with its CI above 0. necessity: it recovers at
    least `MIN_EFFECT["fraction"]` of B's effect with A's response frozen (ratio of means, bootstrap CI).
    Both decisive: a head that reads B (a consumer: an induction head reading the previous-token head)
    does less once B is gone, its rise is negative, and the claim is refuted. The takeover and alignment
    of A's write along B's are reported as extras. A head in the same or an earlier layer cannot react
    to B's ablation: refuted outright. B without effect (even with A frozen): inconclusive, "no effect";
    a model with no frozen direct path (post-norm blocks): inconclusive, said why.
    """
    a, b = parse_head(a), parse_head(b)
    check_head_pair(a, b, "backs_up")
    common: dict[str, Any] = dict(method=method, batch_size=batch_size, behaviour=behaviour)
    return Claim("backs_up", (a, b), f"{head_label(a)} backs up {head_label(b)}", params={"method": method},
                 thresholds={"necessity": Threshold(MIN_EFFECT["fraction"], BACKUP_FRACTION_SOURCE, "above")},
                 evidence={"observational": _DirectBackup("observational", **common),
                           "necessity": _DirectBackup("necessity", **common)})


def redundancy_claims(
    model: nn.Module,
    prompts: PromptSet,
    *,
    pairs: Sequence[tuple[HeadLike, HeadLike]] = (),
    heads: Sequence[HeadLike] = (),
    backups: Sequence[tuple[HeadLike, HeadLike]] = (),
    margin: float = DEFAULT_MARGIN,
    method: AblationKind = "mean",
    behaviour: BehaviourLike = None,
    alpha: float = 0.05,
    seed: int = 0,
    batch_size: int = 16,
) -> pd.DataFrame:
    """Test "redundant" for `pairs`, "dispensable" for `heads` (cheaper than `margin`), "backs up" for `backups`
    (A, B): one row per claim from `interp.claims.test_claims` (verdict, p_adjusted, reasons, evidence).
    `behaviour`: default the model's own, as `interp.Run` (the verdict table's `behaviour` column says which)."""
    _, seed = check_inputs("redundancy_claims", model, prompts, seed=seed)
    common: dict[str, Any] = dict(method=method, batch_size=batch_size, behaviour=behaviour)
    claims = [redundant_claim(a, b, **common) for a, b in _parse_pairs(model, pairs)] if pairs else []
    claims += [dispensable_claim(h, margin=margin, **common) for h in check_heads(model, heads)] if heads else []
    claims += [backup_claim(a, b, **common) for a, b in _parse_pairs(model, backups)] if backups else []
    if not claims:
        raise ValueError("no claims to test; pass pairs=, heads= or backups=.")
    return test_claims(model, claims, prompts, alpha=alpha, seed=seed, batch_size=batch_size,
                       evidence=("observational", "necessity", "sufficiency"))
