"""Composition claims: "L0H0 -> L1H0 via k composes", a claim about one edge between two heads.

An edge (`interp.paths.Edge`) is a sender head's write reaching one input (q, k or v) of a head in a later
layer. `composition_claim(edge)` asserts that the receiver reads the sender's write through that input in a
way the behaviour uses; `composition_claim(edge, composes=False)` asserts that it does not. Evidence, each
measured on the behaviour of the test (`interp.behaviour`; by default the model's own, e.g. the next-token
loss on the repeated copies) through `interp.Run`:

- observational (decisive): path patching along the edge, `Run.effect(EdgePatch((edge,)))`: the receiver
  reads the sender's write from another prompt of the set (resampled, never zeroed) and nothing else
  changes; per-prompt effect in the behaviour's unit with a studentized-bootstrap CI. "composes" passes
  when the CI lies above 0 and the mean reaches the practical minimum `m` (`interp.claims.min_effect`: 0.01
  nats), and is refuted when the CI lies within +-m (equivalence: the edge carries nothing that matters);
  a CI wholly below -m (patching the edge *helps* the behaviour: the edge matters, against it) is
  undecided. "does not compose" is the mirror: supported when the CI lies within +-m (two one-sided
  tests), refuted when the CI excludes 0 and |mean| >= m;
- necessity ("composes" only, not decisive): the same path from a control sender, paired per prompt,
  claimed minus control, `interp.claims.difference_evidence` with the same minimum. The control is
  picked by a fixed rule before anything runs (`control_sender`): the other head of the sender's layer
  whose composition score into the receiver through the same input is the smallest, ties to the lowest
  head index. It says the effect belongs to this sender, not to any perturbation of the receiver's input
  (with a LayerNorm, resampling any write moves the receiver a little: toy-induction's layer-0 heads
  each cost 0.05-0.5 nats through L1H2's inputs). A layer of one head has no control: undecided;
- the composition score (`interp.analyses.circuits.composition`): the edge's score from the weights, its
  ratio to the random baseline and whether it clears the baseline's 95th percentile, reported in the
  observational evidence (`extra`: composition_score, composition_ratio, composition_baseline_p95,
  composition_clears_p95) and its detail. **Supporting only, never required**: the score reads the whole
  subspaces of the weights, not the directions the prompts use, and ignores LayerNorm's per-token scale,
  so a used edge can score below the baseline (toy-induction L0H3 -> L1H2 via q costs 0.53 nats and
  scores 0.98x its baseline) and an unused one above it;
- qk_attribution (via q or k; "composes" claims): the sender's exact terms in the receiver's score difference
  at the key it attends to, through the edge's input (`interp.analyses.claims.qk_attribution`), with a CI over
  prompts. **Supporting only, never in the verdict** (`interp.claims.SUPPORTING_KINDS`): it reads the score
  with the norm frozen, not the behaviour.

The thresholds are the toolkit's fixed defaults (`interp.claims.MIN_EFFECT` for the behaviour's unit),
the same on every model and stated before any run; `min_effect=` sets another explicitly. Every claim of
a run, composition claims with the rest, is corrected together with Benjamini-Hochberg
(`interp.claims.test_claims`).

Grouped-query attention: on a layer whose query heads share key/value heads, a key or value edge goes into the
key/value head, 'L16H0 -> L18KV2 via k' (`interp.paths`); its path patch is that edge (every query head of the
group reads the patched key). The weights-based evidence is per query head, so for a key/value receiver it is
taken over the group: the composition score is the group's strongest query head's (named in the evidence,
`composition_head`), against the baseline of the largest of as many random scores (`group_baseline`), so the
maximum does not inflate the ratio; the control sender is chosen by that same group score. QK attribution is
per query head and is left out of a key/value receiver's claim (claim a query head's 'via q' edge, or read
`interp.analyses.qk` head by head).

Limits: edges between heads only (q, k, v; the composition score exists for those); pre-norm models with
split inputs (`interp.paths.check_graph_model`; any other model makes the evidence undecided, said why);
a behaviour in a unit without a practical minimum (`min_effect(unit) == 0`) can never refute "composes"
(the +-0 band is empty): pass `min_effect=`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from interp.analyses.circuits.power import EdgeZero, WriteChange, write_changes
from interp.analyses.claims.causal import behaviour_text, claims_run, resolve_behaviour
from interp.analyses.claims.common import with_power
from interp.analyses.claims.qk_attribution import QK_VIAS, EdgeAttribution
from interp.behaviour import Behaviour, BehaviourLike, UndefinedOnPrompts
from interp.claims import Claim, Context, Evidence, Inconclusive, difference_evidence, equivalence_evidence, min_effect
from interp.errors import BadInput
from interp.paths import HEAD_VIAS, Edge, EdgePatch, Node, check_graph_model, group_heads, group_of, parse_edge

CONTROL_RULE = ("the other head of the sender's layer with the smallest composition score into the receiver through "
                "the same input (ties: the lowest head index), chosen from the weights before any prompt runs")


def composition_edge(edge: Edge | str) -> Edge:
    """The head-to-head edge a composition claim is about: a BadInput naming the edge unless both ends are
    heads (the receiver a key/value head for k / v on a grouped layer: 'L0H0 -> L1KV0 via k'), the input is q, k
    or v and the receiver sits in a later layer than the sender."""
    parsed = parse_edge(edge)
    if parsed.sender.kind != "head" or parsed.receiver.kind not in ("head", "kv"):
        raise BadInput(f"composition claim on {parsed.label!r}: both ends must be heads (a composition score exists "
                       "between heads only); write 'L0H0 -> L1H0 via k' (or 'L0H0 -> L1KV0 via k' into a key/value "
                       "head of grouped-query attention).")
    if parsed.receiver.kind == "kv" and parsed.via not in ("k", "v"):
        raise BadInput(f"composition claim on {parsed.label!r}: a key/value head is reached via k or v only; a query "
                       "input belongs to one query head, 'L{layer}H{head}'.")
    if parsed.via not in HEAD_VIAS:
        raise BadInput(f"composition claim on {parsed.label!r}: via {parsed.via!r}; expected one of {list(HEAD_VIAS)}.")
    if parsed.receiver.layer <= parsed.sender.layer:
        raise BadInput(f"composition claim on {parsed.label!r}: the receiver {parsed.receiver} (layer "
                       f"{parsed.receiver.layer}) must sit in a later layer than the sender {parsed.sender} (layer "
                       f"{parsed.sender.layer}), since a head reads only earlier layers' writes; swap them or pick a later receiver.")
    return parsed


def _scores(model: nn.Module, via: str, ctx: Context | None) -> Any:
    """`composition_scores(model)` for one input, memoised in `ctx` when given (by the model's parameters)."""
    from interp.analyses.circuits.composition import composition_scores

    def compute() -> Any:
        return composition_scores(model, vias=(via,))

    return compute() if ctx is None else ctx.cached(("composition-scores", model, via), compute)


def composition_row(model: nn.Module, edge: Edge | str, ctx: Context | None = None) -> dict[str, Any]:
    """The edge's row of `interp.analyses.circuits.composition.composition_scores(model)`: score, baseline,
    baseline_p95, ratio ... (memoised in `ctx` when given)."""
    edge = composition_edge(edge)
    frame = _receiver_scores(model, edge, ctx)
    rows = frame[frame.sender == edge.sender.label]
    if rows.empty:
        raise BadInput(f"edge {edge.label!r} is not in this {type(model).__name__}'s composition scores; check that both "
                       "heads exist.")
    return dict(rows.iloc[0])


def _receiver_scores(model: nn.Module, edge: Edge, ctx: Context | None) -> Any:
    """The composition scores into the edge's receiver through its input, one row per sender; for a key/value head,
    each sender's strongest query head of the group (`receiver` names it) with the group's baseline
    (`group_baseline`: the largest of as many random scores)."""
    frame = _scores(model, edge.via, ctx)
    receiver = edge.receiver
    if receiver.kind != "kv":
        return frame[frame.receiver == receiver.label]
    from interp.analyses.circuits.composition import group_baseline

    heads = [h.label for h in group_heads(receiver, group_of(model, receiver.layer))]
    rows = frame[frame.receiver.isin(heads)].sort_values(["score", "receiver_head"], ascending=[False, True],
                                                          kind="stable")
    best = rows.groupby("sender", sort=False).head(1).sort_values(["sender_layer", "sender_head"]).copy()
    if best.empty:
        return best
    n_draws = int(best["n_draws"].iloc[0])
    mean, p95 = (group_baseline(model, receiver.layer, edge.via, len(heads), n_draws=n_draws) if ctx is None else
                 ctx.cached(("composition-group-baseline", model, receiver.layer, edge.via, len(heads)),
                            lambda: group_baseline(model, receiver.layer, edge.via, len(heads), n_draws=n_draws)))
    return best.assign(baseline=mean, baseline_p95=p95, ratio=best["score"] / mean)


def control_sender(model: nn.Module, edge: Edge | str, ctx: Context | None = None) -> Node | None:
    """The control sender for a composition claim (`CONTROL_RULE`): the other head of the sender's layer with
    the smallest composition score into the receiver through the same input, ties to the lowest head index;
    None when the sender's layer has no other head."""
    edge = composition_edge(edge)
    frame = _receiver_scores(model, edge, ctx)
    rivals = frame[(frame.sender_layer == edge.sender.layer) & (frame.sender_head != edge.sender.head)]
    if rivals.empty:
        return None
    best = rivals.sort_values(["score", "sender_head"], kind="stable").iloc[0]
    return Node(edge.sender.layer, "head", int(best.sender_head))


@dataclass(frozen=True)
class _PathPatch:
    """Evidence base: per-prompt behaviour changes of patching edges (`EdgePatch`, resampled) through the claims' Run."""

    edge: Edge
    min_effect: float | None = None  # the practical minimum; None: interp.claims.min_effect(unit)
    behaviour: BehaviourLike = field(default=None, compare=False)  # what is measured; default: the test's, else the model's

    @staticmethod
    def check(ctx: Context) -> None:
        """A model whose residual stream is no sum of node writes cannot be path patched: undecided, said why."""
        try:
            check_graph_model(ctx.model, "a composition claim's path patching")
        except BadInput as error:
            raise Inconclusive(str(error)) from None

    def measure(self, ctx: Context, edges: list[Edge]) -> tuple[Behaviour, str, list[torch.Tensor]]:
        """The behaviour, its description, and the per-prompt effect (prompt,) of patching each edge alone."""
        self.check(ctx)
        chosen = resolve_behaviour(ctx, self.behaviour)
        text = behaviour_text(ctx, chosen)  # Inconclusive when the prompts cannot define it
        try:
            effects = claims_run(ctx, chosen).effects([EdgePatch((edge,)) for edge in edges])
        except UndefinedOnPrompts as error:
            raise Inconclusive(f"the prompts cannot define the behaviour {chosen.name}: {error}") from None
        return chosen, text, [e.values for e in effects]

    def floor(self, unit: str) -> float:
        return min_effect(unit) if self.min_effect is None else float(self.min_effect)

    @staticmethod
    def power(ctx: Context, chosen: Behaviour, sender: Node) -> WriteChange:
        """How much resampling changes the sender's write (`interp.analyses.circuits.power`), memoised on the Run."""
        return write_changes(claims_run(ctx, chosen), [sender])[sender]


def _composition_extra(ctx: Context, edge: Edge) -> tuple[dict[str, float | str], str]:
    """The composition score's extras and a sentence on it (supporting only)."""
    row = composition_row(ctx.model, edge, ctx)
    clears = bool(row["score"] > row["baseline_p95"])
    extra: dict[str, float | str] = {"composition_score": float(row["score"]), "composition_ratio": float(row["ratio"]),
                                     "composition_baseline_p95": float(row["baseline_p95"]),
                                     "composition_clears_p95": "yes" if clears else "no"}
    sentence = (f"composition score {row['score']:.3g} = {row['ratio']:.2f}x its random baseline, "
                f"{'above' if clears else 'not above'} the baseline's p95 {row['baseline_p95']:.3g} (weights; supporting only)")
    if edge.receiver.kind == "kv":
        extra["composition_head"] = str(row["receiver"])
        sentence = (f"{sentence}; the strongest query head of {edge.receiver}'s group, {row['receiver']}, against the "
                    "largest of as many random scores")
    return extra, sentence


@dataclass(frozen=True)
class EdgeEffect(_PathPatch):
    """observational: the path-patching effect of the edge against +-the practical minimum (see the module);
    `composes=False` judges the mirror claim."""

    composes: bool = True

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        chosen, text, (values,) = self.measure(ctx, [self.edge])
        unit, floor = chosen.unit, self.floor(chosen.unit)
        extra, score = _composition_extra(ctx, self.edge)
        extra.update(behaviour=text, edge=self.edge.label, intervention="path patching (resampled)")
        what = f"path patching {self.edge.label} (resampled)"
        if not self.composes:
            if floor <= 0:
                raise Inconclusive(f"the behaviour's unit {unit!r} has no practical minimum (interp.claims.MIN_EFFECT), so "
                                   "no band tells no composition from a small one; pass composition_claim(min_effect=...)")
            ev = equivalence_evidence("observational", values, ctx, band=floor, what=what, unit=unit, extra=extra)
            ev = dataclasses.replace(ev, detail=f"{text}: {ev.detail}; {score}",
                                     rule=f"{ev.rule}; refuted when the CI excludes 0 and |effect| >= {floor:g}")
            return with_power(ev, self.power(ctx, chosen, self.edge.sender))
        ev = difference_evidence("observational", values, torch.zeros_like(values), ctx, decisive=True, min_effect=floor,
                                 unit=unit, what=what, extra=extra)
        suffix = f" {unit}" if unit else ""
        band = f"+-{floor:g}{suffix}"
        within = -floor < ev.ci_low and ev.ci_high < floor
        passed = True if ev.passed else False if within else None
        verdict = {True: "clears the practical minimum", False: f"lies within {band}: no composition",
                   None: f"neither clears {floor:g}{suffix} nor lies within {band}"}[passed]
        detail = f"{text}: {what} = {ev.effect:.4g} [{ev.ci_low:.4g}, {ev.ci_high:.4g}]{suffix}, {verdict}; {score}"
        ev = dataclasses.replace(ev, passed=passed, detail=detail, rule=f"{ev.rule}; refuted when the CI lies within {band}")
        return with_power(ev, self.power(ctx, chosen, self.edge.sender))


@dataclass(frozen=True)
class EdgeControl(_PathPatch):
    """necessity: the claimed edge's effect minus the same path's from the control sender (`control_sender`),
    paired per prompt, above the practical minimum (`difference_evidence`; not decisive)."""

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        self.check(ctx)
        control = control_sender(ctx.model, self.edge, ctx)
        if control is None:
            raise Inconclusive(f"no control: layer {self.edge.sender.layer} has no head besides {self.edge.sender}, so "
                               "no other sender's path can be compared with the claimed one")
        control_edge = Edge(control, self.edge.receiver, self.edge.via)
        chosen, text, (claimed, other) = self.measure(ctx, [self.edge, control_edge])
        floor = self.floor(chosen.unit)
        extra: dict[str, float | str] = {"behaviour": text, "control_edge": control_edge.label,
                                         "effect_claimed": float(claimed.mean()), "effect_control": float(other.mean()),
                                         "control_rule": CONTROL_RULE}
        extra["control_write_change"] = self.power(ctx, chosen, control).max
        ev = difference_evidence("necessity", claimed, other, ctx, min_effect=floor, unit=chosen.unit, extra=extra,
                                 what=f"path patching {self.edge.label} minus the control {control_edge.label}")
        ev = dataclasses.replace(ev, detail=(f"{text}: {ev.detail} (claimed {float(claimed.mean()):.4g}, control "
                                             f"{float(other.mean()):.4g}; {control}: the other head of layer {control.layer} with the smallest "
                                             f"{self.edge.via}-composition score into {self.edge.receiver})"))
        return with_power(ev, self.power(ctx, chosen, self.edge.sender))


@dataclass(frozen=True)
class EdgeZeroEffect(_PathPatch):
    """zero (supporting only, `interp.claims.SUPPORTING_KINDS`): the behaviour's change when the receiver reads zero in
    place of the sender's write along the edge (`interp.analyses.circuits.power.EdgeZero`), per prompt with a CI. It
    says whether the write matters at all where resampling cannot change it (a sender writing positions); zero is
    off-distribution, so it never makes a verdict by itself. `passed`: its CI clears the practical minimum (for
    "does not compose": lies within +-it)."""

    composes: bool = True

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        self.check(ctx)
        chosen = resolve_behaviour(ctx, self.behaviour)
        text = behaviour_text(ctx, chosen)
        try:
            values = claims_run(ctx, chosen).effect(EdgeZero((self.edge,))).values
        except UndefinedOnPrompts as error:
            raise Inconclusive(f"the prompts cannot define the behaviour {chosen.name}: {error}") from None
        floor, unit = self.floor(chosen.unit), chosen.unit
        extra: dict[str, float | str] = {"behaviour": text, "edge": self.edge.label, "ablation": "zero (off-distribution)",
                                         "intervention": "edge zero ablation"}
        what = f"zero-ablating {self.edge.label} (off-distribution, supporting only)"
        if not self.composes and floor > 0:
            ev = equivalence_evidence("zero", values, ctx, band=floor, what=what, unit=unit, extra=extra, decisive=False)
        else:
            ev = difference_evidence("zero", values, torch.zeros_like(values), ctx, min_effect=floor, unit=unit,
                                     what=what, extra=extra)
        return dataclasses.replace(ev, detail=f"{text}: {ev.detail}")


def composition_claim(edge: Edge | str, *, composes: bool = True, min_effect: float | None = None,
                      behaviour: BehaviourLike = None) -> Claim:
    """"SENDER -> RECEIVER via q|k|v composes" (or, `composes=False`, "does not compose"): a Claim for
    `interp.claims.test_claims`, its evidence path patching along the edge, against a control sender (see the
    module). `min_effect`: the practical minimum in the behaviour's unit (default `interp.claims.min_effect`)."""
    parsed = composition_edge(edge)
    if min_effect is not None and (not math.isfinite(min_effect) or min_effect <= 0):
        raise BadInput(f"composition_claim: min_effect={min_effect!r} must be a finite number > 0 (the band +-min_effect "
                       "that tells no composition from composition), or None for interp.claims.min_effect(unit).")
    common: dict[str, Any] = dict(min_effect=min_effect, behaviour=behaviour)
    heads = ((parsed.sender.layer, parsed.sender.head),) + (
        ((parsed.receiver.layer, parsed.receiver.head),) if parsed.receiver.kind == "head" else ())  # a KV head: target
    params = {"edge": parsed.label, "via": parsed.via, "composes": composes, "min_effect": min_effect,
              "control_rule": CONTROL_RULE}
    if composes:
        return Claim("composes", heads, f"{parsed.label} composes: {parsed.receiver} reads {parsed.sender}'s write "
                     f"through its {parsed.via} input", params=params, target=parsed.label,
                     evidence={"observational": EdgeEffect(parsed, composes=True, **common),
                               "necessity": EdgeControl(parsed, **common),
                               "zero": EdgeZeroEffect(parsed, composes=True, **common),
                               **({"qk_attribution": EdgeAttribution(parsed)}
                                  if parsed.via in QK_VIAS and parsed.receiver.kind == "head" else {})})
    return Claim("does_not_compose", heads, f"{parsed.label} does not compose: {parsed.receiver}'s {parsed.via} input "
                 f"does not use {parsed.sender}'s write", params=params, target=parsed.label,
                 evidence={"observational": EdgeEffect(parsed, composes=False, **common),
                           "zero": EdgeZeroEffect(parsed, composes=False, **common)})


__all__ = ["CONTROL_RULE", "EdgeControl", "EdgeEffect", "EdgeZeroEffect", "composition_claim", "composition_edge", "composition_row",
           "control_sender"]
