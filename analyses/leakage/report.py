"""What the leakage audit found: `LeakageReport`, the verdict's wording and its renderings.

The wording (`VERDICT_WORDS`, `STATUS_TONE`) is defined here once; `str(report)`, `to_dict`,
the CLI, the JSON and the HTML report read the report's fields and `headline`, never its text.
Above `types` and `origin`; `stages.audit` builds the report, `ci` renders it for CI.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd

from interp.analyses.leakage.origin import Origin
from interp.analyses.leakage.types import (
    DEFAULT_TOL,
    FUTURE_METHODS,
    METHOD_KIND,
    PATTERN_TOL,
    SITE_COLUMNS,
    LeakVerdict,
    above_threshold,
)

VERDICT_WORDS: dict[str, str] = {  # `LeakageReport.headline` fills in {tol} and {leaks}
    "exact_zero": "causal: no output moved at all",
    "numerical_noise": "causal: outputs moved by float rounding only (<= tol {tol:g})",
    "leak": "LEAK ({leaks})",
    "bidirectional": "bidirectional (by design): an encoder attends both ways; its padding was audited",
}
Tone = Literal["ok", "leak", "neutral", "warn", "skipped"]
STATUS_TONE: dict[str, Tone] = {  # the status words of `LeakageReport.summary_rows`, for colouring
    "exact zero": "ok", "noise": "ok", "triangular": "ok", "leak": "leak", "weight above diagonal": "warn",
    "bidirectional": "neutral", "skipped": "skipped", "not applicable": "skipped",
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
    verdict: LeakVerdict
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
    noise_floor: dict[str, dict[str, float]] = field(default_factory=dict)  # method -> "2x64 | 2x256" -> measured floor
    floor_how: str = "float64"  # "float64" (deviations from a float64 copy) or "batch composition" (no copy: weaker)
    float64_checked: tuple[str, ...] = ()  # methods whose comparisons a float64 copy decided (float32 floor > 1e-4)
    coverage: dict[str, Any] = field(default_factory=dict)  # the cuts and lengths each method covered (`AuditPlan.coverage`)
    contracts: dict[str, Any] = field(default_factory=dict)  # kind -> `contracts.ContractResult` of each mode asked for

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
        """One row per method, then one per contract audited (`contracts`): its largest influence, where, and a
        status word (STATUS_TONE's keys)."""
        return [_summary_row(self, method) for method in self.methods] + [
            _contract_row(kind, result) for kind, result in self.contracts.items()]

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
            "noise_floor": self.noise_floor, "floor_how": self.floor_how, "margin": self.margin,
            "float64_checked": list(self.float64_checked), "coverage": self.coverage,
            "seconds": round(self.seconds, 3), "summary": _clean(self.summary_rows()),
            "table": _clean(table.to_dict("records")), "sites": _clean(sites.to_dict("records")),
            "contracts": {kind: result.to_dict() for kind, result in self.contracts.items()},
        }

    @property
    def margin(self) -> dict[str, float | None]:
        """Per method that ran, its largest influence over its own threshold: below 1 it passed by that factor, above 1
        it leaked (None: nothing measured). The pattern check's unit is an attention weight, not an output change."""
        out: dict[str, float | None] = {}
        for method in self.methods:
            mine = self.table[self.table["method"] == method]
            ratio = (mine["influence"] / mine["threshold"]).max() if len(mine) else math.nan
            out[method] = None if not math.isfinite(ratio) else float(ratio)
        for kind, result in self.contracts.items():
            ratio = result.max_influence / result.threshold if result.threshold > 0 else math.nan
            out[kind] = None if not math.isfinite(ratio) else float(ratio)
        return out

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


def _contract_row(kind: str, result: Any) -> dict[str, Any]:
    """One contract's line of the summary: "leak", "exact zero", "noise" or "not applicable"; its largest influence
    and the first finding of each kind ("over-masked at query 13 from key 9 ..."), or its last note."""
    status = result.status
    value = result.max_influence if math.isfinite(result.max_influence) else None
    return {"method": kind, "status": status, "max_influence": value, "where": result.where or "; ".join(result.notes[-1:])}


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
