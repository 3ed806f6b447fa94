"""The report's strongest findings: one row per finding (finding, heads, evidence, verdict).

The leakage audit's verdict comes first, then supported heads ranked by their strongest
observational effect, heads that hold observationally but failed another test, and the measured
extremes (the most important head, the most decided pair). Heads are ordered by their (layer, head)
integers (`head_order`), never by parsing labels.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import pandas as pd

import interp.analyses.report.format as fmt
from interp.analyses.report.pipeline import ReportData
from interp.heads import head_label


def highlights(data: ReportData, limit: int = 8) -> pd.DataFrame:
    """The strongest findings: finding, heads, evidence, verdict; supported heads ranked by effect size.

    `attrs["n_supported"]` / `attrs["n_shown"]` count the supported heads and those shown."""
    rows = [] if data.leakage is None else [_leakage_finding(data.leakage)]
    supported = _supported_by_head(data)
    shown = supported[:limit]
    for label, group in shown:
        best, verdict = group[0]
        p_text = fmt.format_p(best["p_adjusted"], fmt.claim_floor(verdict))
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
    groups: dict[str, list] = {}
    order: dict[str, tuple] = {}
    for row, verdict, heads in data.claim_rows():
        if row["verdict"] == "supported":
            groups.setdefault(str(row["label"]), []).append((row, verdict))
            order[str(row["label"])] = head_order(heads)
    for group in groups.values():
        group.sort(key=lambda rv: -_effect(rv[0]))
    return sorted(groups.items(), key=lambda item: (-_effect(item[1][0][0]), order[item[0]]))


def head_order(heads: Sequence[tuple[int, int]]) -> tuple:
    """Sort key of a claim's subject heads: L1H3 before L1H10; pairs by their first head; a model claim first."""
    return (0, *(int(x) for head in heads for x in head)) if heads else (-1,)


def _effect(row) -> float:
    value = row.get("observational")
    return float(value) if _finite(value) else -math.inf


def _finding_name(row, verdict) -> str:
    name = str(row["claim"])
    offset = fmt.tested_offset(verdict) if name == "positional" else None
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
    rows: list[dict[str, str]] = []
    seen = set(supported)
    candidates = [(r, v, heads) for r, v, heads in data.claim_rows()
                  if r["verdict"] == "inconclusive" and _is_true(r["observational_passed"])]
    for row, verdict, _ in sorted(candidates, key=lambda rvh: (-_effect(rvh[0]), head_order(rvh[2]))):
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
        rows.append({"finding": "most important head (mean ablation)", "heads": head_label((top["layer"], top["head"])),
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
