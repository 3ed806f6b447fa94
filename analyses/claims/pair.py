"""Claims about pairs of heads (and "dispensable" about one), tested by ablation: `redundant_claim(a, b)`,
`dispensable_claim(a)`, `backup_claim(a, b)`, and `redundancy_claims`, which tests a batch of them.

`interp.claims` objects, tested with `interp.claims.test_claims`; their evidence is read from
`interp.Run` effects (one Run per claim context and behaviour) and `interp.analyses.redundancy.compensation`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd
import torch
from torch import nn

from interp.analyses.redundancy.common import DEFAULT_MARGIN, MARGIN_SOURCE, _parse_pairs, redundancy_run
from interp.analyses.redundancy.interaction import compensation
from interp.behaviour import BehaviourLike
from interp.claims import (
    Claim,
    Context,
    Evidence,
    Threshold,
    difference_evidence,
    test_claims,
    threshold_evidence,
)
from interp.data import PromptSet
from interp.heads import HeadLike, head_label, parse_head
from interp.interventions import AblationKind, HeadAblation, check_heads
from interp.run import Run
from interp.validate import check_head_pair, check_inputs


def pair_run(ctx: Context, behaviour: BehaviourLike, batch_size: int) -> Run:
    """The `interp.Run` pair claims measure with: the context's model and prompts, the claim's behaviour (else
    the test's: `ctx.behaviour`; by default the next-token loss on every real position, as `importance`)."""
    chosen = behaviour if behaviour is not None else ctx.behaviour
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


@dataclass(frozen=True)
class _EachAloneCheap(_AblationDeltas):
    """sufficiency: removing either head alone leaves the behaviour (max of the two deltas < margin)."""

    margin: float = DEFAULT_MARGIN

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        a, b = claim.heads
        delta_a, delta_b = self.deltas(ctx, [(a,), (b,)])
        worst = torch.maximum(delta_a, delta_b)
        return threshold_evidence("sufficiency", worst, Threshold(self.margin, MARGIN_SOURCE, "below"), ctx,
                                  what=f"worse of the loss changes ablating {head_label(a)} alone, {head_label(b)} alone",
                                  decisive=True, extra=self.named(ctx, delta_a=float(delta_a.mean()), delta_b=float(delta_b.mean())))


@dataclass(frozen=True)
class _BothCostly(_AblationDeltas):
    """necessity: removing both heads together costs more than the margin."""

    margin: float = DEFAULT_MARGIN

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        (both,) = self.deltas(ctx, [tuple(claim.heads)])
        return threshold_evidence("necessity", both, Threshold(self.margin, MARGIN_SOURCE, "above"), ctx,
                                  what=f"loss change ablating {claim.label} together", decisive=True, extra=self.named(ctx))


@dataclass(frozen=True)
class _Superadditive(_AblationDeltas):
    """observational: the pair costs more together than the sum of each alone (interaction > 0)."""

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        a, b = claim.heads
        delta_a, delta_b, both = self.deltas(ctx, [(a,), (b,), (a, b)])
        return difference_evidence("observational", both, delta_a + delta_b, ctx, margin=0.0, decisive=True,
                                   what=f"interaction delta({claim.label}) - delta({head_label(a)}) - delta({head_label(b)})",
                                   extra=self.named(ctx))


@dataclass(frozen=True)
class _Cheap(_AblationDeltas):
    """observational: ablating the head alone costs less than the margin."""

    margin: float = DEFAULT_MARGIN

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        (delta,) = self.deltas(ctx, [tuple(claim.heads)])
        return threshold_evidence("observational", delta, Threshold(self.margin, MARGIN_SOURCE, "below"), ctx,
                                  what=f"loss change ablating {claim.label}", decisive=True, extra=self.named(ctx))


@dataclass(frozen=True)
class _Compensates:
    """Backup evidence from `compensation` with B ablated: "observational" = A's output moves toward
    B's write (takeover CI > 0); "necessity" = A's direct effect on the loss grows (compensation CI > 0)."""

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
        result = ctx.cached(("pair-compensation", self.method, self.behaviour, self.batch_size, b),
                            lambda: compensation(run, method=self.method, heads=[b]))
        per_prompt = result.per_prompt[(b, a)]
        if self.kind == "observational":
            values, what = per_prompt["takeover"], f"fraction of {head_label(b)}'s write that {head_label(a)} takes over when {head_label(b)} is ablated"
        else:
            values, what = per_prompt["compensation"], f"growth of {head_label(a)}'s direct effect on the loss when {head_label(b)} is ablated"
        return difference_evidence(self.kind, values, torch.zeros_like(values), ctx, margin=0.0, decisive=True, what=what,
                                   extra={"alignment": float(per_prompt["alignment"].mean()),
                                          "behaviour": result.effects.attrs.get("behaviour", "")})


def redundant_claim(a: HeadLike, b: HeadLike, *, margin: float = DEFAULT_MARGIN, method: AblationKind = "mean", batch_size: int = 16, behaviour: BehaviourLike = None) -> Claim:
    """"A and B are redundant": each alone is cheap to remove (sufficiency, CI < margin), both together
    are not (necessity, CI > margin), and together they cost more than the sum of each alone
    (observational, interaction CI > 0). Any of these failing clearly refutes the claim."""
    a, b = parse_head(a), parse_head(b)
    check_head_pair(a, b, "redundant")
    common: dict[str, Any] = dict(method=method, batch_size=batch_size, behaviour=behaviour)
    return Claim(
        "redundant", (a, b), f"{head_label(a)} and {head_label(b)} are redundant",
        params={"margin": margin, "method": method},
        thresholds={"sufficiency": Threshold(margin, MARGIN_SOURCE, "below"),
                    "necessity": Threshold(margin, MARGIN_SOURCE, "above")},
        evidence={"observational": _Superadditive(**common), "necessity": _BothCostly(**common, margin=margin),
                  "sufficiency": _EachAloneCheap(**common, margin=margin)},
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
    """"A backs up B": ablating B makes A's output change toward B's role, and A then does more of the job.

    From `compensation` with B ablated: observational = the takeover (component of A's change in
    output along B's clean-minus-ablated write, as a fraction of it) has its CI above 0;
    necessity = A's direct effect on the loss grows (compensation CI above 0). A head that only
    reacts to B because it reads B (its output changes, but it helps less) fails the second.
    Either CI wholly below 0 refutes; a head in the same or an earlier layer cannot react to B's
    ablation, so the claim is refuted outright.
    """
    a, b = parse_head(a), parse_head(b)
    check_head_pair(a, b, "backs_up")
    common: dict[str, Any] = dict(method=method, batch_size=batch_size, behaviour=behaviour)
    return Claim("backs_up", (a, b), f"{head_label(a)} backs up {head_label(b)}", params={"method": method},
                 evidence={"observational": _Compensates("observational", **common),
                           "necessity": _Compensates("necessity", **common)})


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
    """Test "redundant" for `pairs`, "dispensable" for `heads`, "backs up" for `backups` (A, B):
    one row per claim from `interp.claims.test_claims` (verdict, p_adjusted, reasons, evidence)."""
    _, seed = check_inputs("redundancy_claims", model, prompts, seed=seed)
    common: dict[str, Any] = dict(method=method, batch_size=batch_size, behaviour=behaviour)
    claims = [redundant_claim(a, b, margin=margin, **common) for a, b in _parse_pairs(model, pairs)] if pairs else []
    claims += [dispensable_claim(h, margin=margin, **common) for h in check_heads(model, heads)] if heads else []
    claims += [backup_claim(a, b, **common) for a, b in _parse_pairs(model, backups)] if backups else []
    if not claims:
        raise ValueError("no claims to test; pass pairs=, heads= or backups=.")
    return test_claims(model, claims, prompts, alpha=alpha, seed=seed, batch_size=batch_size,
                       evidence=("observational", "necessity", "sufficiency"))
