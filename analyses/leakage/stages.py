"""Stages 2 to 4 of the leakage audit, and `audit`, which runs them after `plan.plan_audit`.

`run_methods` (every method of the plan, -> `MethodRuns`), `locate_leaks` (the hook site where
each kind of leak enters) and `locate_origins` (its line of code), `decide_leaks` (the verdict); the
methods themselves are described in `interp.analyses.leakage`'s docstring.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

import pandas as pd
import torch
from torch import nn

import interp.analyses.leakage.fast as leakage_fast
import interp.launch as launch
from interp.analyses.leakage.adapter import ModelAdapter, observed_masking
from interp.analyses.leakage.fast import SHORT_LEN, SIDE_LEN, perturbation_cuts, perturbation_draws
from interp.analyses.leakage.floor import FLOAT64_DECIDES, AuditRun, Floors, decides, float64_copy, measure_floors
from interp.analyses.leakage.methods import (
    FORWARD_MODE_BYTES,
    _batch_pairs,
    _first,
    _future_pairs,
    _generator,
    _odd_length,
    _Progress,
    _resample,
    backward_bytes,
    batch_mixing,
    gradient,
    gradient_at_cuts,
    localisation_threshold,
    localise,
    padding_check,
    padding_inputs,
    pattern_check,
    perturbation,
    site_modules,
)
from interp.analyses.leakage.origin import OpPair, Origin, batch_rows, find_origin, pair_length, recording_construction
from interp.analyses.leakage.plan import AuditPlan, _check_methods, _embedding, _no_future_method_message, plan_audit
from interp.analyses.leakage.report import LeakageReport
from interp.analyses.leakage.types import (
    DEFAULT_TOL,
    FUTURE_METHODS,
    LEAK_KINDS,
    METHOD_KIND,
    METHODS,
    NOISE_FACTOR,
    SITE_COLUMNS,
    TRUSTED,
    Finding,
    LeakVerdict,
    Pair,
    above_threshold,
    findings_table,
    method_tol,
)
from interp.errors import ModelError
from interp.launch import Device, DType

# ---------------------------------------------------------------------------------------------
# Stage 2, the methods: every row the plan asks for
# ---------------------------------------------------------------------------------------------

@dataclass
class MethodRuns:
    """What the methods measured, before localisation and the verdict."""

    adapter: ModelAdapter  # the adapter the later methods ran: one example per forward if the batch mixes
    floors: Floors | None = None  # the noise floors every comparison was judged against (`floor`)
    rows: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    future_influence: dict[bool, dict[int, torch.Tensor]] = field(
        default_factory=lambda: {False: {}, True: {}})  # ones_mask -> length -> (cut, query), where above tol
    padding_pair: Pair | None = None  # the worst pad-content pair, for localisation
    incomplete: dict[str, str] = field(default_factory=dict)  # check -> why it could not run
    float64: set[str] = field(default_factory=set)  # methods whose comparisons the float64 copy decided

    def threshold(self, method: str, plan: AuditPlan) -> float:
        return plan.tol if self.floors is None else self.floors.threshold(method)

    def through(self, method: str, adapter: ModelAdapter) -> ModelAdapter:
        """The adapter `method` compares through: the float64 copy's where it decides (`Floors.adapter`)."""
        if self.floors is None or not self.floors.float64_decides(method):
            return adapter
        self.float64.add(method)
        return self.floors.adapter(method, adapter)


# ---------------------------------------------------------------------------------------------
# Stage 1b, the noise floors: each comparison's rounding, measured before the methods run
# ---------------------------------------------------------------------------------------------

def floor_lengths(max_len: int) -> list[int]:
    """Prefix lengths whose comparison with the full length measures the truncation's floor."""
    lengths = {(max_len + 1) // 2} | ({max_len - 1} if max_len <= SIDE_LEN else set())
    return sorted(n for n in lengths if 1 <= n < max_len)


def comparisons(plan: AuditPlan, takes_mask: bool) -> dict[str, list[tuple[AuditRun, AuditRun]]]:
    """The pairs of runs each method compares, on the audit's own prompts (`floor.measure_floors`); padding only
    for a model that takes an attention_mask (`takes_mask`)."""
    n, full = plan.n_prompts, plan.prompts(max(plan.n_prompts, 2), plan.max_len)
    pairs: dict[str, list[tuple[AuditRun, AuditRun]]] = {}
    future = not plan.bidirectional
    if "truncation" in plan.methods and future:
        whole = AuditRun("full", full[:n])
        pairs["truncation"] = [(AuditRun(f"prefix{L}", full[:n, :L]), whole) for L in floor_lengths(plan.max_len)]
    if "perturbation" in plan.methods:
        lengths = plan.lengths if future else plan.lengths[:1]
        pairs["perturbation"] = [(AuditRun(f"base{L}", plan.prompts(n, L)), AuditRun(f"base{L}", plan.prompts(n, L)))
                                 for L in lengths]
    if "batch" in plan.methods:
        together = plan.prompts(max(n, 2), plan.side_len)
        pairs["batch"] = [(AuditRun("alone", together[:1]), AuditRun("together", together))]
    if "padding" in plan.methods and takes_mask:
        inputs = padding_inputs(plan.prompts(n, _odd_length(plan.side_len)), plan.vocab, pad_id=plan.pad_id, seed=plan.seed)
        right, _, right_mask = inputs.sides["right"]
        pairs["padding"] = [(AuditRun("unpadded", inputs.unpadded), AuditRun("right", right, right_mask, right_mask[0].bool()))]
        for name, (tokens, _, mask) in inputs.sides.items():
            run = AuditRun(name, tokens, mask, mask[0].bool())
            pairs["padding"].append((run, run))
    return pairs


@torch.no_grad()
def measure_audit_floors(model: Any, adapter: ModelAdapter, plan: AuditPlan) -> Floors:
    """Every method's floor (`floor.measure_floors`), against a float64 copy of the model where it can be cast."""
    copy64 = float64_copy(model)
    reference = None
    if copy64 is not None:
        reference = ModelAdapter(copy64).remember()
        try:
            probe = reference(plan.prompts(1, min(plan.max_len, 8)))
        except Exception:  # the copy cannot run in float64 (a dtype fixed in the model's code): batch composition
            probe = None
        if probe is None or probe.dtype != torch.float64:  # it ran, but computes in another precision inside
            reference = None
    adapter.remember()
    floors = measure_floors(adapter, reference, comparisons(plan, adapter.takes_mask), tol=plan.tol,
                            tol64=plan.tol if plan.tol_given else DEFAULT_TOL)
    if reference is None:
        floors.notes.append("the model cannot be cast to float64, so each comparison is judged against its rounding's "
                            "dependence on the batch's arrangement (the same prompts together and one at a time): a "
                            "weaker guarantee than the float64 floor, which bounds every run's distance from exact numbers")
    return floors


# ---------------------------------------------------------------------------------------------
# Stage 2, the methods: every row the plan asks for
# ---------------------------------------------------------------------------------------------

@torch.no_grad()
def run_methods(model: Any, adapter: ModelAdapter, plan: AuditPlan, *, floors: Floors | None = None,
                tick: Any = lambda *a, **k: None) -> MethodRuns:
    """Run every method of the plan in order: batch, the future methods (or, for an encoder, one
    perturbation), pattern, padding; each judged against its floor (`floors`; None: `plan.tol`).
    A ValueError if no method could show a future leak."""
    runs = MethodRuns(adapter=adapter, floors=floors)
    if "batch" in plan.methods:
        threshold = runs.threshold("batch", plan)
        side = plan.prompts(max(plan.n_prompts, 2), plan.side_len)  # (prompt, pos)
        mixing = batch_mixing(runs.through("batch", adapter), side, plan.vocab, threshold, seed=plan.seed)
        runs.rows += mixing
        tick(1, "batch")
        if any(row["influence"] > threshold for row in mixing):
            runs.adapter = adapter.one_per_forward()  # mixing must not pose as a leak in the other methods
            runs.notes.append("the model mixes examples of a batch: the other tests ran one example per forward pass")
    if plan.bidirectional:
        short = plan.prompts(plan.n_prompts, plan.lengths[0])
        runs.rows += perturbation(runs.through("perturbation", runs.adapter), short, plan.vocab,
                                  runs.threshold("perturbation", plan), draws=1, seed=plan.seed, max_cuts=plan.max_cuts)[0]
        runs.notes.append("declared bidirectional (an encoder): future dependence is by design and not counted")
    else:
        _run_future(model, runs, plan, prompts=plan.prompts(max(plan.n_prompts, 2), plan.max_len), tick=tick)
        if "pattern" in plan.methods:
            pattern_rows, note = pattern_check(model, runs.adapter, plan.prompts(plan.n_prompts, plan.side_len), plan.tol)
            runs.rows += pattern_rows
            runs.notes += [note] if note else []
            tick(1, "pattern")
    if "padding" in plan.methods:
        _run_padding(runs, plan)
        tick(1, "padding")
    return runs


def _run_future(model: Any, runs: MethodRuns, plan: AuditPlan, *, prompts: torch.Tensor, tick: Any) -> None:
    """The future methods, once per mask variant: as called without a mask, and (models taking one)
    with a mask of ones, where a fast path may drop the causal mask."""
    embed = _embedding(model, plan)
    state: dict[str, Any] = {}  # the incremental reference, computed once for both variants
    for ones_mask in plan.mask_variants:
        variant = runs.adapter.with_ones_mask() if ones_mask else runs.adapter
        try:
            rows, found, gradient_failed = _run_variant(model, variant, runs, plan, prompts=prompts, embed=embed,
                                                        tick=tick, state=state)
        except ModelError as error:
            if not ones_mask:
                raise
            runs.notes.append(f"the model fails when handed an attention_mask, so its mask path was not audited: {error}")
            continue
        runs.rows += rows
        runs.future_influence[ones_mask].update(found)
        if gradient_failed and not ones_mask:
            runs.notes.append("gradient skipped: the embedding output is not (batch, seq, d_model)")
    if "gradient" in plan.methods and embed is None:
        runs.notes.append("gradient skipped: no input embedding found (a black-box callable)")
    if not any(row["method"] in FUTURE_METHODS for row in runs.rows):
        raise ValueError(_no_future_method_message(plan.methods, runs.notes))


def _run_variant(model: Any, variant: ModelAdapter, runs: MethodRuns, plan: AuditPlan, *, prompts: torch.Tensor,
                 embed: nn.Module | None, tick: Any, state: dict[str, Any]) -> tuple[list[Finding], dict[int, torch.Tensor], bool]:
    """Truncation, perturbation and gradient through one adapter: rows, the perturbation influence
    (cut, query) per length where it is above its threshold, and whether the gradient found no usable embedding."""
    rows: list[Finding] = []
    if "truncation" in plan.methods:
        rows += _truncation(model, variant, runs, plan, prompts[:plan.n_prompts], tick=tick, state=state)
    found: dict[int, torch.Tensor] = {}
    if "perturbation" in plan.methods:
        threshold = runs.threshold("perturbation", plan)
        for length in plan.lengths:
            if variant.ones_mask and plan.incremental and length > SHORT_LEN:
                continue  # the reference compares this variant at every cut of that length already
            perturbed, influence = perturbation(
                runs.through("perturbation", variant), plan.prompts(plan.n_prompts, length), plan.vocab, threshold,
                draws=perturbation_draws(plan.incremental, length, plan.draws), seed=plan.seed, progress=tick,
                max_cuts=perturbation_cuts(plan.incremental, length, plan.max_cuts))
            rows += perturbed
            if float(influence.nan_to_num(0.0).max()) > threshold:
                found[length] = influence
    gradient_failed = False
    if "gradient" in plan.methods and embed is not None:
        grad_tol = method_tol("gradient", plan.tol)
        grad_rows = gradient(variant, embed, plan.prompts(1, plan.gradient_len)[0], grad_tol, seed=plan.seed, progress=tick)
        if grad_rows and plan.gradient_cuts and not variant.ones_mask:  # the reference covers the mask variant's cuts
            memory = backward_bytes(model, plan.max_len)
            grad_rows += gradient_at_cuts(variant, embed, plan.prompts(1, plan.max_len)[0], grad_tol, list(plan.gradient_cuts),
                                          seed=plan.seed, progress=tick,
                                          forward_mode=memory is not None and memory > FORWARD_MODE_BYTES)
        gradient_failed = not grad_rows
        rows += grad_rows
    return rows, found, gradient_failed


def _truncation(model: Any, variant: ModelAdapter, runs: MethodRuns, plan: AuditPlan, prompts: torch.Tensor, *,
                tick: Any, state: dict[str, Any]) -> list[Finding]:
    """The black-box prefixes of the plan and, on a native model, the incremental reference over every cut."""
    threshold = runs.threshold("truncation", plan)
    rows = leakage_fast.truncation_rows(model, runs.through("truncation", variant), prompts, threshold,
                                        lengths=plan.prefix_lengths, progress=tick)
    if plan.incremental and plan.max_len > 1:
        reference = runs.floors.reference if runs.floors is not None else None
        model64 = None if reference is None or variant.max_rows is not None else reference.model
        found, state["reference"] = leakage_fast.incremental_rows(
            model, variant, prompts, plan.tol, reference=state.get("reference"), model64=model64,
            adapter64=None if model64 is None else reference, progress=tick)
        rows += found
        done = state["reference"]
        if runs.floors is not None and variant.ones_mask in done.floors:
            runs.floors.add("truncation", leakage_fast.reference_label(prompts), done.floors[variant.ones_mask])
            if decides(done.floors[variant.ones_mask]):
                runs.float64.add("truncation")
    return rows


def _run_padding(runs: MethodRuns, plan: AuditPlan) -> None:
    """Pad content and right padding against the unpadded run, for models that take an attention_mask."""
    if not runs.adapter.takes_mask:
        runs.notes.append("padding skipped: the model takes no attention_mask")
        return
    try:
        rows, notes, worst = padding_check(runs.through("padding", runs.adapter),
                                           plan.prompts(plan.n_prompts, _odd_length(plan.side_len)), plan.vocab,
                                           runs.threshold("padding", plan), pad_id=plan.pad_id, seed=plan.seed,
                                           bidirectional=plan.bidirectional)
    except ModelError as error:  # the model takes a mask but fails with one: padding is unaudited, not inert
        runs.incomplete["padding"] = (f"padding check could not run: {error} Fix the model's attention_mask path, or pass "
                               "--no-padding (methods without 'padding') to audit without it.")
        return
    runs.rows += rows
    runs.notes += notes
    runs.padding_pair = worst


# ---------------------------------------------------------------------------------------------
# Stage 3, localisation: where each kind of leak enters
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Localisation:
    """Per leak kind, the sites in forward order (`sites`, SITE_COLUMNS) and the first that carries it."""

    sites: pd.DataFrame
    first: dict[str, str | None]
    notes: tuple[str, ...] = ()


def leak_kinds(table: pd.DataFrame, plan: AuditPlan) -> tuple[str, ...]:
    """The kinds of leak the trusted rows above their threshold show (an encoder's future is by design)."""
    trusted = _trusted(table, plan)
    return tuple(sorted({METHOD_KIND[m] for m in trusted.loc[above_threshold(trusted, plan.tol), "method"]},
                        key=LEAK_KINDS.index))


def _trusted(table: pd.DataFrame, plan: AuditPlan) -> pd.DataFrame:
    trusted = table[table["method"].isin(TRUSTED)]
    if plan.bidirectional:
        trusted = trusted[trusted["method"].map(METHOD_KIND) != "future"]
    return trusted


@torch.no_grad()
def locate_leaks(adapter: ModelAdapter, runs: MethodRuns, table: pd.DataFrame, *, leaks: Sequence[str],
                   plan: AuditPlan, sites: list[tuple[str, nn.Module]]) -> Localisation:
    """Repeat a pair of runs per leak kind with every site captured; the first site that moves carries it.
    `adapter` is the one the audit started with (batch mixing shows only with several rows per forward)."""
    if not sites:
        return Localisation(pd.DataFrame(columns=SITE_COLUMNS), {})
    located: dict[str, pd.DataFrame] = {}  # kind -> localise's frame
    notes: tuple[str, ...] = ()
    if "batch" in leaks:
        pairs = _batch_pairs(plan.prompts(2, _odd_length(plan.side_len)), plan.vocab, plan.seed)
        located["batch"] = localise(adapter, sites, pairs, plan.tol)
    pair = runs.padding_pair
    if pair is not None and pair["influence"] > runs.threshold("padding", plan):
        located["padding"] = _localise_through(runs, "padding", runs.adapter, sites, [pair], plan)
    if "future" in leaks:
        located["future"], notes = _localise_future_leak(runs, table, plan, sites)
    frame = (pd.concat([found.assign(kind=kind) for kind, found in located.items()], ignore_index=True)[SITE_COLUMNS]
             if located else pd.DataFrame(columns=SITE_COLUMNS))
    return Localisation(frame, {kind: _first(found) for kind, found in located.items()}, notes)


def _localise_through(runs: MethodRuns, method: str, adapter: ModelAdapter, sites: list[tuple[str, nn.Module]],
                      pairs: list[Pair], plan: AuditPlan) -> pd.DataFrame:
    """`localise` in the precision that decided `method`: on the float64 copy's own sites where it decided."""
    chosen = runs.through(method, adapter)
    if chosen is not adapter:
        sites = site_modules(chosen.model)
    return localise(chosen, sites, pairs, plan.tol)


def _localise_future_leak(runs: MethodRuns, table: pd.DataFrame, plan: AuditPlan,
                          sites: list[tuple[str, nn.Module]]) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """Localise a future leak through the mask variant that showed it (the all-ones mask when only it did)."""
    rows = _trusted(table, plan)
    rows = rows[rows["method"].isin(FUTURE_METHODS) & above_threshold(rows, plan.tol)]
    masked = bool(rows["ones_mask"].all())  # seen only with a mask of ones
    notes = ["the future leak appears only when the model is given an all-ones attention_mask"] if masked else []
    located = _localise_future(runs, runs.adapter.with_ones_mask() if masked else runs.adapter, sites, plan,
                               found=runs.future_influence[masked], table=rows[rows["ones_mask"] == masked])
    if _first(located) is None:
        notes.append("the leak did not reproduce under token resampling at any site (it depends on the "
                     "presence of later positions rather than their content); localise it by hand")
    return located, tuple(notes)


def _localise_future(runs: MethodRuns, adapter: ModelAdapter, sites: list[tuple[str, nn.Module]], plan: AuditPlan, *,
                     found: dict[int, torch.Tensor], table: pd.DataFrame) -> pd.DataFrame:
    """Localise a future leak with perturbation pairs at the cuts where it was seen (at most 4).

    `found`: the perturbation influence (cut, query) per length where it was above tol; `table`: the
    future-method rows above tol that `adapter` (plain or with a mask of ones) produced."""
    if found:
        length = _localisation_length(found)
        per_cut = found[length].nan_to_num(0.0).amax(dim=1)  # (cut,)
        cuts = [int(c) for c in per_cut.argsort(descending=True)[:4] if float(per_cut[c]) > plan.tol]
    else:  # seen only by truncation or the gradient: cuts from the table
        leaking = table[(table["method"].isin(["truncation", "gradient"])) & above_threshold(table, plan.tol)]
        if leaking.empty:
            return localise(adapter, sites, [], plan.tol)
        length = int(leaking["length"].max())
        mine = leaking[leaking["length"] == length].nlargest(4, "influence")
        cuts = sorted({int(s) - 1 if m == "truncation" else int(q)
                       for m, q, s in zip(mine["method"], mine["query_pos"], mine["source_pos"])})
    prompt = plan.prompts(1, length)[0]
    return _localise_through(runs, "perturbation", adapter, sites, _future_pairs(prompt, cuts, plan.vocab, plan.seed), plan)


def _localisation_length(found: dict[int, torch.Tensor]) -> int:
    odd = [length for length in found if length % 2 and length >= 5]
    return max(odd) if odd else max(found)


# ---------------------------------------------------------------------------------------------
# Stage 3b, the line of code: the first op where each kind of leak appears (`origin`)
# ---------------------------------------------------------------------------------------------

ORIGIN_METHOD = {"future": "perturbation", "batch": "batch", "padding": "padding"}  # whose precision an origin search takes


def locate_origins(adapter: ModelAdapter, runs: MethodRuns, table: pd.DataFrame, *, leaks: Sequence[str],
                   plan: AuditPlan) -> dict[str, Origin]:
    """Per leak kind, the op (file, line, function, source) where an observed output first moves: searched on
    the float64 copy where float64 decided the kind's method (`MethodRuns.through`), else on the model."""
    origins: dict[str, Origin] = {}
    for kind in leaks:
        model = runs.through(ORIGIN_METHOD[kind], adapter).model
        pairs = {"future": _future_op_pairs, "batch": _batch_op_pairs, "padding": _padding_op_pairs}[kind](
            model, runs, table, plan)
        for pair, leak in pairs:
            try:
                origin = find_origin(model, pair, localisation_threshold(leak, plan.tol))
            except Exception as error:  # the model failed on a pair the methods did not run: no line for this kind
                runs.notes.append(f"the {kind} leak's line of code was not found: the model raised "
                                  f"{type(error).__name__} on the localisation inputs ({error})")
                continue
            if origin is not None:
                origins[kind] = origin
                break
    return origins


def _future_op_pairs(model: Any, runs: MethodRuns, table: pd.DataFrame, plan: AuditPlan) -> list[tuple[OpPair, float]]:
    """The largest future leak as two pairs: the later tokens resampled, then (a leak through the length) removed."""
    rows = _trusted(table, plan)
    rows = rows[rows["method"].isin(FUTURE_METHODS) & above_threshold(rows, plan.tol)]
    if rows.empty:
        return []
    top = rows.loc[rows["influence"].idxmax()]
    cut = int(top["query_pos"]) if top["method"] == "gradient" else int(top["source_pos"]) - 1
    length = max(cut + 2, pair_length(model, int(top["length"]), plan.max_len))
    prompt = plan.prompts(1, length)  # (1, pos)
    mask = torch.ones_like(prompt) if bool(rows["ones_mask"].all()) else None
    later = torch.arange(length) > cut
    resampled = torch.where(later, _resample(prompt, plan.vocab, _generator(plan.seed, "origin", length)), prompt)
    keep = torch.arange(cut + 1)
    span = f"{cut + 1}..{length - 1}"
    content = OpPair("future", prompt, resampled, 0, keep, lambda q: f"row {q} now depends on positions {span}", mask)
    prefix = OpPair("future", prompt, prompt[:, :cut + 1], 0, keep,
                    lambda q: f"row {q} changes when positions {span} are removed (it depends on the length)",
                    mask, None if mask is None else mask[:, :cut + 1])
    leak = float(top["influence"])
    return [(content, leak), (prefix, leak)] if _differs_by_content(runs, top) else [(prefix, leak), (content, leak)]


def _differs_by_content(runs: MethodRuns, top: Any) -> bool:
    """Whether the largest future leak showed with the later tokens changed (else only with them removed)."""
    return top["method"] != "truncation" or any(runs.future_influence[flag] for flag in (False, True))


def _batch_op_pairs(model: Any, runs: MethodRuns, table: pd.DataFrame, plan: AuditPlan) -> list[tuple[OpPair, float]]:
    """The first and the last row observed, every other row resampled."""
    length = pair_length(model, _odd_length(plan.max_len), plan.max_len)
    n_rows = batch_rows(model, length)
    prompts = plan.prompts(n_rows, length)  # (row, pos)
    others = _resample(prompts, plan.vocab, _generator(plan.seed, "origin-batch", length))
    leak = float(table.loc[table["method"] == "batch", "influence"].max())
    pairs = []
    for row in (0, n_rows - 1):
        variant = others.clone()
        variant[row] = prompts[row]
        pairs.append((OpPair("batch", prompts, variant, row, torch.arange(length), _batch_words(row)), leak))
    return pairs


def _batch_words(row: int) -> Callable[[int], str]:
    return lambda q: f"row {row} (position {q}) now depends on the other rows of its batch"


def _padding_op_pairs(model: Any, runs: MethodRuns, table: pd.DataFrame, plan: AuditPlan) -> list[tuple[OpPair, float]]:
    """The padding check's worst pair: the same real tokens and mask, other pad content."""
    pair = runs.padding_pair
    if pair is None or "tokens_a" not in pair:
        return []
    keep = pair["observe"].nonzero().flatten()
    return [(OpPair("padding", pair["tokens_a"], pair["tokens_b"], 0, keep,
                    lambda q: f"real position {q} now depends on the content of the padding", pair["mask"]),
             float(pair["influence"]))]


# ---------------------------------------------------------------------------------------------
# Stage 4, the verdict
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    """The verdict, the headline influence, and where each kind of leak enters."""

    verdict: LeakVerdict
    max_influence: float
    first_leaking_site: str | None
    first_leaking_sites: dict[str, str | None]


def decide_leaks(table: pd.DataFrame, plan: AuditPlan, *, leaks: Sequence[str], located: Localisation,
           localised: bool) -> Decision:
    """Verdict from the trusted rows: bidirectional (declared), leak (any kind found), else exact zero
    or rounding. Without localisation (`localised` False) every leak is placed at the output."""
    everything = _trusted(table, plan)  # an encoder's headline is what was audited, not its by-design future
    max_influence = float(everything["influence"].max()) if not everything.empty else math.nan
    verdict: LeakVerdict
    if plan.bidirectional:
        verdict = "bidirectional"
    elif leaks:
        verdict = "leak"
    else:
        verdict = "exact_zero" if max_influence == 0.0 else "numerical_noise"
    first_sites: dict[str, str | None] = dict(located.first) if localised else {kind: "output" for kind in leaks}
    first = next((first_sites.get(kind) for kind in leaks if first_sites.get(kind)), None)
    if leaks and first is None:
        first = "output"
    return Decision(verdict, max_influence, first, first_sites)


# ---------------------------------------------------------------------------------------------
# The entry point: plan, run, localise, decide_leaks
# ---------------------------------------------------------------------------------------------

def audit(
    model: Any,
    *,
    max_len: int | None = None,
    vocab_size: int | None = None,
    n_prompts: int = 2,
    seed: int = 0,
    tol: float | None = None,
    lengths: Sequence[int] | None = None,
    methods: Sequence[str] = METHODS,
    draws: int = 2,
    max_cuts: int | None = 16,
    gradient_len: int = 24,
    localise_leaks: bool = True,
    pad_token_id: int | None = None,
    progress: bool = False,
    device: Device = None,
    dtype: DType = None,
    bidirectional: bool | None = None,
    packed: bool = False, doc_sep: int | None = None, kv_cache: bool = False, window: int | str | None = None,
    attn_impls: Sequence[str] | None = None, packed_prompts: Sequence[Sequence[int]] | None = None, compiled: bool = False,
) -> LeakageReport:
    """Audit `model` for dependence of any output position on later tokens (and on other examples
    of its batch, and on padding). Returns a `LeakageReport`; see `interp.analyses.leakage` for the methods.

    max_len: longest length audited (default the model's context, at most DEFAULT_MAX_LEN = 256; "ctx": the whole
    context); lengths: the lengths perturbed (default max_len, an odd middle length and 5); draws: resamplings per cut;
    max_cuts: cuts perturbed per length (None: all); gradient_len: length of the exhaustive Jacobian test (the gradient
    also runs cut by cut at max_len); tol: the lower bound of every threshold (default 5e-5, or 5e-3 for float16 /
    bfloat16 models), each judged against the model's measured floor (`floor`). Cost: about two forwards per prompt
    for a native model's truncation (the incremental reference), the coverage cuts for a black box; `progress=True`
    prints the estimate first (`report.coverage` says what ran). device / dtype: audit a moved copy of the model
    (`interp.launch.move`; an nn.Module only); the default tol follows the dtype. bidirectional: True audits the model
    as an encoder (future dependence by design; padding and batch still audited), False as a decoder; None (default)
    reads the model's own declaration (`declaration`: our HookedEncoder, a Hugging Face encoder config). An undeclared
    model is expected to be causal, whatever its attention calls look like.

    The contracts of modern stacks (`interp.analyses.leakage.contracts`; verdicts in `report.contracts[kind]`): packed /
    doc_sep (the forward's `position_ids`, `cu_seq_lens`, `document_ids`... or a separator token; packed_prompts: your
    own packed rows, the first holding doc_sep audited), window (W keys per windowed layer, itself included, or
    "config"), kv_cache (prefill + decode), attn_impls (compiled: FlexAttention as the model calls it, not unfused).
    """
    start = time.perf_counter()
    model = _audited_model(model, device=device, dtype=dtype)
    _check_methods(methods)
    adapter = ModelAdapter(model)
    plan = plan_audit(model, adapter, max_len=max_len, vocab_size=vocab_size, n_prompts=n_prompts, seed=seed, tol=tol,
                      lengths=lengths, methods=methods, draws=draws, max_cuts=max_cuts, gradient_len=gradient_len,
                      localise_leaks=localise_leaks, pad_token_id=pad_token_id, bidirectional=bidirectional)
    contract_options: dict[str, Any] = {"packed": packed, "doc_sep": doc_sep, "window": window, "kv_cache": kv_cache,
                                        "attn_impls": attn_impls, "packed_prompts": packed_prompts, "compiled": compiled}
    _check_contracts(model, plan, **contract_options)
    plan = _announced(model, adapter, plan, progress)
    tick = _Progress(progress, plan.passes)
    sites = site_modules(model) if plan.localise else []
    with _evaluating(model, tick):
        found = _find_leaks(model, adapter, plan, tick, sites)
    decision = decide_leaks(found.table, plan, leaks=found.leaks, located=found.located, localised=bool(sites))
    contracts = _run_contracts(model, plan, progress=progress, **contract_options)
    return _leakage_report(model, adapter, plan, found, decision, started=start, contracts=contracts)


def _announced(model: Any, adapter: ModelAdapter, plan: AuditPlan, progress: bool) -> AuditPlan:
    """The plan with its cost estimate printed first (a decoder audited with `progress`), else as it is."""
    if progress and not plan.bidirectional:
        return replace(plan, cost=leakage_fast.announce(model, adapter, **plan.cost_arguments()))
    return plan


def _check_contracts(model: Any, plan: AuditPlan, *, packed: bool, doc_sep: Any, window: Any, kv_cache: bool,
                     attn_impls: Any, packed_prompts: Any, compiled: bool) -> None:
    """The contract arguments against the model, before any forward pass: a BadInput (exit 2) when one cannot run."""
    from interp.analyses.leakage.contracts import check_contract_arguments

    check_contract_arguments(model, packed=packed, doc_sep=doc_sep, window=window, vocab=plan.vocab,
                             kv_cache=kv_cache, attn_impls=attn_impls, packed_prompts=packed_prompts,
                             max_len=plan.max_len, compiled=compiled)


def _run_contracts(model: Any, plan: AuditPlan, *, packed: bool, doc_sep: int | None, kv_cache: bool,
                   window: int | str | None, attn_impls: Sequence[str] | None, progress: bool,
                   packed_prompts: Sequence[Sequence[int]] | None, compiled: bool) -> dict[str, Any]:
    """The contract modes asked for (`contracts.run_contracts`), each after the causal audit, the model in eval mode."""
    if not (packed or doc_sep is not None or kv_cache or window is not None or attn_impls or packed_prompts is not None):
        return {}
    from interp.analyses.leakage.contracts import run_contracts

    was_training = getattr(model, "training", False)
    if isinstance(model, nn.Module):
        model.eval()
    try:
        return run_contracts(model, vocab=plan.vocab, packed=packed, doc_sep=doc_sep, kv_cache=kv_cache,
                             window=window if isinstance(window, int) else None, windowed=window == "config",
                             attn_impls=attn_impls, seed=plan.seed, progress=progress, max_len=plan.max_len,
                             packed_prompts=packed_prompts, compiled=compiled)
    finally:
        if isinstance(model, nn.Module) and was_training:
            model.train()


def _audited_model(model: Any, *, device: Device, dtype: DType) -> Any:
    """The model to audit: a spec (name or path) loaded as the CLI does (a factory without hooks is a black box, its
    construction recorded) and moved in place, since it is ours; a model given moved on a copy (`interp.launch.move`)."""
    spec = isinstance(model, (str, os.PathLike))
    if spec:
        from interp.loading import load_auditable

        with recording_construction() as attach:
            model = attach(load_auditable(model))
    return launch.move(model, device=device, dtype=dtype, copy=not spec)


@dataclass(frozen=True)
class _Findings:
    """Stages 2 and 3 of one audit: the noise floors, what the methods measured and its table, the leak kinds
    found, the hook site where each enters (`located`) and its line of code (`origins`)."""

    floors: Floors
    runs: MethodRuns
    table: pd.DataFrame
    leaks: tuple[str, ...]
    located: Localisation
    origins: dict[str, Origin]


def _find_leaks(model: Any, adapter: ModelAdapter, plan: AuditPlan, tick: _Progress,
                sites: list[tuple[str, nn.Module]]) -> _Findings:
    """The noise floors, every method of the plan, then where each kind of leak found enters (`sites`: [] skips it)."""
    floors = measure_audit_floors(model, adapter, plan)
    tick(1, "noise floor")
    runs = run_methods(model, adapter, plan, floors=floors, tick=tick)
    adapter.forget()  # the floor's runs served the methods; localisation watches its own forwards
    if floors.reference is not None:
        floors.reference.forget()
    table = findings_table(runs.rows)
    leaks = leak_kinds(table, plan)
    located = locate_leaks(adapter, runs, table, leaks=leaks, plan=plan, sites=sites)
    origins = locate_origins(adapter, runs, table, leaks=leaks, plan=plan) if plan.localise else {}
    tick(1, "localisation")
    return _Findings(floors, runs, table, leaks, located, origins)


def _leakage_report(model: Any, adapter: ModelAdapter, plan: AuditPlan, found: _Findings, decision: Decision, *,
                    started: float, contracts: dict[str, Any]) -> LeakageReport:
    """The audit's report: the decision, the findings and how they were reached (notes, floors, coverage), and the
    contracts' verdicts: a broken contract is a leak of its kind, located at its own origin."""
    runs, located, floors = found.runs, found.located, found.floors
    broken = tuple(kind for kind, result in contracts.items() if result.leaks)
    origins = {**found.origins, **{kind: contracts[kind].origin for kind in broken if contracts[kind].origin is not None}}
    verdict: LeakVerdict = "leak" if broken and decision.verdict != "bidirectional" else decision.verdict
    return LeakageReport(
        model_name=adapter.name, verdict=verdict, max_influence=decision.max_influence,
        first_leaking_site=decision.first_leaking_site, leaks=found.leaks + broken, table=found.table, sites=located.sites,
        first_leaking_sites=decision.first_leaking_sites, tol=plan.tol,
        lengths=tuple(sorted(set(plan.lengths) | {plan.max_len})), n_prompts=plan.n_prompts, methods=plan.methods,
        notes=tuple(runs.notes) + located.notes + _declaration_notes(model, plan, found.leaks) + _floor_notes(runs, adapter),
        seconds=time.perf_counter() - started, declared_by=plan.declared_by, incomplete=dict(runs.incomplete),
        origins=origins, noise_floor=floors.to_dict(), floor_how=floors.how,
        float64_checked=tuple(m for m in METHODS if m in runs.float64), coverage=_coverage(plan, runs),
        contracts=dict(contracts),
    )


def _declaration_notes(model: Any, plan: AuditPlan, leaks: Sequence[str]) -> tuple[str, ...]:
    """How the model was judged (declared, or expected causal), what the attention calls showed, and the way out."""
    notes = [f"bidirectional: {plan.declared_by}"] if plan.declared_by else []
    seen = observed_masking(model)
    if seen:
        notes.append(seen)
    if "future" in leaks and not plan.bidirectional:
        notes.append(BIDIRECTIONAL_HINT)
    return tuple(notes)


def _floor_notes(runs: MethodRuns, adapter: ModelAdapter) -> tuple[str, ...]:
    """How the comparisons were judged: the float64 copy deciding, and a floor without one (weaker)."""
    floors = runs.floors
    if floors is None:
        return ()
    notes = list(floors.notes)
    half = adapter.dtype in (torch.float16, torch.bfloat16)
    if runs.float64:
        worst = max((floors.floor(m) for m in runs.float64), default=0.0)
        notes.append(f"{'half precision: ' if half else ''}the model's own rounding reaches {worst:.2g} of the output "
                     f"scale, so {NOISE_FACTOR:g} times it exceeds {FLOAT64_DECIDES:g} and a leak of that size would "
                     f"hide under it: a float64 copy decided {', '.join(m for m in METHODS if m in runs.float64)}")
    elif half:
        notes.append("half precision: every comparison was judged against the model's own rounding, measured against "
                     "a float64 copy (noise_floor)")
    return tuple(notes)


def _coverage(plan: AuditPlan, runs: MethodRuns) -> dict[str, Any]:
    """What the audit covered (`AuditPlan.coverage`), with the precision each future method was decided in."""
    coverage = plan.coverage()
    for method in FUTURE_METHODS:
        if method in coverage:
            coverage[method]["float64"] = method in runs.float64
    return coverage


BIDIRECTIONAL_HINT = ("no declaration says this model is bidirectional, so it is expected to be causal; if it is meant "
                      "to attend both ways (an encoder), pass --bidirectional (audit(..., bidirectional=True))")


@contextlib.contextmanager
def _evaluating(model: Any, tick: _Progress) -> Iterator[None]:
    """The model in eval mode for the audit, its training flag restored and the progress bar closed after."""
    was_training = getattr(model, "training", False)
    if isinstance(model, nn.Module):
        model.eval()
    try:
        yield
    finally:
        tick.close()
        if isinstance(model, nn.Module) and was_training:
            model.train()
