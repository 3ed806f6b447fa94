"""Per-head pattern reports: every analysis of the toolkit on one model, in one directory.

`build_report(model, out_dir, ...)` writes a self-contained directory that opens offline:

    report.html   model summary, leakage verdict, one card per head (mean attention pattern,
                  relative-offset profile, metrics with CIs, the claims tested about it with
                  verdicts and reasons), head-similarity and importance heat maps, redundancy
                  findings, and a methods section (prompts, seeds, controls, corrections)
    heads.csv     one row per head: every metric with its CI, importance, the verdicts
    claims.csv    one row per claim tested: verdict, adjusted p-value, evidence, reasons
    redundancy.csv  joint-ablation findings for the most similar head pairs
    summary.md    the highlights, for pasting into an issue or a paper draft
    report.json   the run's settings and highlights, machine-readable
    plots/*.png   every figure (matplotlib, no network, referenced by relative paths)

The numbers are deterministic for a given seed (same CSVs on rerun). The directory is written
into a temporary sibling and renamed into place at the end, so a failure never leaves a
half-written report; an existing non-empty directory is replaced only with `force=True`.

Vocabulary: heads are `L{layer}H{head}`; `pattern` is the post-softmax attention
(query, key); the relative offset of a key is key - query (-1 = previous token, as in
`analyses.positional.offset_profile`).
"""
from __future__ import annotations

import html
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from interp import distributed
from interp.data import PromptSet
from interp.hooks import attention_sites, hooked

MARKER = ".interp-report"  # a file in every report directory: `interp demo` may replace such a directory
# evidence for models without a meaningful loss (encoders, random task heads): ablation evidence
# would measure a random head's logits, and a bridge cannot be rebuilt at random initialisation
NO_LOSS_EVIDENCE = ("observational", "control_shuffled")
MAX_CARDS = 64  # more heads than this make an unreadable page: narrow with layers= / heads=
DEFAULT_N = 64  # prompts for the observational metrics
TOP_PAIRS = 3  # most similar head pairs tested by joint ablation
FLOAT_FORMAT = "%.6g"  # CSV float format: stable across runs, enough digits for every CI


class OutputDirError(FileExistsError):
    """The output directory cannot be used (not empty, not a directory, not writable)."""


class ReportTooLarge(ValueError):
    """The report would have more head cards than MAX_CARDS; the message says how to narrow it."""


# --------------------------------------------------------------------------- output directory


def is_report_dir(path: str | os.PathLike) -> bool:
    """True when `path` does not exist, is empty, or holds a report written by this module."""
    path = Path(path)
    if not path.exists():
        return True
    return path.is_dir() and ((path / MARKER).exists() or not any(path.iterdir()))


def check_out_dir(out_dir: str | os.PathLike, force: bool) -> Path:
    """Refuse an output directory we must not write (before any computation starts)."""
    out = Path(out_dir).absolute()
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"output path {out} exists and is not a directory; choose another --out.")
    if out.exists() and any(out.iterdir()) and not force:
        raise OutputDirError(
            f"output directory {out} is not empty; pass --force to replace it, or choose another --out."
        )
    protected = {Path.cwd().absolute(), Path.home().absolute(), Path(out.anchor)}
    if force and out.exists() and (out in protected or out in Path.cwd().absolute().parents):
        raise OutputDirError(f"refusing to replace {out} (the working, home or root directory); choose a subdirectory with --out.")
    parent = out.parent
    existing = next((p for p in [parent, *parent.parents] if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise OutputDirError(f"cannot create {out}: {existing or parent} is not a writable directory "
                             "(permission denied, or a file); choose another --out.")
    return out


def _commit(tmp: Path, out: Path) -> None:
    """Move the finished temporary directory into place, replacing `out` if it exists."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; a report is for sharing
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)


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
        bad = [lh for lh in heads if lh not in every]
        if bad:
            shape = ", ".join(f"layer {s.layer}: heads 0..{s.n_heads - 1}" for s in sites)
            raise ValueError(f"head L{bad[0][0]}H{bad[0][1]} does not exist ({shape}).")
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
            weights = query_mask[0][:, None, :, None].to(pattern.dtype)  # (batch, 1, query, 1)
            total = (pattern.detach().nan_to_num(0.0) * weights).sum(0).double().cpu()  # (head, query, key)
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
    `n_prompts` (the columns of `analyses.positional.focus` and `analyses.induction.scores`).
    """
    from analyses import positional

    chosen = select_heads(model, layers, heads)
    needed = sorted({l for l, _ in chosen})
    frame = positional.focus(model, prompts, seed=seed, layers=needed)
    if prompts.meta.get("kind") == "repeated":
        from analyses import induction

        scores = induction.scores(model, prompts, seed=seed, layers=needed)
        extra = [c for c in scores.columns if c not in frame.columns or c in ("layer", "head")]
        frame = frame.merge(scores[extra], on=["layer", "head"], how="left")
    chosen = set(chosen)
    frame = frame[[(l, h) in chosen for l, h in zip(frame["layer"], frame["head"])]].reset_index(drop=True)
    frame.insert(0, "label", [f"L{l}H{h}" for l, h in zip(frame["layer"], frame["head"])])
    if "n_prompts" in frame.columns:  # keep n_prompts last
        frame = frame[[c for c in frame.columns if c != "n_prompts"] + ["n_prompts"]]
    return frame


def offset_profiles(model: nn.Module, prompts: PromptSet, *, layers=None, max_offset: int = 32) -> pd.DataFrame:
    """Mean weight at each relative offset (key - query) per head: layer, head, offset, weight, CI."""
    from analyses import positional

    frame = positional.offset_profile(model, prompts, layers=layers)
    return frame[frame["offset"].abs() <= max_offset].reset_index(drop=True)


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
        "causal": {True: "yes (decoder)", False: "no (bidirectional encoder)", None: "unknown"}[sites[0].causal if sites else None],
        "parameters": f"{sum(p.numel() for p in model.parameters()):,}",
    }
    for name in ("d_model", "n_ctx", "d_vocab", "attn_only", "positional_embedding_type"):
        value = getattr(cfg, name, None)
        if value is not None:
            summary[name] = value
    metadata = getattr(model, "metadata", None) or {}
    for key in ("trained_with", "command", "seed", "final_loss", "description"):
        if key in metadata and not isinstance(metadata[key], (dict, list)):
            summary[f"card: {key}"] = metadata[key]
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
    leakage: dict[str, Any] | None  # verdict, causal, max_influence, first_leaking_site, text
    methods: list[str]
    settings: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class ReportResult:
    """Where the report went and its headline tables."""

    out_dir: Path
    heads: pd.DataFrame
    claims: pd.DataFrame
    highlights: pd.DataFrame
    leakage: dict[str, Any] | None
    timings: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "leakage": self.leakage,
            "highlights": json.loads(self.highlights.to_json(orient="records")),
            "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
        }


class _Stages:
    """A rich progress bar over the report's stages (or nothing when quiet)."""

    def __init__(self, names: list[str], enabled: bool):
        self.names, self.enabled, self.timings = names, enabled, {}
        self._progress = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            # on stderr: stdout may carry JSON (--json -)
            self._progress = Progress(TextColumn("{task.description:<28}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                      TimeElapsedColumn(), transient=False, console=Console(stderr=True))
            self._progress.__enter__()
            self._task = self._progress.add_task("report", total=len(self.names))
        return self

    def run(self, name: str, fn):
        if self._progress is not None:
            self._progress.update(self._task, description=name)
        start = time.perf_counter()
        result = fn()
        self.timings[name] = time.perf_counter() - start
        if self._progress is not None:
            self._progress.advance(self._task)
        return result

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.update(self._task, description="done")
            self._progress.__exit__(*exc)


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
    leakage_len: int = 32,
    progress: bool = False,
    max_cards: int = MAX_CARDS,
) -> ReportData:
    """Run every analysis the report shows; no files are written."""
    from interp.specs import PromptSpec, build_prompts

    chosen = select_heads(model, layers, heads)
    if len(chosen) > max_cards:
        n_layers = len(attention_sites(model))
        raise ReportTooLarge(
            f"the report would have {len(chosen)} head cards (limit {max_cards}); narrow it with --layers "
            f"(e.g. --layers 0-{max(0, min(n_layers, max_cards // max(1, len(chosen) // n_layers)) - 1)}) "
            "or --heads L0H1,L1H2,..."
        )
    prompt_spec = prompt_spec or PromptSpec(seed=seed)
    if prompts is None:
        prompts = build_prompts(model, prompt_spec, default_n=DEFAULT_N)
    chosen_layers = sorted({l for l, _ in chosen})
    causal = bool(attention_sites(model)[0].causal)
    has_loss = _has_meaningful_loss(model)

    stages = ["leakage audit", "mean patterns", "positional metrics", "offset profiles", "claims",
              "head similarity", "importance", "joint ablation"]
    with _Stages(stages, progress) as run:
        leakage = run.run("leakage audit", lambda: _leakage(model, seed=seed, max_len=leakage_len))
        patterns = run.run("mean patterns", lambda: mean_patterns(model, prompts, chosen_layers))
        metrics = run.run("positional metrics", lambda: head_metrics(model, prompts, seed=seed, heads=chosen))
        offsets = run.run("offset profiles", lambda: offset_profiles(model, prompts, layers=chosen_layers))
        claims = run.run("claims", lambda: _claims(model, prompts, claims_file, seed=seed, chosen=chosen,
                                                   evidence=None if has_loss else NO_LOSS_EVIDENCE))
        similarity = run.run("head similarity", lambda: _similarity(model, prompts, chosen, seed=seed))
        importance = run.run("importance", lambda: _importance(model, prompts, seed=seed) if has_loss else None)
        redundancy = run.run("joint ablation", lambda: _joint(model, prompts, similarity, seed=seed) if has_loss else None)

    heads_frame = _heads_table(metrics, importance, claims)
    methods = _methods(prompts, prompt_spec, seed=seed, leakage=leakage, has_loss=has_loss, causal=causal,
                       leakage_len=leakage_len, claims=claims)
    settings = {"spec": spec, "seed": seed, "prompts": {**prompt_spec.to_dict(), "n": len(prompts), "n_pos": prompts.n_pos},
                "heads": [f"L{l}H{h}" for l, h in chosen]}
    return ReportData(model_summary(model, spec), heads_frame, claims, patterns, offsets, similarity, importance,
                      redundancy, leakage, methods, settings, dict(run.timings))


def claim_evidence_for(model: nn.Module) -> tuple[str, ...] | None:
    """The evidence kinds claims about `model` should gather: all (None) when it has a meaningful
    next-token loss, else the observational test and the shuffled-token control only."""
    return None if _has_meaningful_loss(model) else NO_LOSS_EVIDENCE


def _has_meaningful_loss(model: nn.Module) -> bool:
    """Importance and ablations are measured on the next-token loss; an encoder or a random LM head has none."""
    if getattr(model, "head_is_random", False):
        return False
    sites = attention_sites(model)
    return bool(sites and sites[0].causal)


def _leakage(model: nn.Module, *, seed: int, max_len: int) -> dict[str, Any]:
    from analyses import leakage

    n_ctx = getattr(getattr(model, "cfg", None), "n_ctx", None) or max_len
    report = leakage.audit(model, max_len=min(max_len, n_ctx), seed=seed, progress=False)
    return {
        "verdict": report.verdict,
        "causal": bool(report.causal),
        "leaks": list(report.leaks),
        "max_influence": None if math.isnan(report.max_influence) else float(report.max_influence),
        "first_leaking_site": report.first_leaking_site,
        "text": str(report),
    }


def _claims(model, prompts, claims_file, *, seed: int, chosen, evidence=None) -> pd.DataFrame:
    """Scan every head (propose on one half of the prompts, test on the other), plus the file's claims."""
    from analyses import head_claims

    frames = []
    scan = head_claims.scan(model, prompts, seed=seed, evidence=evidence)
    frames.append(scan.assign(source="scan"))
    if claims_file is not None:
        from interp.testing import run_claims

        # the file's claims run on the file's own [prompts]: they were written for them
        frames.append(run_claims(model, claims_file).assign(source=f"claims file {Path(str(claims_file.path)).name}"))
    frame = pd.concat(frames, ignore_index=True, sort=False)
    if "label" not in frame.columns:
        frame["label"] = [f"L{l}H{h}" for l, h in zip(frame["layer"], frame["head"])]
    keep = {f"L{l}H{h}" for l, h in chosen} | {"model"}
    frame = frame[[any(part.strip() in keep for part in str(lbl).split("~")) for lbl in frame["label"]]]
    return frame.reset_index(drop=True)


def _similarity(model, prompts, chosen, *, seed: int) -> pd.DataFrame | None:
    from analyses import redundancy

    if len(chosen) < 2:
        return None
    pairs = redundancy.pattern_similarity(model, prompts, seed=seed)
    matrix = redundancy.to_matrix(pairs, "similarity", diagonal=1.0)
    labels = [f"L{l}H{h}" for l, h in chosen]
    return matrix.loc[labels, labels]


def _importance(model, prompts, *, seed: int) -> pd.DataFrame:
    from analyses import redundancy

    return redundancy.importance(model, prompts, "mean", loss_fn=_loss_fn(prompts), seed=seed, gradient=False)


def _loss_fn(prompts: PromptSet):
    """The behaviour the ablations measure: loss on the repeated copy for repeated prompts, else every position."""
    from analyses import redundancy

    return redundancy.induction_loss if prompts.meta.get("kind") == "repeated" else None


def _joint(model, prompts, similarity: pd.DataFrame | None, *, seed: int) -> pd.DataFrame | None:
    from analyses import redundancy

    if similarity is None or len(similarity) < 2:
        return None
    values = similarity.to_numpy(dtype=float)
    labels = list(similarity.index)
    pairs = [(values[i, j], labels[i], labels[j]) for i in range(len(labels)) for j in range(i + 1, len(labels))]
    pairs = [p for p in pairs if math.isfinite(p[0])]
    pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
    top = [(a, b) for _, a, b in pairs[:TOP_PAIRS]]
    return redundancy.joint_ablation(model, prompts, top, "mean", loss_fn=_loss_fn(prompts), seed=seed)


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


def _methods(prompts, prompt_spec, *, seed, leakage, has_loss, causal, leakage_len, claims) -> list[str]:
    meta = prompts.meta
    kind = meta.get("kind", "tokens")
    desc = f"{len(prompts)} {kind} prompts of {prompts.n_pos} tokens (seed {meta.get('seed', seed)}"
    if kind == "repeated":
        desc += f", a random block of {meta.get('prefix_len')} tokens repeated {meta.get('n_repeats', 2)} times"
    desc += ")"
    lines = [
        f"Prompts: {desc}. The prompt is the unit of statistics: metric intervals are 95% percentile bootstraps "
        f"over prompts (1,000 resamples, seed {seed}).",
        "Mean patterns average each query position over the prompts where it is a real token; the offset "
        "profile is the mean weight at each relative offset key - query (-1 = previous token), its band a "
        "normal-approximation 95% interval from streamed moments (no per-prompt values are kept for it).",
        "Claims: `analyses.head_claims.scan` proposes one claim per head on one half of the prompts and tests "
        "it on the other half, never on the prompts that proposed it. Each claim needs observational evidence "
        "(metric CI vs the literature's threshold) and is checked against controls: the same metric on "
        "shuffled-token prompts (position vs content)"
        + ("; on a randomly initialised model of the same shape; necessity (mean ablation against comparable "
           "heads), sufficiency (idealised pattern substitution: fraction of loss recovered) and faithfulness "
           "(uniform or permuted pattern) on the next-token loss" if has_loss else "")
        + ". A claim's p-value is the largest of its evidence; p-values are Benjamini-Hochberg corrected "
        "(alpha 0.05) within each family tested together: the scan's claims over every head, and the claims "
        f"file's claims, separately; {len(claims)} claims about the heads shown appear here.",
    ]
    if has_loss:
        target = "on the repeated copies (what induction can predict)" if kind == "repeated" else "at every position"
        lines.append(
            f"Importance: the increase of the next-token loss {target} when a head's output (z) is replaced by its "
            "per-position mean over the prompts "
            f"(mean ablation). Joint ablation of the {TOP_PAIRS} most similar pairs: the pair's loss change against "
            "the sum of each alone (redundancy = together more than apart)."
        )
    else:
        lines.append("Importance, ablations and the ablation-based evidence of claims (necessity, sufficiency, "
                     "faithfulness) were skipped: the model has no meaningful next-token loss (a bidirectional "
                     f"encoder, or a task head initialised at random); claims used {' and '.join(NO_LOSS_EVIDENCE)} evidence only.")
    if leakage is not None:
        lines.append(
            f"Leakage audit (`analyses.leakage.audit`, sequences up to {leakage_len} tokens, seed {seed}): "
            "perturbation of later tokens, gradients with respect to later embeddings, and the attention "
            "patterns above the diagonal, at every hook site."
        )
    lines.append("Pattern similarity between heads: `analyses.redundancy.pattern_similarity` "
                 "(one minus the Jensen-Shannon divergence between the two heads' attention rows, averaged over queries and prompts).")
    return lines


def highlights(data: ReportData, limit: int = 8) -> pd.DataFrame:
    """The strongest findings: finding, heads, evidence, verdict."""
    rows = []
    if data.leakage is not None:
        lk = data.leakage
        finding = {"exact_zero": "causal (no output moved)", "numerical_noise": "causal (float rounding only)",
                   "leak": "causal leak", "bidirectional": "bidirectional by design"}.get(lk["verdict"], lk["verdict"])
        if lk["verdict"] == "bidirectional":
            evidence = "padding " + (f"LEAK ({', '.join(lk['leaks'])})" if lk.get("leaks") else "inert")
        elif lk.get("max_influence") is not None:
            evidence = f"max influence {lk['max_influence']:.2g}" + (f" at {lk['first_leaking_site']}" if lk.get("first_leaking_site") else "")
        else:
            evidence = ""
        rows.append({"finding": finding, "heads": "model", "evidence": evidence, "verdict": lk["verdict"]})
    claims = data.claims
    if len(claims):
        ordered = claims.sort_values(["p_adjusted", "label", "claim"], kind="stable")
        supported: dict[str, list] = {}
        for _, row in ordered[ordered["verdict"] == "supported"].iterrows():
            supported.setdefault(row["label"], []).append(row)
        for label, group in list(supported.items())[:limit]:
            rows.append({"finding": ", ".join(dict.fromkeys(str(r["claim"]) for r in group)), "heads": label,
                         "evidence": _observed(group[0]) + f", p_adj {group[0]['p_adjusted']:.2g}", "verdict": "supported"})
        # heads whose interpretation holds observationally but failed another test: worth a look, not a claim
        if "observational_passed" in ordered.columns:
            partial = ordered[(ordered["verdict"] == "inconclusive") & (ordered["observational_passed"] == True)]  # noqa: E712
            partial = partial[~partial["label"].isin(list(supported))].drop_duplicates("label")
            for _, row in partial.head(max(0, limit - len(supported))).iterrows():
                rows.append({"finding": f"{row['claim']} (observational only)", "heads": row["label"],
                             "evidence": f"{_observed(row)}; {_first_problem(row['reasons'])}", "verdict": "inconclusive"})
    if data.importance is not None and len(data.importance):
        top = data.importance.sort_values("delta_loss", ascending=False).iloc[0]
        rows.append({"finding": "most important head (mean ablation)", "heads": f"L{top['layer']}H{top['head']}",
                     "evidence": f"loss +{top['delta_loss']:.3f} [{top['ci_low']:.3f}, {top['ci_high']:.3f}] nats", "verdict": "measured"})
    if data.redundancy is not None and len(data.redundancy):
        decided = data.redundancy[(data.redundancy["ci_low"] > 0) | (data.redundancy["ci_high"] < 0)]
        if len(decided):
            top = decided.loc[decided["interaction"].abs().idxmax()]
            kind = "together more than apart (backup)" if top["interaction"] > 0 else "overlapping (together less than apart)"
            rows.append({"finding": f"pair {kind}", "heads": f"{top['label_a']} ~ {top['label_b']}",
                         "evidence": f"interaction {top['interaction']:+.3f} [{top['ci_low']:.3f}, {top['ci_high']:.3f}] nats",
                         "verdict": "measured"})
    return pd.DataFrame(rows, columns=["finding", "heads", "evidence", "verdict"])


def _observed(row) -> str:
    effect, low, high = (row.get(k) for k in ("observational", "observational_ci_low", "observational_ci_high"))
    return f"{row['claim']} {effect:.2f} [{low:.2f}, {high:.2f}]" if _finite(effect) else str(row["claim"])


def _first_problem(reasons: str) -> str:
    """'necessity undecided' from a claim's reasons: the first evidence that did not pass."""
    for part in str(reasons).split("; "):
        kind, _, rest = part.partition(" ")
        if rest.startswith(("failed", "undecided")):
            return f"{kind} {rest.split(':')[0]}"
    return "not all tests passed"


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
) -> ReportResult:
    """Compute and write a report directory (see the module docstring); returns where and the highlights.

    `prompt_spec` (an `interp.specs.PromptSpec`) or `prompts` choose the prompts (default: 64
    repeated random-token prompts); `layers` / `heads` narrow the cards.
    """
    out = check_out_dir(out_dir, force)
    if seed is None:
        seed = getattr(prompt_spec, "seed", 0) or 0
    data = compute(model, spec=spec, prompt_spec=prompt_spec, prompts=prompts, layers=layers, heads=heads,
                   claims_file=claims_file, seed=seed, progress=progress, max_cards=max_cards)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        table = render(data, tmp)
        _commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ReportResult(out, data.heads, data.claims, table, data.leakage, data.timings)


# --------------------------------------------------------------------------- rendering


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


def plot_pattern(pattern: np.ndarray, label: str, ax=None):
    """Heat map of one head's mean pattern (query, key); returns the Figure."""
    fig = ax.figure if ax is not None else _figure(3.2, 3.0)
    ax = ax or fig.add_subplot()
    image = ax.imshow(pattern, cmap="viridis", vmin=0, vmax=max(1e-9, float(np.nanmax(pattern))), interpolation="nearest")
    ax.set_title(f"{label} mean pattern", fontsize=9)
    ax.set_xlabel("key position", fontsize=8)
    ax.set_ylabel("query position", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=7)
    return fig


def plot_offsets(profile: pd.DataFrame, label: str, ax=None):
    """Bar chart of mean attention weight per relative offset (key - query; -1 = previous token)."""
    fig = ax.figure if ax is not None else _figure(3.2, 2.4)
    ax = ax or fig.add_subplot()
    ax.bar(profile["offset"], profile["weight"], color="#4c72b0", width=0.8)
    ax.set_title(f"{label} offset profile", fontsize=9)
    ax.set_xlabel("offset (key - query)", fontsize=8)
    ax.set_ylabel("mean weight", fontsize=8)
    ax.tick_params(labelsize=7)
    return fig


def plot_matrix(matrix: pd.DataFrame, title: str, *, cmap: str = "magma", vmin=None, vmax=None, annotate: bool = True):
    """Labelled heat map of a (label x label) or (layer x head) frame."""
    values = matrix.to_numpy(dtype=float)
    size = max(3.0, 0.35 * max(values.shape) + 1.5)
    fig = _figure(size + 0.8, size)
    ax = fig.add_subplot()
    image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    ax.set_xticks(range(values.shape[1]), [str(c) for c in matrix.columns], rotation=90, fontsize=7)
    ax.set_yticks(range(values.shape[0]), [str(i) for i in matrix.index], fontsize=7)
    ax.set_title(title, fontsize=9)
    if annotate and values.size <= 144:
        for (i, j), value in np.ndenumerate(values):
            if math.isfinite(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6, color="white" if image.norm(value) < 0.5 else "black")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=7)
    fig.tight_layout()
    return fig


def importance_grid(importance: pd.DataFrame) -> pd.DataFrame:
    """Importance as a (layer x head) frame for a heat map."""
    grid = importance.pivot(index="layer", columns="head", values="delta_loss")
    grid.index = [f"L{l}" for l in grid.index]
    grid.columns = [f"H{h}" for h in grid.columns]
    return grid


def _save(fig, path: Path) -> str:
    fig.savefig(path, format="png", metadata={"Software": None})
    return f"plots/{path.name}"


def render(data: ReportData, folder: Path) -> pd.DataFrame:
    """Write every file of the report into `folder`; returns the highlights table."""
    plots = folder / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    images: dict[str, str] = {}
    offsets = data.offsets
    for label in data.heads["label"]:
        layer, head = (int(x) for x in label[1:].split("H"))
        fig = _figure(6.6, 2.8)
        plot_pattern(data.patterns[layer][head], label, ax=fig.add_subplot(1, 2, 1))
        if offsets is not None:
            profile = offsets[(offsets["layer"] == layer) & (offsets["head"] == head)]
            plot_offsets(profile, label, ax=fig.add_subplot(1, 2, 2))
        fig.tight_layout()
        images[label] = _save(fig, plots / f"{label}.png")
    if data.similarity is not None:
        images["similarity"] = _save(plot_matrix(data.similarity, "pattern similarity (1 - JS divergence)", vmin=0, vmax=1),
                                     plots / "similarity.png")
    if data.importance is not None:
        images["importance"] = _save(plot_matrix(importance_grid(data.importance), "importance: loss increase under mean ablation",
                                                 cmap="viridis"), plots / "importance.png")

    table = highlights(data)
    data.heads.to_csv(folder / "heads.csv", index=False, float_format=FLOAT_FORMAT)
    _claims_csv(data.claims).to_csv(folder / "claims.csv", index=False, float_format=FLOAT_FORMAT)
    if data.redundancy is not None:
        data.redundancy.to_csv(folder / "redundancy.csv", index=False, float_format=FLOAT_FORMAT)
    (folder / "summary.md").write_text(_markdown(data, table), encoding="utf-8")
    (folder / "report.html").write_text(_html(data, table, images), encoding="utf-8")
    meta = {"settings": data.settings, "summary": {k: str(v) for k, v in data.summary.items()}, "leakage": data.leakage,
            "highlights": json.loads(table.to_json(orient="records")), "files": sorted(["heads.csv", "claims.csv", "summary.md",
            "report.html", *[v for v in images.values()]])}
    (folder / "report.json").write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    (folder / MARKER).write_text("written by analyses.report; `interp demo` may replace this directory\n")
    return table


def _claims_csv(claims: pd.DataFrame) -> pd.DataFrame:
    """Scalar columns only (the Verdict objects stay in memory)."""
    frame = claims.copy()
    for column in frame.columns:
        if frame[column].map(lambda v: isinstance(v, (list, tuple, dict))).any():
            frame[column] = frame[column].map(lambda v: json.dumps(v, default=str) if isinstance(v, (list, tuple, dict)) else v)
    front = [c for c in ("label", "layer", "head", "claim", "verdict", "p_value", "p_adjusted", "source") if c in frame.columns]
    return frame[front + [c for c in frame.columns if c not in front]]


def _fmt(value: Any) -> str:
    if isinstance(value, (float, np.floating)):
        return "" if not math.isfinite(value) else f"{value:.3f}"
    return str(value)


def _markdown(data: ReportData, table: pd.DataFrame) -> str:
    lines = [f"# Attention report: {data.summary['spec']}", ""]
    lines += [f"- **{k}**: {v}" for k, v in data.summary.items()]
    lines += ["", "## Strongest findings", "", "| finding | heads | evidence | verdict |", "|---|---|---|---|"]
    lines += [f"| {r.finding} | {r.heads} | {r.evidence} | {r.verdict} |" for r in table.itertuples()]
    counts = data.claims["verdict"].value_counts() if len(data.claims) else pd.Series(dtype=int)
    lines += ["", f"Claims tested: {len(data.claims)} ({', '.join(f'{v} {k}' for k, v in counts.items())}).", ""]
    lines += ["## Methods", ""] + [f"- {m}" for m in data.methods] + [""]
    return "\n".join(lines)


_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 2rem auto; max-width: 1200px; color: #222; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; margin-top: 2rem; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0; }
th, td { border: 1px solid #ddd; padding: 0.2rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 1rem; }
.card { border: 1px solid #ccc; border-radius: 6px; padding: 0.6rem 0.8rem; }
.card h3 { margin: 0.2rem 0 0.4rem 0; }
.card img, .wide img { max-width: 100%; }
.supported { color: #1a7f37; font-weight: 600; } .refuted { color: #cf222e; font-weight: 600; }
.inconclusive { color: #9a6700; font-weight: 600; }
.verdict-box { padding: 0.6rem 1rem; border-radius: 6px; border: 1px solid #ccc; background: #fafafa; white-space: pre-wrap; font-family: monospace; font-size: 0.8rem; }
.reasons { font-size: 0.78rem; color: #444; }
.muted { color: #777; font-size: 0.85rem; }
"""


def _esc(value: Any) -> str:
    return html.escape(_fmt(value))


def _html_table(frame: pd.DataFrame, columns: Sequence[str] | None = None) -> str:
    columns = [c for c in (columns or frame.columns) if c in frame.columns]
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = []
    for _, row in frame.iterrows():
        cells = []
        for c in columns:
            text = _esc(row[c])
            cls = f' class="{text}"' if text in ("supported", "refuted", "inconclusive") else ""
            cells.append(f"<td{cls}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _metric_rows(row: pd.Series) -> str:
    names = [c for c in row.index if f"{c}_ci_low" in row.index and _finite(row[c])]  # NaN: undefined here
    rows = []
    for name in names:
        low, high = row[name + "_ci_low"], row[name + "_ci_high"]
        interval = f"[{_esc(low)}, {_esc(high)}]" if _finite(low) else "(no interval: read from the weights)"
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{_esc(row[name])}</td><td>{interval}</td></tr>")
    return ("<table><thead><tr><th>metric</th><th>mean</th><th>95% CI</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _claim_rows(claims: pd.DataFrame, label: str) -> str:
    if not len(claims):
        return '<p class="muted">No claims tested.</p>'
    mine = claims[[label in [p.strip() for p in str(lbl).split("~")] for lbl in claims["label"]]]
    if not len(mine):
        return '<p class="muted">No claim was proposed for this head.</p>'
    items = []
    for _, row in mine.iterrows():
        verdict = str(row["verdict"])
        statement = row.get("statement", row["claim"])
        reasons = "".join(f"<li>{html.escape(r)}</li>" for r in str(row.get("reasons", "")).split("; ") if r)
        expect = row.get("expect")
        pinned = ""
        if isinstance(expect, str):  # a claims-file claim: it says which verdict it expected
            outcome = "as expected" if bool(row.get("passed")) else "NOT as expected"
            pinned = f"; expected {html.escape(expect)}: {outcome}"
        items.append(f'<li><span class="{html.escape(verdict)}">{html.escape(verdict)}</span> '
                     f'{html.escape(str(statement))} <span class="muted">({html.escape(str(row.get("source", "")))}, '
                     f'p<sub>adj</sub> {_esc(row["p_adjusted"])}{pinned})</span>'
                     f'<ul class="reasons">{reasons}</ul></li>')
    return "<ul>" + "".join(items) + "</ul>"


def _html(data: ReportData, table: pd.DataFrame, images: dict[str, str]) -> str:
    title = f"Attention report: {data.summary['spec']}"
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             f'<p class="muted">seed {data.settings["seed"]}; {data.settings["prompts"]["n"]} prompts of '
             f'{data.settings["prompts"]["n_pos"]} tokens; files: heads.csv, claims.csv, summary.md</p>']
    parts.append("<h2>Model</h2><table><tbody>" + "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in data.summary.items()) + "</tbody></table>")
    parts.append("<h2>Strongest findings</h2>" + _html_table(table))
    parts.append("<h2 id=\"leakage\">Leakage verdict</h2>")
    if data.leakage is None:
        parts.append('<p class="muted">Not audited.</p>')
    else:
        cls = "supported" if data.leakage["causal"] else "refuted"
        parts.append(f'<p class="{cls}">{html.escape(data.leakage["verdict"])}</p>'
                     f'<div class="verdict-box">{html.escape(data.leakage["text"])}</div>')
    parts.append("<h2 id=\"heads\">Heads</h2><div class=\"cards\">")
    for _, row in data.heads.iterrows():
        label = row["label"]
        parts.append(f'<div class="card" id="{html.escape(label)}"><h3>{html.escape(label)}</h3>'
                     f'<img src="{html.escape(images[label])}" alt="{html.escape(label)} mean pattern and offset profile">'
                     f"{_metric_rows(row)}<h4>Claims</h4>{_claim_rows(data.claims, label)}</div>")
    parts.append("</div>")
    parts.append("<h2 id=\"redundancy\">Similarity, importance and redundancy</h2><div class=\"wide\">")
    for key, alt in (("similarity", "head pattern similarity heat map"), ("importance", "head importance heat map")):
        if key in images:
            parts.append(f'<img src="{html.escape(images[key])}" alt="{alt}"> ')
    parts.append("</div>")
    if data.redundancy is not None and len(data.redundancy):
        parts.append("<h3>Joint ablation of the most similar pairs</h3>" + _html_table(data.redundancy))
    else:
        parts.append('<p class="muted">No joint ablation (fewer than two heads, or no meaningful loss).</p>')
    parts.append("<h2 id=\"claims\">All claims</h2>" + _html_table(
        data.claims, ["label", "claim", "verdict", "p_adjusted", "source", "expect", "passed", "reasons"]))
    parts.append("<h2 id=\"methods\">Methods</h2><ul>" + "".join(f"<li>{html.escape(m)}</li>" for m in data.methods) + "</ul>")
    parts.append(f'<p class="muted">Stage timings (s): {html.escape(", ".join(f"{k} {v:.1f}" for k, v in data.timings.items()))}</p>')
    parts.append("</body></html>\n")
    return "\n".join(parts)
