"""The report's computation: every analysis on one model into a `ReportData` (typed results, no files).

`compute` runs the stages (leakage audit, mean patterns, positional metrics, offset profiles,
claims, head similarity, importance, joint ablation, viewer, circuit, why heads attend) under one progress bar; the
metrics come from `interp.analyses.report.metrics`, the header and provenance from `.context`,
the Methods paragraphs from `.methods`. Each claims row keeps its `interp.claims.Verdict` (None
for a claims file's) and its subject heads as (layer, head) integers (`ReportData.claim_rows`).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
import pandas as pd
from torch import nn

import interp.analyses.report.format as fmt
import interp.launch as launch
from interp.analyses.claims.registry import NOT_MEASURED, bridge_without_pattern_edits, claim_evidence_for, run_claims
from interp.analyses.report.attend import report_attend, viewer_pairs
from interp.analyses.report.circuit import report_circuit
from interp.analyses.report.context import default_prompt_spec, model_name, model_summary, prompt_warnings, provenance
from interp.analyses.report.methods import behaviour_method, paragraphs
from interp.analyses.report.metrics import head_metrics, mean_patterns, offset_profiles, select_heads
from interp.claims import DEFAULT_EVIDENCE
from interp.data import PromptSet
from interp.heads import head_label, parse_head
from interp.hooks import attention_sites
from interp.launch import Device, DType
from interp.validate import check_layers, check_model, check_prompt_arg, check_seed, check_whole
from interp.viewer import viewer_data

if TYPE_CHECKING:
    from interp.progress import Stages

MAX_CARDS = 64  # more heads than this make an unreadable page: narrow with layers= / heads=, or raise max_cards
DEFAULT_N = 64  # prompts for the observational metrics
LEAKAGE_LEN = 256  # longest sequence the leakage audit runs, at most the model's context (leakage.DEFAULT_MAX_LEN)
TOP_PAIRS = 3  # most similar head pairs tested by joint ablation
COLOUR_SCALES = ("common", "per_head")  # pattern heat maps: one 0..1 scale for all, or each head's own maximum

Heads = tuple[tuple[int, int], ...]  # a claim's subject heads as (layer, head); () for a whole-model claim


class ReportTooLarge(ValueError):
    """The report would have more head cards than MAX_CARDS; the message says how to narrow it."""


@dataclass
class ReportData:
    """Everything a report shows; `render` turns it into files."""

    summary: dict[str, Any]
    heads: pd.DataFrame  # one row per head: metrics, CIs, importance, verdicts
    claims: pd.DataFrame  # one row per claim
    patterns: dict[int, np.ndarray]  # layer -> (head, query, key) mean pattern
    offsets: pd.DataFrame | None  # layer, head, offset, weight
    similarity: pd.DataFrame | None  # labelled (label x label) pattern similarity
    importance: pd.DataFrame | None  # layer, head, importance, ci_low, ci_high
    redundancy: pd.DataFrame | None  # joint-ablation findings on the top pairs
    leakage: Any  # the audit's interp.analyses.leakage.LeakageReport, or None when not audited
    methods: list[str]
    settings: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    verdicts: list = field(default_factory=list)  # per claims row: its interp.claims.Verdict, or None (claims file)
    claim_heads: list[Heads] = field(default_factory=list)  # per claims row: its subject heads
    viewer: Any = None  # interp.viewer.ViewerData, or None
    warnings: list[str] = field(default_factory=list)  # prompts that cannot support a claim, and why
    provenance: dict[str, Any] = field(default_factory=dict)  # versions, commit, seed, prompt hash, wall time
    title: str = ""  # the model's name
    circuit: Any = None  # interp.analyses.report.circuit.CircuitSection, or None (not asked for)
    attend: Any = None  # interp.analyses.report.attend.AttendSection, or None (not asked for)

    def claim_rows(self) -> list[tuple[pd.Series, Any, Heads]]:
        """Each claims row with its Verdict (None for a claims file's) and its subject heads."""
        if len(self.claim_heads) != len(self.claims):
            raise ValueError(f"ReportData has {len(self.claims)} claims rows but {len(self.claim_heads)} claim_heads; "
                             "give each row its subject heads ((layer, head), ...), () for a model claim.")
        verdicts = self.verdicts or [None] * len(self.claims)
        return [(row, v, h) for (_, row), v, h in zip(self.claims.iterrows(), verdicts, self.claim_heads)]


@dataclass
class ReportResult:
    """Where the report went and its headline tables."""

    out_dir: Path
    heads: pd.DataFrame
    claims: pd.DataFrame
    highlights: pd.DataFrame
    leakage: dict[str, Any] | None
    timings: dict[str, float]
    data: ReportData | None = field(default=None, repr=False)  # everything the report shows (verdicts included)
    behaviour: dict[str, Any] | None = None  # what the causal evidence measured (`Behaviour.spec()` + "measured")

    def to_json(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "behaviour": self.behaviour,
            "leakage": self.leakage,
            "highlights": json.loads(self.highlights.to_json(orient="records")),
            "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
        }


def report_stages(names: list[str], progress: bool | Stages) -> Stages:
    """The stages `names` under one bar: added to the caller's `interp.progress.Stages` when `progress` is
    one (build_report keeps it open across compute and render), else a new bar when `progress` is True."""
    from interp.progress import Stages

    if isinstance(progress, Stages):
        return progress.extend(names)
    return Stages(names, bool(progress), description="report")


def compute(
    model: nn.Module,
    *,
    spec: str | None = None,
    prompt_spec=None,
    prompts: PromptSet | None = None,
    layers: Iterable[int] | None = None,
    heads: Iterable[tuple[int, int]] | None = None,
    claims_file=None,
    seed: int = 0,
    leakage_len: int = LEAKAGE_LEN,
    progress: bool | Stages = False,
    max_cards: int = MAX_CARDS,
    colour_scale: str = "common",
    behaviour=None,
    device: Device = None,
    dtype: DType = None,
    bidirectional: bool | None = None,
) -> ReportData:
    """Run every analysis the report shows; no files are written.

    Without `prompt_spec` / `prompts`, text models (those with a tokenizer) get the shipped
    corpus through their tokenizer (special tokens included), others repeated random tokens.
    `colour_scale`: "common" (every pattern heat map on 0..1) or "per_head" (each its own maximum).
    `device` / `dtype`: every analysis runs on one moved copy of the model (`interp.launch.move`).
    `bidirectional`: the leakage audit's declaration (`interp.analyses.leakage.audit`); None reads the model's own.
    """
    started = time.perf_counter()
    _check_colour_scale(colour_scale)
    check_model(model, "report")
    seed, layers = check_seed(seed, "report"), check_layers(layers, "report")
    if prompts is not None:
        check_prompt_arg(prompts, "report")
    leakage_len = report_max_len(model, leakage_len)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    chosen = select_heads(model, layers, heads)
    check_card_limit(len(chosen), max_cards, len(attention_sites(model)))
    prompt_spec, prompts = _report_prompts(model, prompt_spec, prompts, seed)
    has_loss = _has_meaningful_loss(model)
    evidence = claim_evidence_for(model)
    measured = report_behaviour(model, prompts, behaviour)
    results, timings = _run_stages(model, prompts, chosen, claims_file, seed=seed, leakage_len=leakage_len,
                                   has_loss=has_loss, evidence=evidence, progress=progress, behaviour=measured,
                                   bidirectional=bidirectional)
    claims, verdicts, claim_heads = results["claims"]
    heads_frame = _heads_table(results["metrics"], results["importance"], claims, claim_heads)
    methods = paragraphs(prompts, seed=seed, leakage=results["leakage"], has_loss=has_loss, claims=claims,
                         verdicts=verdicts, top_pairs=TOP_PAIRS)
    methods += restricted_cost(model, chosen, timings)
    settings = _settings(spec, seed, prompt_spec, prompts, chosen, colour_scale=colour_scale, evidence=evidence,
                         max_cards=max_cards)
    summary = model_summary(model, spec)
    _name_behaviour(model, measured, prompts, methods, settings, summary)
    data = ReportData(summary, heads_frame, claims, results["patterns"], results["offsets"],
                      results["similarity"], results["importance"], results["redundancy"], results["leakage"], methods,
                      settings, timings, verdicts=verdicts, claim_heads=claim_heads, viewer=results["viewer"],
                      warnings=prompt_warnings(model, prompts), title=model_name(model, spec), circuit=results["circuit"],
                      attend=results["attend"])
    data.provenance = provenance(seed, prompts, time.perf_counter() - started)
    return data


def _report_prompts(model: nn.Module, prompt_spec, prompts: PromptSet | None, seed: int) -> tuple[Any, PromptSet]:
    """The prompt spec (default: `default_prompt_spec`) and the prompts: those given, else the spec's, built for `model`."""
    from interp.specs import build_prompts

    prompt_spec = prompt_spec or default_prompt_spec(model, seed)
    if prompts is None:
        prompts = build_prompts(model, prompt_spec, default_n=DEFAULT_N)
    return prompt_spec, prompts


def _settings(spec: str | None, seed: int, prompt_spec, prompts: PromptSet, chosen: list[tuple[int, int]], *,
              colour_scale: str, evidence, max_cards: int) -> dict[str, Any]:
    """What the report was asked for, as report.json records it."""
    return {"spec": spec, "seed": seed, "prompts": {**prompt_spec.to_dict(), "n": len(prompts), "n_pos": prompts.n_pos},
            "heads": list(map(head_label, chosen)), "colour_scale": colour_scale,
            "evidence": list(evidence or DEFAULT_EVIDENCE), "max_cards": max_cards}


def _run_stages(model, prompts, chosen, claims_file, *, seed, leakage_len, has_loss, evidence, progress, behaviour,
                bidirectional=None):
    """Every measurement of the report, timed, under one progress bar: stage name -> result."""
    layers = sorted({l for l, _ in chosen})
    stages = {
        "leakage audit": lambda: _leakage(model, seed=seed, max_len=leakage_len, bidirectional=bidirectional),
        "mean patterns": lambda: mean_patterns(model, prompts, layers),
        "positional metrics": lambda: head_metrics(model, prompts, seed=seed, heads=chosen),
        "offset profiles": lambda: offset_profiles(model, prompts, layers=layers),
        "claims": lambda: _claims(model, prompts, claims_file, seed=seed, chosen=chosen, evidence=evidence,
                                  behaviour=behaviour),
        "head similarity": lambda: _similarity(model, prompts, chosen, seed=seed),
        "importance": lambda: _importance(model, prompts, seed=seed, behaviour=behaviour, heads=chosen) if has_loss else None,
        "joint ablation": lambda: (_joint(model, prompts, results["similarity"], seed=seed, behaviour=behaviour)
                                   if has_loss else None),
        "viewer": lambda: viewer_data(model, prompts, chosen),
        "circuit": lambda: report_circuit(model, prompts, seed=seed, behaviour=behaviour, has_loss=has_loss),
        "why heads attend": lambda: _attend(model, prompts, results),
    }
    keys = {"leakage audit": "leakage", "mean patterns": "patterns", "positional metrics": "metrics",
            "offset profiles": "offsets", "claims": "claims", "head similarity": "similarity", "importance": "importance",
            "joint ablation": "redundancy", "viewer": "viewer", "circuit": "circuit", "why heads attend": "attend"}
    results: dict[str, Any] = {}
    with report_stages(list(stages), progress) as run:
        for name, fn in stages.items():
            results[keys[name]] = run.run(name, fn)
    return results, dict(run.timings)


def _attend(model: nn.Module, prompts: PromptSet, results: dict[str, Any]) -> Any:
    """The section "Why these heads attend", and the source pairs behind the viewer's cells of the same heads."""
    claims, _, claim_heads = results["claims"]
    section = report_attend(model, prompts, claims, claim_heads)
    viewer = results.get("viewer")
    if viewer is not None and section.heads:
        shown = set(viewer.heads)
        heads = [parse_head(h.label) for h in section.heads if h.label in shown]
        viewer.qk = viewer_pairs(model, prompts, [(h.layer, h.head) for h in heads]) if heads else {}
    return section


PER_HEAD_STAGES = ("claims", "importance", "head similarity")  # stages whose cost grows with the heads chosen


def restricted_cost(model: nn.Module, chosen: list[tuple[int, int]], timings: dict[str, float]) -> list[str]:
    """A Methods line when the report covers some heads only: the per-head stages (scan claims, importance, pattern
    similarity) ran on those, and what the same stages would take for every head, extrapolated from their time here
    (claims and importance grow with the heads, similarity with their pairs)."""
    n_all = sum(site.n_heads for site in attention_sites(model))
    if not chosen or len(chosen) >= n_all:
        return []
    scale = n_all / len(chosen)
    spent = {name: timings.get(name, 0.0) for name in PER_HEAD_STAGES}
    estimate = (spent["claims"] + spent["importance"]) * scale + spent["head similarity"] * scale ** 2
    return [f"Scan claims, importance and head similarity ran on the {len(chosen)} chosen heads only (here "
            f"{sum(spent.values()):.0f} s); for all {n_all} heads of the model they would take about "
            f"{_duration(estimate)} on this machine (claims and importance grow with the heads, similarity with their "
            "pairs)."]


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def check_card_limit(n_cards: int, max_cards: int, n_layers: int) -> None:
    """Refuse more head cards than `max_cards`, saying how to narrow the selection or raise the limit."""
    if n_cards > max_cards:
        per_layer = max(1, n_cards // max(1, n_layers))
        raise ReportTooLarge(
            f"the report would have {n_cards} head cards (limit {max_cards}); narrow it with --layers "
            f"(e.g. --layers 0-{max(0, min(n_layers, max_cards // per_layer) - 1)}) or --heads L0H1,L1H2,..., "
            f"or raise the limit with --max-cards {n_cards}."
        )


def heads_before_loading(spec: str | None) -> tuple[int, int] | None:
    """(layers, heads per layer) read from a spec's config file without loading weights, when it has one:
    a Hugging Face folder's config.json, our checkpoint's JSON (a built-in name or a .safetensors path), or a
    GGUF file's metadata (a .gguf path or a packaged built-in such as smollm2-135m)."""
    if not spec:
        return None
    from interp.pretrained import gguf_shape, packaged_path
    from interp.specnames import PACKAGED

    if str(spec) in PACKAGED or (str(spec).lower().endswith(".gguf") and Path(str(spec)).is_file()):
        try:
            return gguf_shape(packaged_path(str(spec)) if str(spec) in PACKAGED else Path(str(spec)))
        except ValueError:  # the package is not installed: the load says so
            return None
    path = Path(str(spec))
    candidates = [path / "config.json"] if path.is_dir() else [path.with_suffix(".json")] if path.suffix else []
    if not path.exists() and not path.suffix:
        from interp.loading import BUILTINS, CHECKPOINT_DIR

        candidates = [CHECKPOINT_DIR / f"{BUILTINS[str(spec)]}.json"] if str(spec) in BUILTINS else []
    for candidate in candidates:
        try:
            config = json.loads(candidate.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        config = config.get("config", config) if isinstance(config, dict) else {}
        layers = config.get("n_layers", config.get("num_hidden_layers"))
        heads = config.get("n_heads", config.get("num_attention_heads"))
        if isinstance(layers, int) and isinstance(heads, int):
            return layers, heads
    return None


def check_cards_before_loading(spec: str | None, layers, heads, max_cards: int) -> None:
    """The card limit, checked from the config file alone (so a too-large report fails before a slow load)."""
    shape = heads_before_loading(spec)
    if shape is None:
        return
    n_layers, per_layer = shape
    if heads is not None:
        n_cards = len(list(heads))
    else:
        n_cards = per_layer * (len([l for l in layers if 0 <= l < n_layers]) if layers is not None else n_layers)
    check_card_limit(n_cards, max_cards, n_layers)


def _check_colour_scale(colour_scale: str) -> None:
    if colour_scale not in COLOUR_SCALES:
        raise ValueError(f"colour_scale={colour_scale!r}; expected one of {list(COLOUR_SCALES)}.")


def _has_meaningful_loss(model: nn.Module) -> bool:
    """Whether ablations measure something: every model has a behaviour (`interp.behaviour.default_behaviour`:
    the next-token loss, or the sentence-embedding change for an encoder or a random head), and z ablations
    take effect even through the bridge."""
    return True


def report_behaviour(model: nn.Module, prompts: PromptSet, behaviour=None):
    """The behaviour a report measures: the one given, else the model's; a next-token loss scores the
    repeated copies of repeated prompts, else every position (as the report always has)."""
    from interp.behaviour import as_behaviour

    return as_behaviour(behaviour, model, positions="repeats" if prompts.meta.get("kind") == "repeated" else "all")


def _name_behaviour(model: nn.Module, behaviour, prompts: PromptSet, methods: list[str], settings: dict,
                    summary: dict) -> None:
    """State the behaviour in the Methods (and which evidence a bridge encoder could not give), the
    model summary (HTML and Markdown) and the settings (report.json)."""
    methods.insert(1, behaviour_method(behaviour, prompts))
    if bridge_without_pattern_edits(model):
        methods.insert(2, f"Causal evidence: necessity only; {NOT_MEASURED}.")
    settings["behaviour"] = {**behaviour.spec(), "measured": behaviour.describe(prompts)}
    summary["behaviour"] = behaviour.describe(prompts)


def report_max_len(model: nn.Module, leakage_len: int | str) -> int:
    """The longest sequence the report's leakage audit runs: `leakage_len`, at most the model's context
    (`interp.modelinfo.context_length`: cfg.n_ctx, n_positions, a nanoGPT block_size ...); "ctx": the context."""
    from interp.modelinfo import context_length

    if leakage_len == "ctx" and context_length(model) is not None:
        return int(context_length(model))  # type: ignore[arg-type]
    check_whole(leakage_len, "leakage_len", "report", minimum=2)  # LEAKAGE_LEN by default
    return min(int(leakage_len), context_length(model) or int(leakage_len))


def _leakage(model: nn.Module, *, seed: int, max_len: int, bidirectional: bool | None = None):
    """The leakage audit's `LeakageReport` (kept as the object; the renderers read its fields)."""
    from interp.analyses import leakage

    return leakage.audit(model, max_len=max_len, seed=seed, progress=False,  # max_len: `report_max_len`
                         bidirectional=bidirectional)


def _claims(model, prompts, claims_file, *, seed: int, chosen, evidence=None,
            behaviour=None) -> tuple[pd.DataFrame, list, list[Heads]]:
    """Scan every head (propose on one half of the prompts, test on the other), plus the file's claims, keeping
    those about the chosen heads (and whole-model claims).

    Returns the claims frame and, row by row, its `Verdict` (None for a claims file's rows) and subject heads."""
    from interp.analyses import claims

    scan = claims.scan(model, prompts, seed=seed, evidence=evidence, behaviour=behaviour, heads=chosen)
    verdicts: list = list(scan.attrs["verdicts"])  # interp.claims.verdict_frame's Verdict objects, row by row
    scan.attrs = {}  # pandas deep-copies attrs on every row and copy: the verdicts are kept in the list instead
    heads = [v.claim.heads for v in verdicts]
    frames = [scan.assign(source="scan")]
    if claims_file is not None:
        # the file's claims run on the file's own [prompts]: they were written for them
        pinned = run_claims(model, claims_file, behaviour=behaviour)
        frames.append(pinned.assign(source=f"claims file {Path(str(claims_file.path)).name}"))
        by_name = {entry.name: entry.heads for entry in claims_file.claims}
        verdicts += [None] * len(pinned)
        heads += [by_name[name] for name in pinned["name"]]
    frame = pd.concat(frames, ignore_index=True, sort=False)
    if "label" not in frame.columns:
        frame["label"] = list(map(head_label, zip(frame["layer"], frame["head"])))
    keep = set(chosen)
    kept = [not subject or any(lh in keep for lh in subject) for subject in heads]
    frame = frame[kept].reset_index(drop=True)
    frame.attrs = {}
    verdicts, heads = [v for v, k in zip(verdicts, kept) if k], [h for h, k in zip(heads, kept) if k]
    return _with_ablation(frame, verdicts), verdicts, heads


def _with_ablation(frame: pd.DataFrame, verdicts: list) -> pd.DataFrame:
    """The claims frame with an `ablation` column after `behaviour`: how each claim's causal evidence removed the
    head (`format.evidence_ablation`; a claims file's rows keep theirs), '' where no causal evidence ran."""
    if "behaviour" not in frame.columns:
        frame["behaviour"] = ""
    own = frame["ablation"] if "ablation" in frame.columns else pd.Series([""] * len(frame), index=frame.index)
    values = [fmt.evidence_ablation(v) if v is not None else ("" if pd.isna(o) else str(o)) for v, o in zip(verdicts, own)]
    frame = frame.drop(columns=["ablation"], errors="ignore")
    frame.insert(frame.columns.get_loc("behaviour") + 1, "ablation", values)
    return frame


def _similarity(model, prompts, chosen, *, seed: int) -> pd.DataFrame | None:
    from interp.analyses import redundancy

    if len(chosen) < 2:
        return None
    pairs = redundancy.pattern_similarity(model, prompts, seed=seed, layers=sorted({layer for layer, _ in chosen}))
    matrix = redundancy.to_matrix(pairs, "similarity", diagonal=1.0)
    labels = list(map(head_label, chosen))
    return matrix.loc[labels, labels]


def _importance(model, prompts, *, seed: int, behaviour=None, heads=None) -> pd.DataFrame:
    """Each chosen head's mean-ablation effect (only the chosen heads are ablated: one forward each)."""
    from interp.analyses import redundancy

    behaviour = behaviour or report_behaviour(model, prompts)
    return name_causal(redundancy.importance(model, prompts, "mean", behaviour=behaviour, seed=seed, gradient=False,
                                             heads=heads))


def _joint(model, prompts, similarity: pd.DataFrame | None, *, seed: int, behaviour=None) -> pd.DataFrame | None:
    from interp.analyses import redundancy

    if similarity is None or len(similarity) < 2:
        return None
    values = similarity.to_numpy(dtype=float)
    labels = list(similarity.index)
    pairs = [(values[i, j], labels[i], labels[j]) for i in range(len(labels)) for j in range(i + 1, len(labels))]
    pairs = [p for p in pairs if math.isfinite(p[0])]
    pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
    top = [(a, b) for _, a, b in pairs[:TOP_PAIRS]]
    return name_causal(redundancy.joint_ablation(model, prompts, top, "mean",
                                                 behaviour=behaviour or report_behaviour(model, prompts), seed=seed))


def name_causal(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with a `behaviour` and an `ablation` column (before `n_prompts`): what its causal numbers measured
    and how the heads were removed, from its attrs (`behaviour`, `method`) where it does not name them yet."""
    for column, key in (("behaviour", "behaviour"), ("ablation", "method")):
        if column in frame.columns:
            continue
        value = frame.attrs.get(key)
        if not value:
            raise ValueError(f"a causal frame with columns {list(frame.columns)} names no {column} (neither a "
                             f"{column!r} column nor attrs[{key!r}]); the analysis that made it must say what it measured.")
        where = frame.columns.get_loc("n_prompts") if "n_prompts" in frame.columns else len(frame.columns)
        frame.insert(where, column, str(value))
    return frame


def _heads_table(metrics: pd.DataFrame, importance: pd.DataFrame | None, claims: pd.DataFrame,
                 claim_heads: list[Heads]) -> pd.DataFrame:
    """The metrics, with importance and, per verdict, the names of the claims about each head (`_claim_name`)."""
    frame = metrics.copy()
    if importance is not None:
        imp = importance.rename(columns={"delta_loss": "importance", "ci_low": "importance_ci_low", "ci_high": "importance_ci_high"})
        keep = ["layer", "head"] + [c for c in ("importance", "importance_ci_low", "importance_ci_high", "behaviour",
                                                "ablation") if c in imp.columns]
        frame = frame.merge(imp[keep], on=["layer", "head"], how="left")
    for verdict in ("supported", "refuted", "inconclusive"):
        by_head: dict[tuple[int, int], list[str]] = {}
        for (_, row), subject in zip(claims.iterrows(), claim_heads):
            if row["verdict"] == verdict:
                for lh in subject:
                    by_head.setdefault(lh, []).append(_claim_name(row, subject))
        frame[f"claims_{verdict}"] = [";".join(sorted(set(by_head.get((l, h), []))))
                                      for l, h in zip(frame["layer"], frame["head"])]
    return frame


def _claim_name(row, subject: Heads) -> str:
    """The claim's kind; a claim about several heads also names them: 'redundant(L0H0~L0H1)'."""
    name = str(row["claim"])
    if len(subject) > 1:
        name = f"{name}({str(row['label']).replace(' ', '')})"
    return name
