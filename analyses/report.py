"""Per-head pattern reports: every analysis of the toolkit on one model, in one directory.

`build_report(model, out_dir, ...)` writes a self-contained directory that opens offline:

    report.html   model summary, leakage verdict, one card per head (mean attention pattern,
                  relative-offset profile, metrics with CIs, the claims tested about it with
                  verdicts and reasons), head-similarity and importance heat maps, redundancy
                  findings, and a methods section (prompts, seeds, controls, corrections)
    heads.csv     one row per head: every metric with its CI, importance, the verdicts
    claims.csv    one row per claim tested: verdict, adjusted p-value, evidence, reasons
    redundancy.csv  joint-ablation findings for the most similar head pairs
    columns.md    the data dictionary: every column of the CSVs defined, with the schema version
    summary.md    the highlights, for pasting into an issue or a paper draft
    report.json   the run's settings, highlights, provenance (versions, commit, seed, prompt hash,
                  wall time), schema version and every file written, machine-readable
    plots/*.png   every figure (matplotlib, no network, referenced by relative paths)

The numbers are deterministic for a given seed (same CSVs on rerun). The files are written
into a temporary sibling and moved into place at the end with a manifest (`interp.outdir`),
so a failure never leaves a half-written report; `force=True` replaces only the files an
earlier report wrote, and refuses, naming them, when the directory holds any other file.

report.html also embeds an interactive attention viewer (`interp.analyses.viewer`: a few prompts,
weights quantised to uint8, script and style inlined) and a glossary of every metric.

Stages: `compute` runs every analysis into a `ReportData` (typed results, no files);
`render` writes the files (plots: `interp.analyses.report_plots`; HTML and Markdown:
`interp.analyses.report_html`; formats and the glossary: `interp.analyses.report_format`).

Vocabulary: heads are `L{layer}H{head}`; `pattern` is the post-softmax attention
(query, key); the relative offset of a key is key - query (-1 = previous token, as in
`interp.analyses.positional.offset_profile`).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from interp.analyses import report_format
from interp.analyses.claims.registry import NOT_MEASURED, bridge_without_pattern_edits, claim_evidence_for, run_claims
from interp import distributed, launch
from interp.claims import DEFAULT_EVIDENCE
from interp import outdir
from interp.models.files import write_atomic
from interp.data import PromptSet
from interp.hooks import attention_sites, hooked
from interp.launch import Device, DType
from interp.validate import check_layers, check_model, check_prompts, check_seed, check_whole

if TYPE_CHECKING:
    from interp.progress import Stages

MARKER = ".interp-report"  # a file in every report directory: `interp demo` may replace such a directory
# evidence for models without a meaningful loss (encoders, random task heads): ablation evidence
# would measure a random head's logits, and a bridge cannot be rebuilt at random initialisation
NO_LOSS_EVIDENCE = ("observational", "control_shuffled")
MAX_CARDS = 64  # more heads than this make an unreadable page: narrow with layers= / heads=, or raise max_cards
DEFAULT_N = 64  # prompts for the observational metrics
LEAKAGE_LEN = 32  # longest sequence the leakage audit runs (at most the model's context)
TOP_PAIRS = 3  # most similar head pairs tested by joint ablation
FLOAT_FORMAT = "%.6g"  # CSV float format: stable across runs, enough digits for every CI
COLOUR_SCALES = ("common", "per_head")  # pattern heat maps: one 0..1 scale for all, or each head's own maximum


OutputDirError = outdir.OutputDirError  # not a folder, not writable, or holding files no report wrote


class ReportTooLarge(ValueError):
    """The report would have more head cards than MAX_CARDS; the message says how to narrow it."""


# --------------------------------------------------------------------------- output directory


def is_report_dir(path: str | os.PathLike) -> bool:
    """True when `path` does not exist, is empty, or holds only files a previous report wrote."""
    return outdir.is_replaceable(path)


def check_out_dir(out_dir: str | os.PathLike, force: bool) -> Path:
    """Refuse an output directory we must not write (before any computation starts): see `interp.outdir`."""
    return outdir.check(out_dir, force)


def _commit(tmp: Path, out: Path) -> None:
    """Move the finished temporary directory's files into `out`, with a manifest; never deletes other files."""
    outdir.commit(tmp, out)


# --------------------------------------------------------------------------- measurements


def select_heads(
    model: nn.Module, layers: Iterable[int] | None = None, heads: Iterable[tuple[int, int]] | None = None
) -> list[tuple[int, int]]:
    """The (layer, head) pairs a report covers; errors name heads that do not exist."""
    sites = attention_sites(model)
    every = [(s.layer, h) for s in sites for h in range(s.n_heads)]
    chosen = every
    if layers is not None:
        layers = list(layers)
        bad = [l for l in layers if not 0 <= l < len(sites)]
        if bad:
            raise ValueError(f"layer {bad[0]} does not exist; the model has layers 0..{len(sites) - 1}.")
        chosen = [lh for lh in chosen if lh[0] in layers]
    if heads is not None:
        heads = list(heads)
        unknown = [lh for lh in heads if lh not in every]
        if unknown:
            shape = ", ".join(f"layer {s.layer}: heads 0..{s.n_heads - 1}" for s in sites)
            raise ValueError(f"head L{unknown[0][0]}H{unknown[0][1]} does not exist ({shape}).")
        chosen = [lh for lh in chosen if lh in heads]
    if not chosen:
        raise ValueError(f"the selection (layers={layers}, heads={heads}) leaves no heads; widen it.")
    return chosen


def mean_patterns(model: nn.Module, prompts: PromptSet, layers: Sequence[int], *, batch_size: int = 32) -> dict[int, np.ndarray]:
    """Mean attention pattern per layer over prompts: layer -> (head, query, key).

    Padded queries are left out of the mean (each query position is averaged over the prompts
    where it is a real token). Memory is one (head, query, key) sum per layer.
    """
    from interp.interventions import run_stopping_after

    sites = {s.layer: s for s in attention_sites(model)}
    sums: dict[int, torch.Tensor] = {}
    counts = torch.zeros(prompts.n_pos, dtype=torch.float64)

    def make_hook(layer: int, query_mask: list):
        def hook(pattern, hook):  # (batch, head, query, key)
            weights = query_mask[0][:, None, :, None].to(pattern.device, torch.float32)  # (batch, 1, query, 1)
            total = (pattern.detach().float().nan_to_num(0.0) * weights).sum(0).double().cpu()  # (head, query, key)
            sums[layer] = sums.get(layer, 0) + total
            return None

        return hook

    for batch in distributed.shard(prompts, batch_size).prompts.batches(batch_size):
        mask = torch.ones(batch.tokens.shape) if batch.attention_mask is None else batch.attention_mask.float()
        holder = [mask]
        counts += mask.sum(0).double()
        fwd = [(sites[l].hook("pattern"), make_hook(l, holder)) for l in layers]
        with torch.no_grad(), hooked(model, fwd):
            run_stopping_after(model, batch, max(layers))
    if distributed.active():  # every rank's sums, added in rank order
        parts = distributed.gather_objects((sums, counts))
        sums = {l: sum((part[0][l] for part in parts[1:] if l in part[0]), parts[0][0].get(l, 0)) for l in layers}
        counts = sum((part[1] for part in parts[1:]), parts[0][1])
    return {l: (sums[l] / counts.clamp(min=1)[None, :, None]).numpy() for l in layers}


def head_metrics(
    model: nn.Module,
    prompts: PromptSet,
    *,
    seed: int = 0,
    layers: Iterable[int] | None = None,
    heads: Iterable[tuple[int, int]] | None = None,
) -> pd.DataFrame:
    """Positional focus metrics for every head, plus induction scores on repeated prompts; with CIs.

    One row per (layer, head): `label`, `layer`, `head`, each metric with `_ci_low` / `_ci_high`,
    `n_prompts` (the columns of `interp.analyses.positional.focus` and `interp.analyses.induction.scores`).
    """
    from interp.analyses import positional

    chosen = select_heads(model, layers, heads)
    needed = sorted({l for l, _ in chosen})
    frame = positional.focus(model, prompts, seed=seed, layers=needed)
    if prompts.meta.get("kind") == "repeated":
        from interp.analyses import induction

        scores = induction.scores(model, prompts, seed=seed, layers=needed)
        extra = [c for c in scores.columns if c not in frame.columns or c in ("layer", "head")]
        frame = frame.merge(scores[extra], on=["layer", "head"], how="left")
    kept = set(chosen)
    frame = frame[[(l, h) in kept for l, h in zip(frame["layer"], frame["head"])]].reset_index(drop=True)
    frame.insert(0, "label", [f"L{l}H{h}" for l, h in zip(frame["layer"], frame["head"])])
    if "n_prompts" in frame.columns:  # keep n_prompts last
        frame = frame[[c for c in frame.columns if c != "n_prompts"] + ["n_prompts"]]
    return frame


def offset_profiles(model: nn.Module, prompts: PromptSet, *, layers=None, max_offset: int = 32) -> pd.DataFrame:
    """Mean weight at each relative offset (key - query) per head: layer, head, offset, weight, CI."""
    from interp.analyses import positional

    frame = positional.offset_profile(model, prompts, layers=layers)
    return frame[frame["offset"].abs() <= max_offset].reset_index(drop=True)


def _causal_words(model: nn.Module, sites: list) -> str:
    """The header's word on causality: what the model declares (as the leakage audit reads it), and what
    its attention calls showed when that disagrees, never an observation passed off as a declaration."""
    from interp.analyses.leakage import declaration

    declared = declaration(model)
    if declared is not None:
        return f"no: bidirectional, {declared}"
    if any(site.causal is False for site in sites):
        return "expected (nothing declares it bidirectional), but attention was seen unmasked: see the leakage verdict"
    return "yes (decoder)"


def model_summary(model: nn.Module, spec: str | None) -> dict[str, Any]:
    """Plain facts about the model for the report's header."""
    sites = attention_sites(model)
    cfg = getattr(model, "cfg", None)
    summary: dict[str, Any] = {
        "spec": spec or type(model).__name__,
        "class": type(model).__name__,
        "attention layers": len(sites),
        "heads per layer": ", ".join(sorted({str(s.n_heads) for s in sites})),
        "d_head": ", ".join(sorted({str(s.d_head) for s in sites})),
        "causal": _causal_words(model, sites),
        "parameters": f"{sum(p.numel() for p in model.parameters()):,}",
    }
    for name in ("d_model", "n_ctx", "d_vocab", "attn_only", "positional_embedding_type", "original_architecture",
                 "n_key_value_heads"):
        value = getattr(cfg, name, None)
        if value is not None:
            summary[name] = value
    metadata = getattr(model, "metadata", None) or {}
    for key in ("trained_with", "command", "seed", "final_loss", "description"):
        if key in metadata and not isinstance(metadata[key], (dict, list)):
            summary[f"card: {key}"] = metadata[key]
    # how the model was loaded (native conversion, or the bridge and what does not work there)
    for index, note in enumerate(getattr(model, "load_notes", None) or []):
        summary[f"load note {index + 1}"] = note
    return summary


# --------------------------------------------------------------------------- the report


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
    viewer: Any = None  # interp.analyses.viewer.ViewerData, or None
    warnings: list[str] = field(default_factory=list)  # prompts that cannot support a claim, and why
    provenance: dict[str, Any] = field(default_factory=dict)  # versions, commit, seed, prompt hash, wall time
    title: str = ""  # the model's name


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


# progress: one bar over the computation *and* the rendering (plots, pages, files), so it says
# "done" only when the report is on disk (interp.progress.Stages, shared with the CLI)
RENDER_STAGES = ["plots, tables and pages", "moving into place"]


def _Stages(names: list[str], progress: bool | Stages) -> Stages:  # noqa: N802 (the report's stage bar, called like the class it was)
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
    from interp.specs import build_prompts

    started = time.perf_counter()
    _check_colour_scale(colour_scale)
    check_model(model, "report")
    seed, layers = check_seed(seed, "report"), check_layers(layers, "report")
    if prompts is not None:
        check_prompts(prompts, "report")
    leakage_len = report_max_len(model, leakage_len)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    chosen = select_heads(model, layers, heads)
    check_card_limit(len(chosen), max_cards, len(attention_sites(model)))
    prompt_spec = prompt_spec or default_prompt_spec(model, seed)
    if prompts is None:
        prompts = build_prompts(model, prompt_spec, default_n=DEFAULT_N)
    has_loss = _has_meaningful_loss(model)
    evidence = claim_evidence_for(model)
    measured = report_behaviour(model, prompts, behaviour)
    results, timings = _run_stages(model, prompts, chosen, claims_file, seed=seed, leakage_len=leakage_len,
                                   has_loss=has_loss, evidence=evidence, progress=progress, behaviour=measured,
                                   bidirectional=bidirectional)
    claims, verdicts = results["claims"]
    heads_frame = _heads_table(results["metrics"], results["importance"], claims)
    causal = bool(attention_sites(model)[0].causal)
    methods = _methods(prompts, prompt_spec, seed=seed, leakage=results["leakage"], has_loss=has_loss, causal=causal,
                       leakage_len=leakage_len, claims=claims, verdicts=verdicts)
    settings = {"spec": spec, "seed": seed, "prompts": {**prompt_spec.to_dict(), "n": len(prompts), "n_pos": prompts.n_pos},
                "heads": [f"L{l}H{h}" for l, h in chosen], "colour_scale": colour_scale,
                "evidence": list(evidence or DEFAULT_EVIDENCE), "max_cards": max_cards}
    summary = model_summary(model, spec)
    _name_behaviour(model, measured, prompts, methods, settings, summary)
    data = ReportData(summary, heads_frame, claims, results["patterns"], results["offsets"],
                      results["similarity"], results["importance"], results["redundancy"], results["leakage"], methods,
                      settings, timings, verdicts=verdicts, viewer=results["viewer"],
                      warnings=prompt_warnings(model, prompts), title=model_name(model, spec))
    data.provenance = provenance(seed, prompts, time.perf_counter() - started)
    return data


def _run_stages(model, prompts, chosen, claims_file, *, seed, leakage_len, has_loss, evidence, progress, behaviour,
                bidirectional=None):
    """Every measurement of the report, timed, under one progress bar: stage name -> result."""
    from interp.analyses import viewer

    layers = sorted({l for l, _ in chosen})
    stages = {
        "leakage audit": lambda: _leakage(model, seed=seed, max_len=leakage_len, bidirectional=bidirectional),
        "mean patterns": lambda: mean_patterns(model, prompts, layers),
        "positional metrics": lambda: head_metrics(model, prompts, seed=seed, heads=chosen),
        "offset profiles": lambda: offset_profiles(model, prompts, layers=layers),
        "claims": lambda: _claims(model, prompts, claims_file, seed=seed, chosen=chosen, evidence=evidence,
                                  behaviour=behaviour),
        "head similarity": lambda: _similarity(model, prompts, chosen, seed=seed),
        "importance": lambda: _importance(model, prompts, seed=seed, behaviour=behaviour) if has_loss else None,
        "joint ablation": lambda: (_joint(model, prompts, results["similarity"], seed=seed, behaviour=behaviour)
                                   if has_loss else None),
        "viewer": lambda: viewer.viewer_data(model, prompts, chosen),
    }
    keys = {"leakage audit": "leakage", "mean patterns": "patterns", "positional metrics": "metrics",
            "offset profiles": "offsets", "claims": "claims", "head similarity": "similarity", "importance": "importance",
            "joint ablation": "redundancy", "viewer": "viewer"}
    results: dict[str, Any] = {}
    with _Stages(list(stages), progress) as run:
        for name, fn in stages.items():
            results[keys[name]] = run.run(name, fn)
    return results, dict(run.timings)


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
    a Hugging Face folder's config.json, or our checkpoint's JSON (a built-in name or a .safetensors path)."""
    if not spec:
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


def has_tokenizer(model: nn.Module) -> bool:
    """A text model: it carries a tokenizer that turns text into its ids."""
    return getattr(model, "tokenizer", None) is not None


def default_prompt_spec(model: nn.Module, seed: int = 0, n: int | None = None):
    """Text from the shipped corpus for text models (through their tokenizer), else repeated random tokens."""
    from interp.specs import PromptSpec

    return PromptSpec(kind="text" if has_tokenizer(model) else "repeated", seed=seed, n=n)


def model_prompt_spec(model: nn.Module, prompt_spec, *, asked: bool):
    """The CLI's prompt spec, made model-aware: when the user named no prompt kind, a text model gets text."""
    import dataclasses

    if asked or not has_tokenizer(model) or prompt_spec.kind != "repeated":
        return prompt_spec
    return dataclasses.replace(prompt_spec, kind="text", prefix_len=None, n_repeats=None)


def prompt_warnings(model: nn.Module, prompts: PromptSet) -> list[str]:
    """What these prompts cannot support: each line names the claims concerned and the fix."""
    from interp.claims import MIN_PROMPTS_FOR_VERDICT

    kind = prompts.meta.get("kind", "tokens")
    warnings = []
    if has_tokenizer(model) and kind in ("repeated", "random"):
        warnings.append(
            f"these prompts are random token ids ({kind}), not text, for a model with a tokenizer: it never saw such "
            "input, and position 0 is a random wordpiece, not [CLS] / BOS, so first-token (sink) claims here say "
            "nothing about its special tokens; use --prompts text.")
    if kind != "repeated":
        warnings.append("the prompts have no repeats by construction: induction and duplicate-token scores are not "
                        "measured and no induction claim is proposed; use --prompts repeated to test induction.")
    if len(prompts) // 2 < MIN_PROMPTS_FOR_VERDICT:
        warnings.append(f"the scan tests claims on half of the {len(prompts)} prompts, fewer than "
                        f"{MIN_PROMPTS_FOR_VERDICT}: every scanned claim is inconclusive; pass --n {2 * MIN_PROMPTS_FOR_VERDICT} or more.")
    return warnings


def model_name(model: nn.Module, spec: str | None) -> str:
    """A reader's name for the model: a folder's model-card title, a built-in's name, else the class."""
    if spec:
        path = Path(str(spec))
        if path.is_dir():
            title = _card_title(path / "README.md")
            return title or (path.parent.name if path.name in ("model", "models", "checkpoint") else path.name)
        if path.is_file():
            return path.stem
        return str(spec)
    return type(model).__name__


def _card_title(readme: Path) -> str | None:
    """The first level-1 heading of a Hugging Face model card, outside its YAML front matter."""
    if not readme.is_file():
        return None
    text = readme.read_text(encoding="utf-8", errors="replace")
    if text.startswith("---"):
        text = text.split("---", 2)[-1]
    for line in text.splitlines():
        if line.startswith("# "):
            return line[2:].strip() or None
    return None


def provenance(seed: int, prompts: PromptSet, wall_time_s: float) -> dict[str, Any]:
    """Versions, git commit, seed, a hash of the prompt set and the wall time: enough to rerun the report."""
    import hashlib
    import platform

    digest = hashlib.sha256(prompts.tokens.cpu().numpy().astype("<i8").tobytes())
    if prompts.attention_mask is not None:
        digest.update(prompts.attention_mask.cpu().numpy().astype("<i1").tobytes())
    return {"toolkit": _version("interp-attention"), "git_commit": _git_commit(), "torch": torch.__version__,
            "transformer_lens": _version("transformer-lens"), "python": platform.python_version(), "seed": seed,
            "prompt_hash": "sha256:" + digest.hexdigest()[:16], "n_prompts": len(prompts),
            "wall_time_s": round(wall_time_s, 2)}


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git_commit() -> str | None:
    """The toolkit checkout's commit ("+dirty" with uncommitted changes); None outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


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


def behaviour_method(behaviour, prompts: PromptSet) -> str:
    """The Methods line that names the behaviour."""
    return (f"Behaviour: {behaviour.describe(prompts)} ({behaviour.description}; reads the final "
            f"{'logits' if behaviour.reads == 'logits' else 'hidden state, never the LM head'}). Importance, joint "
            "ablation and the claims' necessity, sufficiency and faithfulness measure its change.")


def _name_behaviour(model: nn.Module, behaviour, prompts: PromptSet, methods: list[str], settings: dict,
                    summary: dict) -> None:
    """State the behaviour in the Methods (and which evidence a bridge encoder could not give), the
    model summary (HTML and Markdown) and the settings (report.json)."""
    methods.insert(1, behaviour_method(behaviour, prompts))
    if bridge_without_pattern_edits(model):
        methods.insert(2, f"Causal evidence: necessity only; {NOT_MEASURED}.")
    settings["behaviour"] = {**behaviour.spec(), "measured": behaviour.describe(prompts)}
    summary["behaviour"] = behaviour.describe(prompts)


def report_max_len(model: nn.Module, leakage_len: int) -> int:
    """The longest sequence the report's leakage audit runs: `leakage_len`, at most the model's context
    (`interp.modelinfo.context_length`: cfg.n_ctx, n_positions, a nanoGPT block_size ...)."""
    from interp.modelinfo import context_length

    check_whole(leakage_len, "leakage_len", "report", minimum=2)  # LEAKAGE_LEN by default
    return min(leakage_len, context_length(model) or leakage_len)


def _leakage(model: nn.Module, *, seed: int, max_len: int, bidirectional: bool | None = None):
    """The leakage audit's `LeakageReport` (kept as the object; the renderers read its fields)."""
    from interp.analyses import leakage

    return leakage.audit(model, max_len=max_len, seed=seed, progress=False,  # max_len: `report_max_len`
                         bidirectional=bidirectional)


def _claims(model, prompts, claims_file, *, seed: int, chosen, evidence=None, behaviour=None) -> tuple[pd.DataFrame, list]:
    """Scan every head (propose on one half of the prompts, test on the other), plus the file's claims.

    Returns the claims frame and, row by row, its `Verdict` (None for a claims file's rows)."""
    from interp.analyses import claims

    frames = []
    scan = claims.scan(model, prompts, seed=seed, evidence=evidence, behaviour=behaviour)
    scan_verdicts = list(scan.attrs.get("verdicts", [None] * len(scan)))
    scan.attrs = {}  # pandas deep-copies attrs on every row and copy: the verdicts are kept in the list instead
    frames.append(scan.assign(source="scan", _verdict=range(len(scan))))
    if claims_file is not None:
        # the file's claims run on the file's own [prompts]: they were written for them
        frames.append(run_claims(model, claims_file, behaviour=behaviour).assign(source=f"claims file {Path(str(claims_file.path)).name}"))
    frame = pd.concat(frames, ignore_index=True, sort=False)
    if "label" not in frame.columns:
        frame["label"] = [f"L{l}H{h}" for l, h in zip(frame["layer"], frame["head"])]
    keep = {f"L{l}H{h}" for l, h in chosen} | {"model"}
    frame = frame[[any(part.strip() in keep for part in str(lbl).split("~")) for lbl in frame["label"]]]
    frame = frame.reset_index(drop=True)
    frame.attrs = {}
    verdicts = [scan_verdicts[int(i)] if pd.notna(i) else None for i in frame["_verdict"]]
    return frame.drop(columns="_verdict"), verdicts


def _similarity(model, prompts, chosen, *, seed: int) -> pd.DataFrame | None:
    from interp.analyses import redundancy

    if len(chosen) < 2:
        return None
    pairs = redundancy.pattern_similarity(model, prompts, seed=seed)
    matrix = redundancy.to_matrix(pairs, "similarity", diagonal=1.0)
    labels = [f"L{l}H{h}" for l, h in chosen]
    return matrix.loc[labels, labels]


def _importance(model, prompts, *, seed: int, behaviour=None) -> pd.DataFrame:
    from interp.analyses import redundancy

    behaviour = behaviour or report_behaviour(model, prompts)
    return redundancy.importance(model, prompts, "mean", behaviour=behaviour, seed=seed, gradient=False)


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
    return redundancy.joint_ablation(model, prompts, top, "mean", behaviour=behaviour or report_behaviour(model, prompts),
                                     seed=seed)


def _heads_table(metrics: pd.DataFrame, importance: pd.DataFrame | None, claims: pd.DataFrame) -> pd.DataFrame:
    frame = metrics.copy()
    if importance is not None:
        imp = importance.rename(columns={"delta_loss": "importance", "ci_low": "importance_ci_low", "ci_high": "importance_ci_high"})
        keep = ["layer", "head"] + [c for c in ("importance", "importance_ci_low", "importance_ci_high") if c in imp.columns]
        frame = frame.merge(imp[keep], on=["layer", "head"], how="left")
    for verdict in ("supported", "refuted", "inconclusive"):
        rows = claims[claims["verdict"] == verdict] if len(claims) else claims
        by_head: dict[str, list[str]] = {}
        for _, row in rows.iterrows():
            for part in str(row["label"]).split("~"):
                by_head.setdefault(part.strip(), []).append(_claim_name(row))
        frame[f"claims_{verdict}"] = [";".join(sorted(set(by_head.get(lbl, [])))) for lbl in frame["label"]]
    return frame


def _claim_name(row) -> str:
    name = str(row["claim"])
    if "~" in str(row.get("label", "")):
        name = f"{name}({row['label'].replace(' ', '')})"
    return name


LEAKAGE_CHECKS = {
    "truncation": "outputs must not change when every later position is removed",
    "perturbation": "outputs at positions <= t must not move when every token after t changes",
    "gradient": "the Jacobian of each output with respect to every later input embedding must be zero",
    "pattern": "attention weight above the diagonal (reported, never trusted alone)",
    "batch": "an example's outputs must not depend on the other examples of its batch",
    "padding": "pad-token content must not move real positions, and padding must not change them",
}


def _methods(prompts, prompt_spec, *, seed, leakage, has_loss, causal, leakage_len, claims, verdicts=()) -> list[str]:
    """The Methods section, one paragraph a line: what was drawn and run, nothing else."""
    lines = [_prompts_paragraph(prompts, seed), _patterns_paragraph(), _claims_paragraph(claims, verdicts, has_loss)]
    if has_loss:
        lines.append(
            "Importance: the increase of the behaviour's loss (named above) when a head's output (z) is replaced by its "
            f"per-position mean over the prompts (mean ablation). Joint ablation of the {TOP_PAIRS} most similar pairs: "
            "the pair's loss change against the sum of each alone; interaction = both - (a + b), its p-value one-sided "
            "for interaction > 0 (the heads back each other up), so overlapping pairs (interaction < 0) have p near 1."
        )
    else:
        lines.append("Importance, ablations and the ablation-based evidence of claims (necessity, sufficiency, "
                     f"faithfulness) were skipped: {NOT_MEASURED}; claims used {' and '.join(NO_LOSS_EVIDENCE)} evidence only.")
    if leakage is not None:
        checks = "; ".join(f"{m} ({LEAKAGE_CHECKS.get(m, 'see interp.analyses.leakage')})" for m in leakage.methods)
        lines.append(
            f"Leakage audit (`interp.analyses.leakage.audit`, sequences of {list(leakage.lengths)} tokens, seed {seed}, "
            f"noise tolerance {leakage.tol:g} of the output scale), the {len(leakage.methods)} "
            f"checks of the verdict box, at every hook site: {checks}."
        )
    lines.append("Pattern similarity between heads: `interp.analyses.redundancy.pattern_similarity` (one minus the "
                 "Jensen-Shannon divergence in bits between the two heads' attention rows, averaged over queries and "
                 "prompts); the map's rows are ordered by average-linkage clustering of 1 - similarity, so similar "
                 "heads sit together.")
    return lines


def _prompts_paragraph(prompts: PromptSet, seed: int) -> str:
    meta = prompts.meta
    kind = meta.get("kind", "tokens")
    desc = f"{len(prompts)} {kind} prompts of up to {prompts.n_pos} tokens (seed {meta.get('seed', seed)}"
    repeats = prompts.repeats
    if kind == "repeated" and repeats is not None:
        desc += f", a random block of {repeats.period} tokens repeated {repeats.n_repeats or 2} times"
    if meta.get("tokenizer") == "char":
        desc += ", through the toolkit's character tokenizer"
    elif meta.get("tokenizer"):
        desc += ", through the model's own tokenizer, special tokens ([CLS] / [SEP] / BOS) included"
    desc += ")"
    return (f"Prompts: {desc}. The prompt is the unit of statistics: metric intervals are 95% percentile bootstraps "
            f"over prompts (1,000 resamples, seed {seed}).")


def _patterns_paragraph() -> str:
    return ("Mean patterns average each query position over the prompts where it is a real token; every heat map "
            "uses one colour scale (0 to 1) unless the colour bar says otherwise. The offset profile is the mean "
            "weight at each relative offset key - query (-1 = previous token); its error bars are a "
            "normal-approximation 95% interval over prompts from streamed moments (no per-prompt values are kept).")


def _claims_paragraph(claims: pd.DataFrame, verdicts, has_loss: bool) -> str:
    floors = sorted({report_format.claim_floor(v) for v in verdicts if v is not None} - {0})
    b_text = ", ".join(f"B = {b:,}" for b in floors) or "B = 2,000"
    return (
        "Claims: `interp.analyses.claims.scan` proposes one claim per head on one half of the prompts and tests "
        "it on the other half, never on the prompts that proposed it. Each claim needs observational evidence "
        "(metric CI vs the literature's threshold) and is checked against controls: the same metric on "
        "shuffled-token prompts (position vs content)"
        + ("; on a randomly initialised model of the same shape (control_random_init is the difference trained - "
           "random-init); necessity (mean ablation against comparable heads), sufficiency (idealised pattern "
           "substitution: fraction of loss recovered) and faithfulness (uniform or permuted pattern) on the "
           "behaviour named above" if has_loss else "")
        + ". Every p-value is a one-sided sign-flip permutation test that the requirement holds, with "
        f"{b_text} flips; p = (hits + 1) / (B + 1), so a p-value at that floor is printed \u2264 1/(B+1). A claim's "
        "p-value is the largest of its evidence; p-values are Benjamini-Hochberg corrected (alpha 0.05) within "
        "each family tested together: the scan's claims over every head, and the claims file's claims, "
        f"separately; {len(claims)} claims about the heads shown appear here."
    )


def highlights(data: ReportData, limit: int = 8) -> pd.DataFrame:
    """The strongest findings: finding, heads, evidence, verdict; supported heads ranked by effect size.

    `attrs["n_supported"]` / `attrs["n_shown"]` count the supported heads and those shown."""
    rows = [] if data.leakage is None else [_leakage_finding(data.leakage)]
    supported = _supported_by_head(data)
    shown = supported[:limit]
    for label, group in shown:
        best, verdict = group[0]
        p_text = report_format.format_p(best["p_adjusted"], report_format.claim_floor(verdict))
        rows.append({"finding": ", ".join(dict.fromkeys(_finding_name(r, v) for r, v in group)), "heads": label,
                     "evidence": f"{_observed(best)}, p_adj {p_text}", "verdict": "supported"})
    rows += _partial_findings(data, {label for label, _ in supported}, max(0, limit - len(shown)))
    rows += _measured_findings(data)
    table = pd.DataFrame(rows, columns=["finding", "heads", "evidence", "verdict"])
    table.attrs.update(n_supported=len(supported), n_shown=len(shown))
    return table


def _leakage_finding(report) -> dict[str, str]:
    """The leakage audit's line of the findings: its headline (worded in interp.analyses.leakage) and evidence."""
    if report.bidirectional:
        evidence = "padding " + ("leaks" if report.leaks else "inert")
    elif not math.isnan(report.max_influence):
        site = f" at {report.first_leaking_site}" if report.first_leaking_site else ""
        origin = report.origin
        line = "" if origin is None else f"; first at {Path(origin.frame.file).name}:{origin.frame.line} ({origin.op})"
        evidence = f"max influence {report.max_influence:.2g}{site}{line}"
    else:
        evidence = ""
    return {"finding": report.headline, "heads": "model", "evidence": evidence, "verdict": report.verdict}


def _supported_by_head(data: ReportData) -> list[tuple[str, list]]:
    """Supported claims grouped by head, heads ranked by their strongest observational effect (then layer, head)."""
    claims = data.claims
    if not len(claims):
        return []
    verdicts = data.verdicts or [None] * len(claims)
    groups: dict[str, list] = {}
    for (_, row), verdict in zip(claims.iterrows(), verdicts):
        if row["verdict"] == "supported":
            groups.setdefault(str(row["label"]), []).append((row, verdict))
    for group in groups.values():
        group.sort(key=lambda rv: -_effect(rv[0]))
    return sorted(groups.items(), key=lambda item: (-_effect(item[1][0][0]), head_sort_key(item[0])))


def head_sort_key(label: str) -> tuple:
    """Numeric order of head labels: L1H3 before L1H10; pairs by their first head; 'model' first."""
    import re

    numbers = [int(x) for x in re.findall(r"\d+", str(label))]
    return (0 if numbers else -1, *numbers)


def _effect(row) -> float:
    value = row.get("observational")
    return float(value) if _finite(value) else -math.inf


def _finding_name(row, verdict) -> str:
    name = str(row["claim"])
    offset = report_format.tested_offset(verdict) if name == "positional" else None
    if name == "positional" and offset is None and "offset" in row.index and pd.notna(row.get("offset")):
        offset = str(row["offset"])
    if offset == "first":
        return f"{name} (first position)"
    return f"{name} (offset {offset})" if offset is not None else name


def _partial_findings(data: ReportData, supported: set[str], room: int) -> list[dict[str, str]]:
    """Heads whose interpretation holds observationally but failed another test: worth a look, not a claim."""
    claims = data.claims
    if not room or not len(claims) or "observational_passed" not in claims.columns:
        return []
    verdicts = data.verdicts or [None] * len(claims)
    rows: list[dict[str, str]] = []
    seen = set(supported)
    candidates = [(r, v) for (_, r), v in zip(claims.iterrows(), verdicts)
                  if r["verdict"] == "inconclusive" and _is_true(r["observational_passed"])]
    for row, verdict in sorted(candidates, key=lambda rv: (-_effect(rv[0]), head_sort_key(rv[0]["label"]))):
        if row["label"] in seen or len(rows) >= room:
            continue
        seen.add(row["label"])
        rows.append({"finding": f"{_finding_name(row, verdict)} (observational only)", "heads": row["label"],
                     "evidence": f"{_observed(row)}; {_first_problem(verdict)}", "verdict": "inconclusive"})
    return rows


def _measured_findings(data: ReportData) -> list[dict[str, str]]:
    rows = []
    if data.importance is not None and len(data.importance):
        top = data.importance.sort_values("delta_loss", ascending=False).iloc[0]
        rows.append({"finding": "most important head (mean ablation)", "heads": f"L{top['layer']}H{top['head']}",
                     "evidence": "loss " + _interval_text(top["delta_loss"], top["ci_low"], top["ci_high"],
                                                              data.importance.attrs.get("unit")),
                     "verdict": "measured"})
    if data.redundancy is not None and len(data.redundancy):
        decided = data.redundancy[(data.redundancy["ci_low"] > 0) | (data.redundancy["ci_high"] < 0)]
        if len(decided):
            top = decided.loc[decided["interaction"].abs().idxmax()]
            kind = "together more than apart (backup)" if top["interaction"] > 0 else "overlapping (together less than apart)"
            rows.append({"finding": f"pair {kind}", "heads": f"{top['label_a']} ~ {top['label_b']}",
                         "evidence": "interaction " + _interval_text(top["interaction"], top["ci_low"], top["ci_high"],
                                                                     data.redundancy.attrs.get("unit")),
                         "verdict": "measured"})
    return rows


def _interval_text(value: float, low: float, high: float, unit: str | None) -> str:
    """'+0.123 [0.100, 0.150] nats'; three significant digits for other units (cosine distances are small)."""
    unit = unit or "nats"
    f = ".3f" if unit == "nats" else ".3g"
    return f"{value:+{f}} [{low:{f}}, {high:{f}}] {unit}"


def _observed(row) -> str:
    effect, low, high = (row.get(k) for k in ("observational", "observational_ci_low", "observational_ci_high"))
    return f"{row['claim']} {effect:.2f} [{low:.2f}, {high:.2f}]" if _finite(effect) else str(row["claim"])


def _first_problem(verdict) -> str:
    """'necessity undecided': the first evidence of the claim that did not pass, from the Evidence objects."""
    if verdict is None:
        return "not all tests passed"
    for e in verdict.evidence:
        if e.passed is not True:
            return f"{e.kind} {'failed' if e.passed is False else 'undecided'}"
    return "adjusted p-value above alpha"


def _is_true(value) -> bool:
    """A passed flag read from a frame: True only for a real True (None / NaN = undecided)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and bool(value)


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def build_report(
    model: nn.Module,
    out_dir: str | os.PathLike,
    *,
    spec: str | None = None,
    prompt_spec=None,
    prompts: PromptSet | None = None,
    layers: Iterable[int] | None = None,
    heads: Iterable[tuple[int, int]] | None = None,
    claims_file=None,
    seed: int | None = None,
    force: bool = False,
    progress: bool = False,
    max_cards: int = MAX_CARDS,
    colour_scale: str = "common",
    behaviour=None,
    device: Device = None,
    dtype: DType = None,
    leakage_len: int = LEAKAGE_LEN,
    bidirectional: bool | None = None,
) -> ReportResult:
    """Compute and write a report directory (see the module docstring); returns where and the highlights.

    `prompt_spec` (an `interp.specs.PromptSpec`) or `prompts` choose the prompts (default: the
    shipped corpus through the model's tokenizer for text models, else 64 repeated random-token
    prompts); `layers` / `heads` narrow the cards; `max_cards` lifts the card limit;
    `colour_scale` is "common" (0..1 for every heat map) or "per_head". `behaviour` (a name, an
    `interp.behaviour.Behaviour` or a callable; default: the model's own) is what importance, joint
    ablation and the claims' causal evidence measure; the report states it. `device` / `dtype`: as `compute`.
    `leakage_len`: the longest sequence the leakage audit runs (at most the model's context); `bidirectional`:
    the audit's declaration (None: the model's own, as `interp.analyses.leakage.audit` reads it).
    """
    out = check_out_dir(out_dir, force)
    if seed is None:
        seed = getattr(prompt_spec, "seed", 0) or 0
    with _Stages(RENDER_STAGES, progress) as stages:
        data = compute(model, spec=spec, prompt_spec=prompt_spec, prompts=prompts, layers=layers, heads=heads,
                       claims_file=claims_file, seed=seed, progress=stages, max_cards=max_cards,
                       colour_scale=colour_scale, behaviour=behaviour, device=device, dtype=dtype, leakage_len=leakage_len,
                       bidirectional=bidirectional)
        with outdir.staging(out) as tmp:
            table = stages.run(RENDER_STAGES[0], lambda: render(data, tmp))
            stages.run(RENDER_STAGES[1], lambda: _commit(tmp, out))
    data.timings.update({name: stages.timings[name] for name in RENDER_STAGES})
    leakage = None if data.leakage is None else data.leakage.brief()
    return ReportResult(out, data.heads, data.claims, table, leakage, data.timings, data,
                        data.settings.get("behaviour"))


# --------------------------------------------------------------------------- rendering

# the figures live in interp.analyses.report_plots; these names stay importable from here
from interp.analyses.report_plots import importance_grid, plot_matrix, plot_offsets, plot_pattern  # noqa: E402,F401


def render(data: ReportData, folder: Path) -> pd.DataFrame:
    """Write every file of the report into `folder`; returns the highlights table."""
    from interp.analyses import report_html, report_plots

    started = time.perf_counter()
    plots = folder / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    images = {**report_plots.head_figures(data, plots), **report_plots.summary_figures(data, plots)}
    table = highlights(data)
    claims_csv = _claims_csv(data.claims)
    write_atomic(folder / "heads.csv", data.heads.to_csv(index=False, float_format=FLOAT_FORMAT))
    write_atomic(folder / "claims.csv", claims_csv.to_csv(index=False, float_format=FLOAT_FORMAT))
    columns = {"heads.csv": list(data.heads.columns), "claims.csv": list(claims_csv.columns)}
    if data.redundancy is not None:
        write_atomic(folder / "redundancy.csv", data.redundancy.to_csv(index=False, float_format=FLOAT_FORMAT))
        columns["redundancy.csv"] = list(data.redundancy.columns)
    write_atomic(folder / "columns.md", report_format.columns_markdown(columns))
    data.provenance["wall_time_s"] = round(data.provenance.get("wall_time_s", 0.0) + time.perf_counter() - started, 2)
    write_atomic(folder / "summary.md", report_html.markdown(data, table))
    page = report_html.page(data, table, images)
    write_atomic(folder / "report.html", page)
    leakage = None if data.leakage is None else data.leakage.brief()
    meta = {"settings": data.settings, "summary": {k: str(v) for k, v in data.summary.items()}, "leakage": leakage,
            "highlights": json.loads(table.to_json(orient="records")), "schema_version": report_format.SCHEMA_VERSION,
            "title": data.title, "provenance": data.provenance, "warnings": data.warnings,
            "sizes_bytes": _sizes(folder, data), "files": _written_files(folder, extra=["report.json"])}
    write_atomic(folder / "report.json", json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
    write_atomic(folder / MARKER, "written by interp.analyses.report; `interp demo` may replace this directory\n")
    return table


def _written_files(folder: Path, extra: Sequence[str] = ()) -> list[str]:
    """Every file under `folder` (relative, '/'-separated), plus `extra` about to be written."""
    found = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != MARKER]
    return sorted(set(found) | set(extra))


def _sizes(folder: Path, data: ReportData) -> dict[str, int]:
    """Bytes of the page, of the viewer's embedded patterns, and of every file so far."""
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return {"report.html": (folder / "report.html").stat().st_size, "total": total,
            "viewer_patterns": data.viewer.n_bytes if data.viewer is not None else 0}


def _claims_csv(claims: pd.DataFrame) -> pd.DataFrame:
    """Scalar columns only (the Verdict objects stay in memory)."""
    frame = claims.copy()
    for column in frame.columns:
        if frame[column].map(lambda v: isinstance(v, (list, tuple, dict))).any():
            frame[column] = frame[column].map(lambda v: json.dumps(v, default=str) if isinstance(v, (list, tuple, dict)) else v)
    front = [c for c in ("label", "layer", "head", "claim", "verdict", "p_value", "p_adjusted", "source") if c in frame.columns]
    return frame[front + [c for c in frame.columns if c not in front]]
