"""A report directory: `build_report(model, out_dir, ...)` computes (`.pipeline.compute`) and writes (`render`)
a self-contained directory that opens offline:

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
                  wall time), the circuit (edges, effects, tests; or why none), why the discussed heads
                  attend ("attend": `.attend`), schema version and every file written, machine-readable
    plots/*.png   every figure (matplotlib, no network, referenced by relative paths), the circuit's
                  drawing among them (plots/circuit.png: `.circuit`)

The numbers are deterministic for a given seed (same CSVs on rerun). The files are written
into a temporary sibling and moved into place at the end with a manifest (`interp.outdir`),
so a failure never leaves a half-written report; `force=True` replaces only the files an
earlier report wrote, and refuses, naming them, when the directory holds any other file.
Figures: `.plots`; HTML and Markdown: `.html`; formats and the glossary: `.format`; the
findings table: `.findings`; the embedded attention viewer: `interp.viewer`.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd
from torch import nn

import interp.analyses.report.format as fmt
import interp.analyses.report.html as report_html
import interp.analyses.report.plots as report_plots
import interp.outdir as outdir
from interp.analyses.report.findings import highlights
from interp.analyses.report.pipeline import LEAKAGE_LEN, MAX_CARDS, ReportData, ReportResult, compute, report_stages
from interp.data import PromptSet
from interp.launch import Device, DType
from interp.models.files import write_atomic
from interp.outdir import check_out_dir  # re-exported: `report.check_out_dir`

MARKER = ".interp-report"  # a file in every report directory: `interp demo` may replace such a directory
FLOAT_FORMAT = "%.6g"  # CSV float format: stable across runs, enough digits for every CI
# progress: one bar over the computation *and* the rendering (plots, pages, files), so it says
# "done" only when the report is on disk (interp.progress.Stages, shared with the CLI)
RENDER_STAGES = ["plots, tables and pages", "moving into place"]

OutputDirError = outdir.OutputDirError  # not a folder, not writable, or holding files no report wrote


def is_report_dir(path: str | os.PathLike) -> bool:
    """True when `path` does not exist, is empty, or holds only files a previous report wrote."""
    return outdir.is_replaceable(path)


def _commit(tmp: Path, out: Path) -> None:
    """Move the finished temporary directory's files into `out`, with a manifest; never deletes other files."""
    outdir.commit(tmp, out)


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
    with report_stages(RENDER_STAGES, progress) as stages:
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


def render(data: ReportData, folder: Path) -> pd.DataFrame:
    """Write every file of the report into `folder`; returns the highlights table."""
    started = time.perf_counter()
    plots = folder / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    images = {**report_plots.head_figures(data, plots), **report_plots.summary_figures(data, plots),
              **report_plots.circuit_figures(data.circuit, plots)}
    table = highlights(data)
    claims_csv = _claims_csv(data.claims)
    write_atomic(folder / "heads.csv", data.heads.to_csv(index=False, float_format=FLOAT_FORMAT))
    write_atomic(folder / "claims.csv", claims_csv.to_csv(index=False, float_format=FLOAT_FORMAT))
    columns = {"heads.csv": list(data.heads.columns), "claims.csv": list(claims_csv.columns)}
    if data.redundancy is not None:
        write_atomic(folder / "redundancy.csv", data.redundancy.to_csv(index=False, float_format=FLOAT_FORMAT))
        columns["redundancy.csv"] = list(data.redundancy.columns)
    write_atomic(folder / "columns.md", fmt.columns_markdown(columns))
    data.provenance["wall_time_s"] = round(data.provenance.get("wall_time_s", 0.0) + time.perf_counter() - started, 2)
    write_atomic(folder / "summary.md", report_html.markdown(data, table))
    page = report_html.page(data, table, images)
    write_atomic(folder / "report.html", page)
    leakage = None if data.leakage is None else data.leakage.brief()
    meta = {"settings": data.settings, "summary": {k: str(v) for k, v in data.summary.items()}, "leakage": leakage,
            "highlights": json.loads(table.to_json(orient="records")), "schema_version": fmt.SCHEMA_VERSION,
            "title": data.title, "provenance": data.provenance, "warnings": data.warnings,
            "sizes_bytes": _sizes(folder, data), "files": _written_files(folder, extra=["report.json"]),
            "circuit": None if data.circuit is None else data.circuit.to_json(),
            "attend": None if data.attend is None else data.attend.to_json()}
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
