"""Causal-leakage audit: can any output position depend on a later token, where does it enter, how much?

`audit(model)` accepts a HookedGPT / HookedEncoder, a TransformerBridge, any `nn.Module`, a
spec for `interp.load`, or any callable mapping a LongTensor (batch, seq) to a tensor
(batch, seq, ...). Attention weights alone prove nothing (a mask applied after the softmax
leaves a triangular pattern and leaks through the normaliser; normalisation or convolution over
time leaks with no attention at all), so the verdict rests on what the outputs do:

- truncation: the output at position q must not change when every position after a cut is
  removed. Run once per prefix length, it compares every length 1..L with the full length L and
  covers every (query, source) pair with a change that cannot miss: the later tokens are gone.
- perturbation: for each cut t, every token after t is replaced by a different token (shifted
  resampling, so each later position really changes), several draws, many cuts per forward pass;
  outputs at positions <= t must not move. Run at several lengths.
- gradient: the Jacobian of each position's output with respect to every later input embedding
  (through `hook_embed` or the token `nn.Embedding`): exactly zero for a correct model, so a
  leak of any size from one position into one other is seen; it counts a leak above
  tol * GRADIENT_TOL_FACTOR (its rounding is ~1e-8, its unit one source position's Jacobian).
- pattern: attention weight above the diagonal at every attention site (reported, never trusted alone).
- batch: an example's outputs must not depend on the other examples of its batch.
- padding: for models taking an `attention_mask`, pad-token content must not move real positions,
  and right padding must give real positions the outputs of the unpadded sequence.
- localisation: when a leak is found, the same paired runs are repeated with every hook point
  (or, for plain modules, every submodule output) captured, in forward order; the first site
  whose outputs at observed positions move is `first_leaking_site`.

Vocabulary: a *cut* t splits a sequence into observed positions <= t and changed positions > t;
*influence* is the largest absolute change of an observed output divided by the outputs' spread
(the root mean square of the outputs minus each feature's mean over batch and position, so a
common offset cannot hide a leak; floored at 1e-2 of the RMS, see `_scale`): 1e-4 means a change
of 1e-4 of the output scale; it is 0.0 exactly when nothing moved. Influences at or below `tol`
(default 5e-5) are float rounding ("numerical noise"): on 8 seeds of every correct zoo model
rounding reached 2.4e-6, 1.0e-5 under an offset of -300 (one ulp of the offset, at most 1.2e-5 by
construction of the floor), 1.2e-6 on random GPT-2 / HookedGPT models and 2.8e-5 on the trained
toy-induction model at 128 tokens (comparing different lengths runs different kernels), while the
smallest planted leak (about 1e-4 of the output) measured 9.96e-5 or more. A decoder that numbers
positions from the start of a left-padded row (Hugging Face GPT-2 without position_ids) gets a
note, not a leak: no information flows from the pads, which the pad-content test checks.
A model is expected to be causal unless it *declares* itself bidirectional (`declaration`: the
caller's `bidirectional=True`, our encoder configs, a Hugging Face encoder config with
`is_decoder=False`); what the attention calls look like is reported, never an excuse. A declared
encoder is reported as bidirectional by design; its padding mask and batch are audited instead.
Each leak is then located at its line of code (`leakage_origin`); `leakage_ci` renders the report
as SARIF and JUnit.

Layout (dependencies point down): `leakage_types` (methods, verdicts, the `Finding` row,
thresholds) <- `leakage_methods` (the adapter, the black-box methods, localisation) <-
`leakage_fast` (the incremental reference and the cost estimate), `leakage_origin` (the op and
line) <- this module: `LeakageReport` (the verdict's wording, defined here once, and its
renderings) and `audit`, run in stages: `plan_audit` (an `AuditPlan`), `run_methods`,
`locate_leaks` (hook sites) and `locate_origins` (lines of code), `decide` <- `leakage_ci`.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Literal, Sequence

import pandas as pd
import torch
from torch import nn

from interp.analyses import leakage_fast
from interp.analyses.leakage_fast import CostEstimate
from interp.analyses.leakage_origin import OpPair, Origin, batch_rows, find_origin, pair_length
from interp.analyses.leakage_methods import (  # noqa: F401  (re-exported: the audit's public and test-facing names)
    ModelAdapter,
    _accepts_attention_mask,
    _batch_pairs,
    _capturing,
    _change,
    _config,
    _embedding_leaf,
    _first,
    _first_tensor,
    _future_pairs,
    _generator,
    _observed,
    _odd_length,
    _Progress,
    _prompts,
    _resample,
    _rows,
    _scale,
    batch_mixing,
    declaration,
    declared_bidirectional,
    observed_masking,
    user_forward,
    embedding_module,
    gradient,
    half_precision_floors,
    NoiseFloor,
    infer_n_ctx,
    infer_vocab_size,
    localisation_threshold,
    localise,
    padding_check,
    pattern_check,
    perturbation,
    site_modules,
    truncation,
)
from interp.analyses.leakage_types import (  # noqa: F401  (re-exported)
    DEFAULT_TOL,
    FUTURE_METHODS,
    GRADIENT_TOL_FACTOR,
    HALF_PRECISION_TOL,
    NOISE_FACTOR,
    LEAK_KINDS,
    LOCALISE_FRACTION,
    MAX_ROWS_PER_METHOD,
    MAX_TOL,
    MAX_TOL_HALF,
    METHOD_KIND,
    METHODS,
    PATTERN_TOL,
    SITE_COLUMNS,
    SPREAD_FLOOR,
    TABLE_COLUMNS,
    TRUSTED,
    VERDICTS,
    Finding,
    LeakKind,
    Method,
    Pair,
    Verdict,
    above_threshold,
    check_tol,
    empty_table,
    findings_table,
    method_tol,
)
from interp import launch
from interp.launch import Device, DType
from interp.errors import ModelError
from interp.modelinfo import check_finite_weights


# ---------------------------------------------------------------------------------------------
# The report: the verdict's wording lives here, once; the CLI, the JSON and the HTML report use it
# ---------------------------------------------------------------------------------------------

VERDICT_WORDS: dict[str, str] = {  # `LeakageReport.headline` fills in {tol} and {leaks}
    "exact_zero": "causal: no output moved at all",
    "numerical_noise": "causal: outputs moved by float rounding only (<= tol {tol:g})",
    "leak": "LEAK ({leaks})",
    "bidirectional": "bidirectional (by design): an encoder attends both ways; its padding was audited",
}
Tone = Literal["ok", "leak", "neutral", "warn", "skipped"]
STATUS_TONE: dict[str, Tone] = {  # the status words of `LeakageReport.summary_rows`, for colouring
    "exact zero": "ok", "noise": "ok", "triangular": "ok", "leak": "leak", "weight above diagonal": "warn",
    "bidirectional": "neutral", "skipped": "skipped",
}


@dataclass(frozen=True, eq=False)
class LeakageReport:
    """What the audit found. `table` has one `Finding` per measured dependence worth showing (every
    value above tol, plus each method's maximum): `method`, `site`, `length`, `query_pos`,
    `source_pos`, `influence`, `detail`, and `ones_mask` (the run passed an all-ones
    attention_mask). For cut-based methods `source_pos` is the first changed position (all later
    ones changed too); for the gradient it is exact. `sites` lists the localisation, one row per
    site in forward order. Renderers (`__str__`, `to_dict`, the CLI, the HTML report) read the
    fields and `headline`; none parses text.
    """

    model_name: str
    verdict: Verdict
    max_influence: float  # largest trusted influence (relative to the output scale; for a bidirectional model only
    # the batch and padding methods count, future dependence being by design); nan if none measured
    first_leaking_site: str | None
    leaks: tuple[str, ...]  # kinds found: "future", "batch", "padding"
    table: pd.DataFrame
    sites: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SITE_COLUMNS))
    first_leaking_sites: dict[str, str | None] = field(default_factory=dict)  # per leak kind
    tol: float = DEFAULT_TOL
    lengths: tuple[int, ...] = ()
    n_prompts: int = 0
    methods: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    declared_by: str | None = None  # who declared the model bidirectional; None: it was expected to be causal
    incomplete: dict[str, str] = field(default_factory=dict)  # check -> why the model's call for it could not run; exit 1
    origins: dict[str, Origin] = field(default_factory=dict)  # leak kind -> the op and line where it appears

    @property
    def origin(self) -> Origin | None:
        """Where the first leak (in LEAK_KINDS order) appears: file, line, function, op, source line."""
        return next((self.origins[kind] for kind in self.leaks if kind in self.origins), None)

    @property
    def causal(self) -> bool:
        """No position read a later one, no example read another, padding was inert, every check ran."""
        return self.verdict in ("exact_zero", "numerical_noise") and not self.incomplete

    @property
    def bidirectional(self) -> bool:
        return self.verdict == "bidirectional"

    @property
    def exit_code(self) -> int:
        """0: nothing wrong (causal, or bidirectional by design with inert padding); 1: a leak, or a check
        the model calls for (padding, for a model taking an attention_mask) could not run."""
        return 1 if self.leaks or self.incomplete else 0

    @property
    def headline(self) -> str:
        """The verdict in words (VERDICT_WORDS), e.g. "LEAK (future)"; an encoder's padding leak is appended."""
        leaks = ", ".join(self.leaks)
        text = VERDICT_WORDS[self.verdict].format(tol=self.tol, leaks=leaks)
        if self.bidirectional and self.leaks:
            text += "; " + VERDICT_WORDS["leak"].format(leaks=leaks)
        if self.incomplete:
            text += "; INCOMPLETE (" + ", ".join(self.incomplete) + " not checked)"
        return text

    @property
    def title(self) -> str:
        """The first line of `str(report)`: which model, and the headline."""
        return f"Leakage audit of {self.model_name}: {self.headline}"

    @property
    def tone(self) -> Tone:
        """How a renderer colours the verdict: "leak" when anything leaked, "neutral" for an encoder, else "ok"."""
        if self.leaks:
            return "leak"
        return "neutral" if self.bidirectional else "ok"

    @property
    def ones_mask_only(self) -> bool:
        """A future leak was found, and only in runs given an all-ones attention_mask."""
        future = self._future_leak_rows()
        return bool(len(future)) and bool(future["ones_mask"].all())

    def _future_leak_rows(self) -> pd.DataFrame:
        if self.bidirectional:
            return self.table.iloc[:0]
        rows = self.table[self.table["method"].isin(FUTURE_METHODS)]
        return rows[above_threshold(rows, self.tol)]

    def summary_rows(self) -> list[dict[str, Any]]:
        """One row per method: its largest influence, where, and a status word (STATUS_TONE's keys)."""
        return [_summary_row(self, method) for method in self.methods]

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.summary_rows(), columns=["method", "status", "max_influence", "where"])

    def brief(self) -> dict[str, Any]:
        """The short form the HTML report's files keep (report.json, `ReportResult.leakage`)."""
        return {
            "verdict": self.verdict, "headline": self.headline, "causal": bool(self.causal), "leaks": list(self.leaks),
            "max_influence": None if math.isnan(self.max_influence) else float(self.max_influence),
            "first_leaking_site": self.first_leaking_site, "text": str(self),
            "summary": self.summary_rows(), "methods": list(self.methods), "lengths": list(self.lengths), "tol": self.tol,
        }

    def to_dict(self) -> dict[str, Any]:
        table = self.table.astype(object).where(self.table.notna(), None)
        sites = self.sites.astype(object).where(self.sites.notna(), None)
        return {
            "model": self.model_name, "causal": self.causal, "verdict": self.verdict, "headline": self.headline,
            "max_influence": None if math.isnan(self.max_influence) else self.max_influence,
            "first_leaking_site": self.first_leaking_site, "first_leaking_sites": self.first_leaking_sites,
            "leaks": list(self.leaks), "exit_code": self.exit_code, "tol": self.tol, "lengths": list(self.lengths),
            "n_prompts": self.n_prompts, "methods": list(self.methods), "notes": list(self.notes),
            "declared_by": self.declared_by, "incomplete": dict(self.incomplete),
            "origin": None if self.origin is None else self.origin.to_dict(),
            "origins": {kind: origin.to_dict() for kind, origin in self.origins.items()},
            "seconds": round(self.seconds, 3), "summary": _clean(self.summary_rows()),
            "table": _clean(table.to_dict("records")), "sites": _clean(sites.to_dict("records")),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=lambda v: v.item() if hasattr(v, "item") else str(v))

    def __str__(self) -> str:
        lines = [self.title]
        if not math.isnan(self.max_influence):
            lines.append(f"  max influence {self.max_influence:.3g} of the output scale")
        if self.first_leaking_site:
            lines.append(f"  first leaking site: {self.first_leaking_site}")
        lines += [f"  origin ({kind}): {origin}" for kind, origin in self.origins.items()]
        lines.append(f"  lengths {list(self.lengths)}, {self.n_prompts} prompts, {self.seconds:.1f} s")
        for row in self.summary_rows():
            value = "-" if row["max_influence"] is None else f"{row['max_influence']:.3g}"
            lines.append(f"  {row['method']:<13} {row['status']:<22} {value:>10}  {row['where']}")
        lines += [f"  note: {note}" for note in self.notes]
        lines += [f"  not checked: {reason}" for reason in self.incomplete.values()]
        return "\n".join(lines)


def _clean(records: list[dict]) -> list[dict]:
    """NaN and infinities as None, for JSON."""
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in records]


def _summary_row(report: LeakageReport, method: str) -> dict[str, Any]:
    """One method's line of the summary: status word, largest influence and where it was measured."""
    mine = report.table[report.table["method"] == method]
    if mine.empty:
        return {"method": method, "status": "skipped", "max_influence": None, "where": ""}
    top = mine.loc[mine["influence"].idxmax()]
    value = float(top["influence"])
    status = "leak" if value > float(top["threshold"]) else ("exact zero" if value == 0 else "noise")
    if method == "pattern":
        status = "weight above diagonal" if value > PATTERN_TOL else "triangular"
    elif report.bidirectional and METHOD_KIND[method] == "future":
        status = "bidirectional"
    source = "" if pd.isna(top["source_pos"]) else (
        f" reads {int(top['source_pos'])}" if method in ("gradient", "pattern")
        else f" when {int(top['source_pos'])}..{int(top['length']) - 1} changed")
    where = f"{top['site']} L={int(top['length'])} q={int(top['query_pos'])}{source}"
    return {"method": method, "status": status, "max_influence": value, "where": where}


def describe_row(row: Any) -> str:
    """One table row in plain words: which output moved, and what was changed to move it.

    For cut-based methods the source is the first of *all* the positions changed (a later token
    leaks in, which one is not known); the gradient names the exact pair.
    """
    method, query, length = row["method"], int(row["query_pos"]), int(row["length"])
    source = None if row["source_pos"] is None or pd.isna(row["source_pos"]) else int(row["source_pos"])
    size = f"{float(row['influence']):.3g}"
    mask = " with an all-ones attention_mask" if bool(row.get("ones_mask", False)) else ""
    if method == "gradient":
        return (f"gradient: the output at position {query} reads position {source}{mask} (exact pair; influence {size}, "
                f"length {length})")
    if method in ("truncation", "perturbation"):
        verb = "removed" if method == "truncation" else "resampled"
        return (f"{method}: the output at position {query} moved by {size} when positions {source}..{length - 1} were {verb}"
                f"{mask} (some later token leaks in; the gradient row names which)")
    if method == "pattern":
        return f"pattern: at {row['site']}, query {query} puts weight {size} on the later key {source} (length {length})"
    if method == "batch":
        return f"batch: the output at position {query} moved by {size} when another example of its batch changed (length {length})"
    return f"{method}: the output at real position {query} moved by {size} ({row['detail']}, length {length})"



def check_weights_finite(model: Any) -> None:
    """A ModelError naming NaN / inf weights (`interp.modelinfo.check_finite_weights`): the audit compares
    outputs, and NaN weights would be blamed on something else (a fully masked row) or hide a leak."""
    check_finite_weights(model)


# ---------------------------------------------------------------------------------------------
# Stage 1, the plan: what to run, fixed before any forward pass
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AuditPlan:
    """What `audit` runs: sizes, methods, thresholds, and the budget (progress steps, cost estimate)."""

    max_len: int  # longest length; truncation covers every prefix up to it
    vocab: int
    lengths: tuple[int, ...]  # perturbed lengths
    methods: tuple[str, ...]  # in METHODS order
    n_prompts: int
    draws: int  # resamplings per cut
    max_cuts: int | None  # cuts perturbed per length (None: all)
    gradient_len: int  # length of the Jacobian test (at most max_len)
    tol: float
    seed: int
    pad_id: int
    bidirectional: bool  # declared an encoder: future dependence is by design, not audited
    localise: bool  # localise leaks at every site
    declared_by: str | None = None  # who declared it bidirectional (`declaration`); None: a causal model is expected
    mask_variants: tuple[bool, ...] = (False,)  # ones_mask of each run of the future methods
    passes: int = 0  # progress-bar steps: truncation prefixes, perturbation / gradient chunks, other methods
    cost: CostEstimate | None = None  # tokens and ETA (`leakage_fast.estimate`), when progress is shown
    noise: NoiseFloor | None = None  # a half-precision model's own rounding (`half_precision_floors`)

    @property
    def tol_same(self) -> float:
        """The threshold of comparisons at one length (perturbation, batch, padding)."""
        return self.tol if self.noise is None else max(self.tol, NOISE_FACTOR * self.noise.same_length)

    @property
    def tol_length(self) -> float:
        """The threshold of comparisons across lengths (truncation): different lengths run different kernels."""
        return self.tol if self.noise is None else max(self.tol, NOISE_FACTOR * self.noise.across_lengths)

    def prompts(self, n: int, length: int) -> torch.Tensor:
        """The audit's random prompts (prompt, pos): the same for every method at a length."""
        return _prompts(n, length, self.vocab, self.seed)

    def cost_arguments(self) -> dict[str, Any]:
        """Keyword arguments of `leakage_fast.estimate` / `announce`."""
        return {"max_len": self.max_len, "vocab": self.vocab, "lengths": self.lengths, "n_prompts": self.n_prompts,
                "methods": self.methods, "draws": self.draws, "max_cuts": self.max_cuts,
                "gradient_len": self.gradient_len}


def _default_lengths(max_len: int) -> tuple[int, ...]:
    middle = (max_len // 2) | 1  # odd, so no position axis is mistaken for a head or width axis
    return tuple(sorted({max_len, max(2, min(middle, max_len)), min(5, max_len)}))


def _resolve_sizes(model: Any, max_len: int | None, vocab_size: int | None,
                   lengths: Sequence[int] | None) -> tuple[int, int, tuple[int, ...]]:
    """max_len, vocabulary size and perturbed lengths: given, or inferred from the model; checked."""
    n_ctx = infer_n_ctx(model)
    if max_len is None:
        if n_ctx is None:
            raise ValueError(
                f"cannot tell the context length of a {type(model).__name__}; pass max_len=N (the longest "
                "sequence the model accepts)."
            )
        max_len = n_ctx
    if n_ctx is not None and max_len > n_ctx:
        raise ValueError(f"max_len={max_len} exceeds the model's context n_ctx={n_ctx}; pass max_len<={n_ctx}.")
    if max_len < 2:
        raise ValueError(f"max_len={max_len}: a leak needs at least two positions; pass max_len>=2.")
    vocab = vocab_size or infer_vocab_size(model)
    if vocab is None or vocab < 2:
        raise ValueError(
            f"cannot tell the vocabulary size of a {type(model).__name__}; pass vocab_size=N (token ids 0..N-1)."
        )
    lengths = tuple(sorted(set(lengths))) if lengths is not None else _default_lengths(max_len)
    bad = [length for length in lengths if not 2 <= length <= max_len]
    if bad:
        raise ValueError(f"lengths {bad} are outside [2, max_len={max_len}]; pass lengths between 2 and {max_len}.")
    return max_len, vocab, lengths


def _check_methods(methods: Sequence[str]) -> tuple[str, ...]:
    """`methods` in METHODS order, or a ValueError naming the unknown ones."""
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; expected a subset of {list(METHODS)}.")
    return tuple(m for m in METHODS if m in methods)


def plan_audit(model: Any, adapter: ModelAdapter, *, max_len: int | None = None, vocab_size: int | None = None,
               n_prompts: int = 2, seed: int = 0, tol: float | None = None, lengths: Sequence[int] | None = None,
               methods: Sequence[str] = METHODS, draws: int = 2, max_cuts: int | None = 16, gradient_len: int = 24,
               localise_leaks: bool = True, pad_token_id: int | None = None,
               bidirectional: bool | None = None) -> AuditPlan:
    """Check `audit`'s arguments against the model and fix what it will run (no forward pass)."""
    methods = _check_methods(methods)
    if tol is None:  # rounding of the model's own precision: half-precision models round 1e3 times coarser
        tol = HALF_PRECISION_TOL if adapter.dtype in (torch.float16, torch.bfloat16) else DEFAULT_TOL
    check_tol(tol, adapter.dtype)
    check_weights_finite(model)
    if n_prompts < 1 or draws < 1:
        raise ValueError(f"n_prompts={n_prompts} and draws={draws} must both be at least 1.")
    max_len, vocab, lengths = _resolve_sizes(model, max_len, vocab_size, lengths)
    declared = declaration(model, bidirectional)
    plan = AuditPlan(
        max_len=max_len, vocab=vocab, lengths=lengths, methods=methods, n_prompts=n_prompts, draws=draws,
        max_cuts=max_cuts, gradient_len=min(gradient_len, max_len), tol=float(tol), seed=seed,
        pad_id=pad_token_id if pad_token_id is not None else getattr(_config(model), "pad_token_id", None) or 0,
        bidirectional=declared is not None, declared_by=declared, localise=localise_leaks,
        mask_variants=(False, True) if adapter.takes_mask else (False,),
    )
    if not plan.bidirectional and not ({"truncation", "perturbation"} & set(methods)) and _embedding(model, plan) is None:
        reason = ["gradient skipped: no input embedding found (a black-box callable)"] if "gradient" in methods else []
        raise ValueError(_no_future_method_message(methods, reason))
    return replace(plan, passes=_planned_passes(plan, adapter))


def _embedding(model: Any, plan: AuditPlan) -> nn.Module | None:
    """Where the gradient test differentiates: the input embedding, if the gradient runs at all."""
    return embedding_module(model, plan.vocab) if "gradient" in plan.methods and not plan.bidirectional else None


def _planned_passes(plan: AuditPlan, adapter: ModelAdapter) -> int:
    """Progress-bar steps: one per truncation prefix, perturbation or gradient chunk, other method."""
    steps = 1 + sum(m in plan.methods for m in ("batch", "padding"))  # + localisation
    if plan.bidirectional:
        return steps
    future = plan.max_len - 1 if "truncation" in plan.methods else 0
    steps += "pattern" in plan.methods
    if "perturbation" in plan.methods:
        for length in plan.lengths:
            cuts = length - 1 if plan.max_cuts is None else min(length - 1, plan.max_cuts)
            future += math.ceil(plan.n_prompts * cuts * plan.draws / adapter.rows_per_forward(length))
    if "gradient" in plan.methods:
        future += math.ceil((plan.gradient_len - 1) / adapter.rows_per_forward(plan.gradient_len))
    return steps + future * len(plan.mask_variants)  # with a mask of ones too


def _no_future_method_message(methods: Sequence[str], notes: Sequence[str]) -> str:
    why = "; ".join(note for note in notes if "skipped" in note)
    return (
        f"methods={tuple(methods)} cannot show a dependence on later tokens for this model"
        + (f" ({why})" if why else "")
        + ": a causal verdict needs at least one of 'truncation' or 'perturbation' (any model) or 'gradient' "
        "(models with an nn.Embedding or hook_embed); 'pattern' is never trusted alone. Include them, e.g. "
        "methods=('truncation', 'perturbation', 'gradient'), or leave methods at its default."
    )


# ---------------------------------------------------------------------------------------------
# Stage 2, the methods: every row the plan asks for
# ---------------------------------------------------------------------------------------------

@dataclass
class MethodRuns:
    """What the methods measured, before localisation and the verdict."""

    adapter: ModelAdapter  # the adapter the later methods ran: one example per forward if the batch mixes
    rows: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    future_influence: dict[bool, dict[int, torch.Tensor]] = field(
        default_factory=lambda: {False: {}, True: {}})  # ones_mask -> length -> (cut, query), where above tol
    padding_pair: Pair | None = None  # the worst pad-content pair, for localisation
    incomplete: dict[str, str] = field(default_factory=dict)  # check -> why it could not run


@torch.no_grad()
def run_methods(model: Any, adapter: ModelAdapter, plan: AuditPlan, *, tick: Any = lambda *a, **k: None) -> MethodRuns:
    """Run every method of the plan in order: batch, the future methods (or, for an encoder, one
    perturbation), pattern, padding. A ValueError if no method could show a future leak."""
    runs = MethodRuns(adapter=adapter)
    long_prompts = plan.prompts(max(plan.n_prompts, 2), plan.max_len)  # (prompt, pos)
    if "batch" in plan.methods:
        mixing = batch_mixing(adapter, long_prompts, plan.vocab, plan.tol_same, seed=plan.seed)
        runs.rows += mixing
        tick(1, "batch")
        if any(row["influence"] > plan.tol_same for row in mixing):
            runs.adapter = adapter.one_per_forward()  # mixing must not pose as a leak in the other methods
            runs.notes.append("the model mixes examples of a batch: the other tests ran one example per forward pass")
    if plan.bidirectional:
        short = plan.prompts(plan.n_prompts, plan.lengths[0])
        runs.rows += perturbation(runs.adapter, short, plan.vocab, plan.tol_same, draws=1, seed=plan.seed,
                                  max_cuts=plan.max_cuts)[0]
        runs.notes.append("declared bidirectional (an encoder): future dependence is by design and not counted")
    else:
        _run_future(model, runs, plan, prompts=long_prompts, tick=tick)
        if "pattern" in plan.methods:
            pattern_rows, note = pattern_check(model, runs.adapter, plan.prompts(plan.n_prompts, plan.max_len), plan.tol)
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
    for ones_mask in plan.mask_variants:
        variant = runs.adapter.with_ones_mask() if ones_mask else runs.adapter
        try:
            rows, found, gradient_failed = _run_variant(model, variant, plan, prompts=prompts, embed=embed, tick=tick)
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


def _run_variant(model: Any, variant: ModelAdapter, plan: AuditPlan, *, prompts: torch.Tensor,
                 embed: nn.Module | None, tick: Any) -> tuple[list[Finding], dict[int, torch.Tensor], bool]:
    """Truncation, perturbation and gradient through one adapter: rows, the perturbation influence
    (cut, query) per length where it is above tol, and whether the gradient found no usable embedding."""
    rows: list[Finding] = []
    found: dict[int, torch.Tensor] = {}
    if "truncation" in plan.methods:
        rows += leakage_fast.truncation_rows(model, variant, prompts[:plan.n_prompts], plan.tol_length, progress=tick)
    if "perturbation" in plan.methods:
        for length in plan.lengths:
            perturbed, influence = perturbation(
                variant, plan.prompts(plan.n_prompts, length), plan.vocab, plan.tol_same, draws=plan.draws, seed=plan.seed,
                progress=tick, max_cuts=leakage_fast.perturbation_cuts(model, length, plan.max_cuts))
            rows += perturbed
            if float(influence.nan_to_num(0.0).max()) > plan.tol_same:
                found[length] = influence
    gradient_failed = False
    if "gradient" in plan.methods and embed is not None:
        grad_rows = gradient(variant, embed, plan.prompts(1, plan.gradient_len)[0], method_tol("gradient", plan.tol),
                             seed=plan.seed, progress=tick)
        gradient_failed = not grad_rows
        rows += grad_rows
    return rows, found, gradient_failed


def _run_padding(runs: MethodRuns, plan: AuditPlan) -> None:
    """Pad content and right padding against the unpadded run, for models that take an attention_mask."""
    if not runs.adapter.takes_mask:
        runs.notes.append("padding skipped: the model takes no attention_mask")
        return
    try:
        rows, notes, worst = padding_check(runs.adapter, plan.prompts(plan.n_prompts, _odd_length(plan.max_len)),
                                           plan.vocab, plan.tol_same, pad_id=plan.pad_id, seed=plan.seed,
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
        pairs = _batch_pairs(plan.prompts(2, _odd_length(plan.max_len)), plan.vocab, plan.seed)
        located["batch"] = localise(adapter, sites, pairs, plan.tol)
    pair = runs.padding_pair
    if pair is not None and pair["influence"] > plan.tol:
        located["padding"] = localise(runs.adapter, sites, [pair], plan.tol)
    if "future" in leaks:
        located["future"], notes = _localise_future_leak(runs, table, plan, sites)
    frame = (pd.concat([found.assign(kind=kind) for kind, found in located.items()], ignore_index=True)[SITE_COLUMNS]
             if located else pd.DataFrame(columns=SITE_COLUMNS))
    return Localisation(frame, {kind: _first(found) for kind, found in located.items()}, notes)


def _localise_future_leak(runs: MethodRuns, table: pd.DataFrame, plan: AuditPlan,
                          sites: list[tuple[str, nn.Module]]) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """Localise a future leak through the mask variant that showed it (the all-ones mask when only it did)."""
    rows = _trusted(table, plan)
    rows = rows[rows["method"].isin(FUTURE_METHODS) & above_threshold(rows, plan.tol)]
    masked = bool(rows["ones_mask"].all())  # seen only with a mask of ones
    notes = ["the future leak appears only when the model is given an all-ones attention_mask"] if masked else []
    located = _localise_future(runs.adapter.with_ones_mask() if masked else runs.adapter, sites, plan,
                               found=runs.future_influence[masked], table=rows[rows["ones_mask"] == masked])
    if _first(located) is None:
        notes.append("the leak did not reproduce under token resampling at any site (it depends on the "
                     "presence of later positions rather than their content); localise it by hand")
    return located, tuple(notes)


def _localise_future(adapter: ModelAdapter, sites: list[tuple[str, nn.Module]], plan: AuditPlan, *,
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
    return localise(adapter, sites, _future_pairs(prompt, cuts, plan.vocab, plan.seed), plan.tol)


def _localisation_length(found: dict[int, torch.Tensor]) -> int:
    odd = [length for length in found if length % 2 and length >= 5]
    return max(odd) if odd else max(found)


# ---------------------------------------------------------------------------------------------
# Stage 3b, the line of code: the first op where each kind of leak appears (`leakage_origin`)
# ---------------------------------------------------------------------------------------------

def locate_origins(adapter: ModelAdapter, runs: MethodRuns, table: pd.DataFrame, *, leaks: Sequence[str],
                   plan: AuditPlan) -> dict[str, Origin]:
    """Per leak kind, the op (file, line, function, source) where an observed output first moves."""
    model = adapter.model
    origins: dict[str, Origin] = {}
    for kind in leaks:
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

    verdict: Verdict
    max_influence: float
    first_leaking_site: str | None
    first_leaking_sites: dict[str, str | None]


def decide(table: pd.DataFrame, plan: AuditPlan, *, leaks: Sequence[str], located: Localisation,
           localised: bool) -> Decision:
    """Verdict from the trusted rows: bidirectional (declared), leak (any kind found), else exact zero
    or rounding. Without localisation (`localised` False) every leak is placed at the output."""
    everything = _trusted(table, plan)  # an encoder's headline is what was audited, not its by-design future
    max_influence = float(everything["influence"].max()) if not everything.empty else math.nan
    verdict: Verdict
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
# The entry point: plan, run, localise, decide
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
) -> LeakageReport:
    """Audit `model` for dependence of any output position on later tokens (and on other examples
    of its batch, and on padding). Returns a `LeakageReport`; see the module docstring for methods.

    max_len: longest length audited (default cfg.n_ctx); lengths: the lengths perturbed (default
    max_len, an odd middle length and 5; truncation always covers every length up to max_len);
    draws: resamplings per cut; max_cuts: cuts perturbed per length (None: all; truncation and the
    gradient cover every cut regardless); gradient_len: length of the Jacobian test; tol: largest
    influence called rounding (default 5e-5, or 2e-2 for float16 / bfloat16 models). Cost: the
    truncation runs every prefix of max_len (about n_prompts * max_len^2 / 2 tokens), so for
    long contexts pass a smaller max_len or watch `progress=True`. device / dtype: audit a moved
    copy of the model (`interp.launch.move`; an nn.Module only); the default tol follows the dtype.
    bidirectional: True audits the model as an encoder (future dependence by design; padding and
    batch still audited), False as a decoder; None (default) reads the model's own declaration
    (`declaration`: our HookedEncoder, a Hugging Face encoder config). An undeclared model is
    expected to be causal, whatever its attention calls look like.
    """
    start = time.perf_counter()
    spec = isinstance(model, (str, os.PathLike))
    if spec:  # as the CLI does: a factory without hooks is a black box
        from interp.loading import load_auditable

        model = load_auditable(model)
    model = launch.move(model, device=device, dtype=dtype, copy=not spec)  # a loaded spec is ours to move
    _check_methods(methods)
    adapter = ModelAdapter(model)
    plan = plan_audit(model, adapter, max_len=max_len, vocab_size=vocab_size, n_prompts=n_prompts, seed=seed, tol=tol,
                      lengths=lengths, methods=methods, draws=draws, max_cuts=max_cuts, gradient_len=gradient_len,
                      localise_leaks=localise_leaks, pad_token_id=pad_token_id, bidirectional=bidirectional)
    if progress and not plan.bidirectional:
        plan = replace(plan, cost=leakage_fast.announce(model, adapter, **plan.cost_arguments()))
    plan = replace(plan, noise=half_precision_floors(model, adapter, plan.prompts(max(plan.n_prompts, 2), plan.max_len)))
    tick = _Progress(progress, plan.passes)
    sites = site_modules(model) if plan.localise else []
    with _evaluating(model, tick):
        runs = run_methods(model, adapter, plan, tick=tick)
        table = findings_table(runs.rows)
        leaks = leak_kinds(table, plan)
        located = locate_leaks(adapter, runs, table, leaks=leaks, plan=plan, sites=sites)
        origins = locate_origins(adapter, runs, table, leaks=leaks, plan=plan) if plan.localise else {}
        tick(1, "localisation")
    decision = decide(table, plan, leaks=leaks, located=located, localised=bool(sites))
    return LeakageReport(
        model_name=adapter.name, verdict=decision.verdict, max_influence=decision.max_influence,
        first_leaking_site=decision.first_leaking_site, leaks=leaks, table=table, sites=located.sites,
        first_leaking_sites=decision.first_leaking_sites, tol=plan.tol,
        lengths=tuple(sorted(set(plan.lengths) | {plan.max_len})), n_prompts=plan.n_prompts, methods=plan.methods,
        notes=tuple(runs.notes) + located.notes + _declaration_notes(model, plan, leaks), seconds=time.perf_counter() - start,
        declared_by=plan.declared_by, incomplete=dict(runs.incomplete), origins=origins,
    )


def _declaration_notes(model: Any, plan: AuditPlan, leaks: Sequence[str]) -> tuple[str, ...]:
    """How the model was judged (declared, or expected causal), what the attention calls showed, and the way out."""
    notes = [f"bidirectional: {plan.declared_by}"] if plan.declared_by else []
    if plan.noise is not None:
        notes.append(f"half precision: rounding measured on the model itself is {plan.noise}; changes count as leaks "
                     f"above {plan.tol_same:.3g} at one length and {plan.tol_length:.3g} across lengths")
    seen = observed_masking(model)
    if seen:
        notes.append(seen)
    if "future" in leaks and not plan.bidirectional:
        notes.append(BIDIRECTIONAL_HINT)
    return tuple(notes)


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
