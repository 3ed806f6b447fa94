"""The report's strongest findings: one row per finding (finding, heads, family, evidence, verdict, causal,
behaviour, ablation).

The leakage audit's verdict comes first, then supported findings grouped by *metric family* and ranked by
effect size inside each family only: a mean attention weight, an argmax rate (the fraction of queries
whose maximum weight sits on a key) and a causal effect (a change of the behaviour, in its unit) are
different quantities, never ranked against each other. Each finding names its unit and shows the
causal verdict of its claim beside it (`causal_summary`: supported / refuted / inconclusive with the
necessity effect and its CI), or says "not tested causally". Then heads that hold observationally but
failed another test, and the measured extremes (the most important head, the most decided pair).
Heads are ordered by their (layer, head) integers (`head_order`), never by parsing labels.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

import interp.analyses.report.format as fmt
from interp.analyses.report.pipeline import ReportData
from interp.heads import head_label

COLUMNS = ["finding", "heads", "family", "evidence", "verdict", "causal", "behaviour", "ablation"]
# metric families, in the order the table shows them, each with its unit in words
WEIGHT, ARGMAX, CAUSAL, AUDIT = "attention weight", "argmax rate", "causal effect", "leakage audit"
FAMILIES = (WEIGHT, ARGMAX, CAUSAL)
NOT_TESTED = "not tested causally"
# the leakage audit's verdict (interp.analyses.leakage.VERDICTS) in the verdict column: a word, not a code name;
# its headline (the finding) says which kind of causal (no output moved, or float rounding only)
LEAKAGE_VERDICTS = {"exact_zero": "causal", "numerical_noise": "causal", "leak": "leak", "bidirectional": "bidirectional"}
# what the maximum weight of a positional claim sits on, by relative offset
_OFFSET_WORDS = {"-1": "the previous token", "0": "the query itself", "1": "the next token", "first": "the first position"}
_OFFSET_COLUMNS = {"-1": "prev_token", "0": "self_token", "1": "next_token", "first": "first_token"}


def highlights(data: ReportData, limit: int = 8) -> pd.DataFrame:
    """The strongest findings (`COLUMNS`): supported findings grouped by metric family, at most `limit` per
    family, ranked by effect size within it; each with its claim's causal verdict.

    `attrs["n_supported"]` / `attrs["n_shown"]` count the supported heads and those shown."""
    rows = [] if data.leakage is None else [_leakage_finding(data.leakage)]
    supported = _supported_findings(data)
    shown = [f for family in FAMILIES for f in [g for g in supported if g[0] == family][:limit]]
    for family, label, group in shown:
        best, verdict = group[0]
        p_text = fmt.format_p(best["p_adjusted"], fmt.claim_floor(verdict))
        rows.append({"finding": ", ".join(dict.fromkeys(_finding_name(r, v) for r, v in group)), "heads": label,
                     "family": family, "evidence": f"{_observed(data, best, verdict, family)}, p_adj {p_text}",
                     "verdict": "supported", **_causal_cells(data, best, verdict)})
    supported_heads = {label for _, label, _ in supported}
    shown_heads = {label for _, label, _ in shown}
    rows += _partial_findings(data, supported_heads, max(0, limit - len(shown_heads)))
    rows += _measured_findings(data)
    table = pd.DataFrame(rows, columns=COLUMNS).fillna("")
    table.attrs.update(n_supported=len(supported_heads), n_shown=len(shown_heads),
                       n_partial=int((table["verdict"] == "inconclusive").sum()),
                       n_measured=int((table["verdict"] == "measured").sum()), leakage=data.leakage is not None)
    return table


def table_caption(table: pd.DataFrame) -> str:
    """What the findings table shows, counted from its rows: "the leakage verdict, 7 of 7 supported heads, 1 head
    that holds observationally but not causally and 2 measured extremes" (no count of rows it does not hold)."""
    attrs = table.attrs
    n_sup, n_shown = attrs.get("n_supported", 0), attrs.get("n_shown", 0)
    parts = ["the leakage verdict"] if attrs.get("leakage") else []
    parts.append(f"{n_shown} of {n_sup} supported heads" if n_sup else "no supported head")
    n_partial, n_measured = attrs.get("n_partial", 0), attrs.get("n_measured", 0)
    if n_partial:
        parts.append(f"{n_partial} {'head that holds' if n_partial == 1 else 'heads that hold'} observationally but "
                     "failed or could not decide another test (inconclusive)")
    if n_measured:
        parts.append(f"{n_measured} measured {'extreme' if n_measured == 1 else 'extremes'}")
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]


def metric_family(row: pd.Series, verdict) -> str:
    """Which quantity a claim's observational effect is: "argmax rate" (a positional claim's fraction of
    queries whose maximum sits at the offset), "causal effect" (a pair or dispensable claim's loss change)
    or "attention weight" (a mean weight on the claimed keys, in [0, 1])."""
    obs = verdict.get("observational") if verdict is not None else None
    metric = (obs.metric if obs is not None else "") or ""
    if metric.startswith("argmax_at:") or metric.endswith("_argmax") or (obs is None and row["claim"] == "positional"):
        return ARGMAX
    if (obs is not None and "behaviour" in (obs.extra or {})) or (obs is None and _is_causal_kind(str(row["claim"]))):
        return CAUSAL
    return WEIGHT


def _is_causal_kind(kind: str) -> bool:
    """A claims file's kinds whose observational effect is itself an intervention (pairs, "dispensable", edges)."""
    from interp.analyses.claims.registry import EDGE_CLAIM_KINDS, pair_claim_kinds

    return kind in pair_claim_kinds() or kind in (*EDGE_CLAIM_KINDS, "dispensable", "does_not_compose")


def causal_summary(verdict, unit: str | None = None) -> str:
    """The claim's causal verdict in one line: "supported: necessity +3.109 [3.05, 3.17] nats (passed); sufficiency
    passed; faithfulness passed", or "not tested causally" when no causal evidence (necessity, sufficiency,
    faithfulness) ran. The word: refuted when a decisive causal evidence failed, supported when every causal
    evidence that ran passed, else inconclusive."""
    if verdict is None:
        return NOT_TESTED
    ran = fmt.causal_evidence(verdict)
    if not ran:
        return NOT_TESTED
    if any(e.passed is False and e.decisive for e in ran):
        word = "refuted"
    else:
        word = "supported" if all(e.passed is True for e in ran) else "inconclusive"
    first = next((e for e in ran if e.kind == "necessity"), ran[0])
    parts = [_evidence_text(first, unit)] + [f"{e.kind} {fmt.status_word(e.passed)}" for e in ran if e is not first]
    return f"{word}: " + "; ".join(parts)


def _evidence_text(e, unit: str | None) -> str:
    """'necessity +3.109 [3.050, 3.170] nats (passed)'; a fraction (sufficiency) has no unit."""
    status = fmt.status_word(e.passed)
    if not _finite(e.effect):
        return f"{e.kind} {status}"
    if e.kind == "sufficiency":
        return f"{e.kind} {e.effect:.3f} {fmt.format_ci(e.ci_low, e.ci_high)} of the loss recovered ({status})"
    return f"{e.kind} {_interval_text(e.effect, e.ci_low, e.ci_high, unit)} ({status})"


def _causal_cells(data: ReportData, row: pd.Series, verdict) -> dict[str, str]:
    """The causal, behaviour and ablation cells of a claim's finding (behaviour and ablation empty when untested)."""
    if verdict is None:
        return _causal_cells_from_columns(data, row)
    text = causal_summary(verdict, _unit(data))
    if text == NOT_TESTED:
        return {"causal": text + _elsewhere(data, row, verdict), "behaviour": "", "ablation": ""}
    return {"causal": text, "behaviour": _text(row.get("behaviour")) or _behaviour(data),
            "ablation": fmt.evidence_ablation(verdict)}


def _elsewhere(data: ReportData, row: pd.Series, verdict) -> str:
    """Where an untested claim's head was tested causally: "; causal verdicts of L0H1's other claims: local_window
    inconclusive"; their numbers stay on those claims' rows (another role's necessity is not this claim's)."""
    others = [f"{r['claim']} {causal_summary(v).split(':')[0]}" for r, v, _ in data.claim_rows()
              if v is not None and v is not verdict and r["label"] == row["label"] and causal_summary(v) != NOT_TESTED]
    if not others:
        return ""
    return f"; causal verdicts of {row['label']}'s other claims: " + ", ".join(dict.fromkeys(others))


def _causal_cells_from_columns(data: ReportData, row: pd.Series) -> dict[str, str]:
    """For a claims file's rows (no Verdict object): the flat necessity columns."""
    if not _finite(row.get("necessity")):
        return {"causal": NOT_TESTED, "behaviour": "", "ablation": ""}
    passed = row.get("necessity_passed")
    status = fmt.status_word(None if passed is None or (isinstance(passed, float) and math.isnan(passed)) else bool(passed))
    text = (f"{row['verdict']}: necessity "
            f"{_interval_text(row['necessity'], row.get('necessity_ci_low'), row.get('necessity_ci_high'), _unit(data))}"
            f" ({status})")
    return {"causal": text, "behaviour": _text(row.get("behaviour")) or _behaviour(data),
            "ablation": _text(row.get("ablation"))}


def _leakage_finding(report) -> dict[str, str]:
    """The leakage audit's line of the findings: its headline (worded in interp.analyses.leakage) and evidence."""
    if report.bidirectional:
        evidence = "padding " + ("leaks" if report.leaks else "inert")
    elif not math.isnan(report.max_influence):
        site = f" at {report.first_leaking_site}" if report.first_leaking_site else ""
        origin = report.origin
        where = None if origin is None else origin.location
        line = "" if where is None else f"; first at {Path(where.file).name}:{where.line} ({origin.op})"
        evidence = f"max influence {report.max_influence:.2g}{site}{line}"
    else:
        evidence = ""
    return {"finding": report.headline, "heads": "model", "family": AUDIT, "evidence": evidence,
            "verdict": LEAKAGE_VERDICTS.get(report.verdict, report.verdict), "causal": "", "behaviour": "", "ablation": ""}


def _supported_findings(data: ReportData) -> list[tuple[str, str, list]]:
    """Supported claims grouped by (metric family, head): (family, label, [(row, verdict), ...]), each group's
    strongest claim first; ranked by family (`FAMILIES`), then by effect within the family, then layer, head."""
    groups: dict[tuple[str, str], list] = {}
    order: dict[str, tuple] = {}
    for row, verdict, heads in data.claim_rows():
        if row["verdict"] == "supported":
            key = (metric_family(row, verdict), str(row["label"]))
            groups.setdefault(key, []).append((row, verdict))
            order[key[1]] = head_order(heads)
    for group in groups.values():
        group.sort(key=lambda rv: -_effect(rv[0]))
    ranked = sorted(groups.items(), key=lambda item: (FAMILIES.index(item[0][0]), -_effect(item[1][0][0]), order[item[0][1]]))
    return [(family, label, group) for (family, label), group in ranked]


def head_order(heads: Sequence[tuple[int, int]]) -> tuple:
    """Sort key of a claim's subject heads: L1H3 before L1H10; pairs by their first head; a model claim first."""
    return (0, *(int(x) for head in heads for x in head)) if heads else (-1,)


def _effect(row) -> float:
    value = row.get("observational")
    return float(value) if _finite(value) else -math.inf


def _finding_name(row, verdict) -> str:
    name = str(row["claim"])
    offset = _offset(row, verdict)
    if offset == "first":
        return f"{name} (first position)"
    return f"{name} (offset {offset})" if offset is not None else name


def _offset(row, verdict) -> str | None:
    """A positional claim's tested offset ("-1", "first"); None for other claims or when unknown."""
    if str(row["claim"]) != "positional":
        return None
    offset = fmt.tested_offset(verdict)
    if offset is None and "offset" in row.index and pd.notna(row.get("offset")):
        value = row["offset"]  # a frame's offset column may read back as floats (0.0)
        offset = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    return offset


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
        family = metric_family(row, verdict)
        rows.append({"finding": f"{_finding_name(row, verdict)} ({_what_held(verdict)})", "heads": row["label"],
                     "family": family, "evidence": f"{_observed(data, row, verdict, family)}; {_first_problem(verdict)}",
                     "verdict": "inconclusive", **_causal_cells(data, row, verdict)})
    return rows


def _what_held(verdict) -> str:
    """How far an inconclusive claim held: "observational only" when no causal test ran, else what they said."""
    causal = causal_summary(verdict)
    if causal == NOT_TESTED:
        return "observational only"
    return f"holds observationally; causal tests {causal.split(':')[0]}"


def _measured_findings(data: ReportData) -> list[dict[str, str]]:
    """The most important head and the most decided pair: causal effects, in the behaviour's unit."""
    rows = []
    if data.importance is not None and len(data.importance):
        imp = data.importance
        top = imp.sort_values("delta_loss", ascending=False).iloc[0]
        method = _text(imp.attrs.get("method")) or "mean"
        rows.append({"finding": f"most important head ({method} ablation)", "heads": head_label((top["layer"], top["head"])),
                     "family": CAUSAL,
                     "evidence": "loss " + _interval_text(top["delta_loss"], top["ci_low"], top["ci_high"], _unit(data, imp)),
                     "verdict": "measured", "causal": "", "behaviour": _named(imp, top, "behaviour") or _behaviour(data),
                     "ablation": _named(imp, top, "ablation") or method})
    if data.redundancy is not None and len(data.redundancy):
        red = data.redundancy
        decided = red[(red["ci_low"] > 0) | (red["ci_high"] < 0)]
        if len(decided):
            top = decided.loc[decided["interaction"].abs().idxmax()]
            kind = "together more than apart (backup)" if top["interaction"] > 0 else "overlapping (together less than apart)"
            rows.append({"finding": f"pair {kind}", "heads": f"{top['label_a']} ~ {top['label_b']}", "family": CAUSAL,
                         "evidence": "interaction " + _interval_text(top["interaction"], top["ci_low"], top["ci_high"],
                                                                     _unit(data, red)),
                         "verdict": "measured", "causal": "", "behaviour": _named(red, top, "behaviour") or _behaviour(data),
                         "ablation": _named(red, top, "ablation") or _text(red.attrs.get("method"))})
    return rows


def _named(frame: pd.DataFrame, row: pd.Series, column: str) -> str:
    """A row's `behaviour` / `ablation` cell, else the frame's attrs (`behaviour`; `method` for the ablation)."""
    if column in row.index and _text(row[column]):
        return _text(row[column])
    return _text(frame.attrs.get("method" if column == "ablation" else column))


def _interval_text(value: float, low: float, high: float, unit: str | None) -> str:
    """'+0.123 [0.100, 0.150] nats'; three significant digits for other units (cosine distances are small)."""
    unit = unit or "nats"
    f = ".3f" if unit == "nats" else ".3g"
    return f"{value:+{f}} [{low:{f}}, {high:{f}}] {unit}"


def _observed(data: ReportData, row, verdict, family: str) -> str:
    """The observational effect in its family's words and unit."""
    effect, low, high = (row.get(k) for k in ("observational", "observational_ci_low", "observational_ci_high"))
    if not _finite(effect):
        return str(row["claim"])
    if family == ARGMAX:
        offset = _offset(row, verdict)
        where = _OFFSET_WORDS.get(str(offset), f"relative offset {offset}") if offset is not None else "one offset"
        weight = _weight_at(data, row, offset)
        there = f"; mean weight there {weight:.3f}" if weight is not None else ""
        return (f"the maximum weight sits on {where} for {effect:.0%} [{low:.0%}, {high:.0%}] of queries "
                f"(argmax rate{there})")
    if family == CAUSAL:
        return f"{row['claim']} " + _interval_text(effect, low, high, _unit(data))
    return f"mean attention weight {effect:.3f} [{low:.3f}, {high:.3f}] on the claimed keys (in [0, 1])"


def _weight_at(data: ReportData, row, offset: str | None) -> float | None:
    """The head's mean attention weight at a positional claim's offset (heads table, else the offset profile)."""
    heads, label = data.heads, row.get("label")
    column = _OFFSET_COLUMNS.get(str(offset))
    if column and heads is not None and column in heads.columns and "label" in heads.columns:
        match = heads.loc[heads["label"] == label, column]
        if len(match) and _finite(match.iloc[0]):
            return float(match.iloc[0])
    offsets = data.offsets
    if offsets is None or offset in (None, "first") or not {"layer", "head", "offset", "weight"} <= set(offsets.columns):
        return None
    hit = offsets[(offsets["layer"] == row.get("layer")) & (offsets["head"] == row.get("head"))
                  & (offsets["offset"] == int(offset))]
    return float(hit["weight"].iloc[0]) if len(hit) and _finite(hit["weight"].iloc[0]) else None


def _unit(data: ReportData, frame: pd.DataFrame | None = None) -> str | None:
    """The behaviour's unit: the frame's attrs, else the report's settings."""
    unit = None if frame is None else frame.attrs.get("unit")
    return unit or (data.settings.get("behaviour") or {}).get("unit") or None


def _behaviour(data: ReportData) -> str:
    """The behaviour the report's causal numbers measure, in words (settings["behaviour"]["measured"])."""
    return _text((data.settings.get("behaviour") or {}).get("measured"))


def _first_problem(verdict) -> str:
    """'necessity undecided': the first evidence of the claim that did not pass, from the Evidence objects."""
    if verdict is None:
        return "not all tests passed"
    for e in verdict.evidence:
        if e.passed is not True:
            return f"{e.kind} {'failed' if e.passed is False else 'undecided'}"
    return "adjusted p-value above alpha"


def _text(value: Any) -> str:
    """A cell as text: '' for None / NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _is_true(value) -> bool:
    """A passed flag read from a frame: True only for a real True (None / NaN = undecided)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and bool(value)


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
