"""The report's HTML page and Markdown summary, rendered from a `interp.analyses.report.ReportData`.

Every claim is shown as a small evidence table built from its `interp.claims.Verdict`
(`interp.analyses.report.format.evidence_rows`), p-values go through `format_p`, wide tables sit in
horizontal scroll containers, and the page ends with a glossary, the methods and a provenance
footer. The page is self-contained: images by relative path, no external script or style.
"""
from __future__ import annotations

import html
from typing import Any, Sequence

import pandas as pd

import interp.analyses.report.format as fmt
from interp.analyses.report.findings import metric_family, table_caption
from interp.viewer import viewer_html

PAGE_SIZE = "@@PAGE_SIZE@@"  # replaced by the page's own size once it is assembled
VERDICT_CLASSES = {"supported": "supported", "refuted": "refuted", "inconclusive": "inconclusive",
                   "causal": "supported", "exact_zero": "supported", "numerical_noise": "supported", "leak": "refuted",
                   "bidirectional": "neutral", "measured": "neutral"}

CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 2rem auto; max-width: 1200px; color: #222; padding: 0 1rem; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; margin-top: 2rem; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0; }
th, td { border: 1px solid #ddd; padding: 0.2rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.scroll { overflow-x: auto; max-width: 100%; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 1rem; }
.card { border: 1px solid #ccc; border-radius: 6px; padding: 0.6rem 0.8rem; min-width: 0; }
.card h3 { margin: 0.2rem 0 0.4rem 0; } .card h4 { margin: 0.6rem 0 0.2rem 0; }
.card img { max-width: 100%; }
.supported, .passed { color: #1a7f37; font-weight: 600; } .refuted, .failed { color: #cf222e; font-weight: 600; }
.inconclusive, .undecided { color: #9a6700; font-weight: 600; } .neutral { color: #0550ae; font-weight: 600; }
.not-run { color: #777; font-style: italic; }
.evidence { font-size: 0.78rem; } .evidence td.why { color: #555; max-width: 28rem; }
.warning { border-left: 4px solid #d4a72c; background: #fff8e5; padding: 0.4rem 0.8rem; margin: 0.4rem 0; }
.muted { color: #777; font-size: 0.85rem; }
.claim { margin: 0.4rem 0 0.8rem 0; }
dl.glossary dt { font-family: monospace; font-weight: 600; margin-top: 0.3rem; } dl.glossary dd { margin-left: 1.5rem; }
footer { margin-top: 2rem; border-top: 1px solid #ddd; padding-top: 0.5rem; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value))


def _cls(word: str) -> str:
    return VERDICT_CLASSES.get(word, "")


def table_html(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, numeric: Sequence[int] = (),
               classes: dict[int, Any] | None = None, css: str = "") -> str:
    """A table of already formatted cells, escaped; `numeric` columns right-aligned, `classes` per column."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            cls = [c for c in ("num" if i in numeric else "", (classes or {}).get(i, lambda v: "")(cell)) if c]
            attr = f' class="{" ".join(cls)}"' if cls else ""
            cells.append(f"<td{attr}>{esc(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    css_attr = f' class="{css}"' if css else ""
    return f"<table{css_attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def scroll(inner: str) -> str:
    return f'<div class="scroll">{inner}</div>'


# --------------------------------------------------------------------------- sections


def page(data, table: pd.DataFrame, images: dict[str, str]) -> str:
    """The whole report.html."""
    title = f"Attention report: {data.title or data.summary.get('spec')}"
    parts = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>',
             f"<style>{CSS}</style></head><body>", f"<h1>{esc(title)}</h1>", _subtitle(data), _warnings(data),
             _model_section(data), _findings_section(data, table), _leakage_section(data), _viewer_section(data),
             _cards_section(data, images), _similarity_section(data, images), circuit_html(data.circuit, images),
             attend_html(data.attend), _claims_section(data),
             _glossary_section(data), _methods_section(data), _footer(data), "</body></html>\n"]
    text = "\n".join(p for p in parts if p)
    return text.replace(PAGE_SIZE, f"{len(text.encode('utf-8')) / 1024:,.0f} KB")


def _subtitle(data) -> str:
    s = data.settings
    files = ["heads.csv", "claims.csv"] + (["redundancy.csv"] if data.redundancy is not None else []) + [
        "columns.md", "summary.md", "report.json"]
    links = ", ".join(f'<a href="{f}">{f}</a>' for f in files)
    return (f'<p class="muted">{esc(data.summary.get("spec"))}; seed {s["seed"]}; {s["prompts"]["n"]} '
            f'{esc(s["prompts"].get("kind", ""))} prompts of up to {s["prompts"]["n_pos"]} tokens; files: {links}</p>')


def _warnings(data) -> str:
    return "".join(f'<p class="warning"><strong>Prompts:</strong> {esc(w)}</p>' for w in data.warnings)


def _model_section(data) -> str:
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in data.summary.items())
    return f"<h2>Model</h2><table><tbody>{rows}</tbody></table>"


FINDINGS_NOTE = ("Supported heads grouped by what their effect is (family: a mean attention weight, an argmax rate, a "
                 "causal effect in the behaviour's unit) and ranked by effect size inside each family only; beside each, "
                 "its claim's causal verdict (or 'not tested causally')")
LEAKAGE_WHERE_NOTE = ("where: the hook, sequence length and query / source positions of a check's largest influence, "
                      "shown for a check that found a leak or a weight above the diagonal; a passing check's largest "
                      "influence is float rounding, not a place to look.")
WHERE_TONES = ("leak", "warn")  # leakage statuses whose `where` is a place to look (STATUS_TONE)


def _findings_section(data, table: pd.DataFrame) -> str:
    columns = list(table.columns)
    rows = [[getattr(r, c) for c in columns] for r in table.itertuples()]
    note = (f'<p class="muted">{esc(FINDINGS_NOTE)}. This table shows {esc(table_caption(table))}. Every claim: '
            f'<a href="#claims">All claims</a> ({len(data.claims)} rows) and <a href="claims.csv">claims.csv</a>.</p>')
    verdict = columns.index("verdict")
    causal = {columns.index("causal"): lambda text: _cls(str(text).split(":")[0])} if "causal" in columns else {}
    return ("<h2 id=\"findings\">Strongest findings</h2>"
            + scroll(table_html(columns, rows, classes={verdict: _cls, **causal})) + note)


def _leakage_section(data) -> str:
    out = ['<h2 id="leakage">Leakage verdict</h2>']
    report = data.leakage  # an interp.analyses.leakage.LeakageReport: its headline is the verdict's one wording
    if report is None:
        return out[0] + '<p class="muted">Not audited.</p>'
    out.append(f'<p class="{_cls(report.verdict)}">{esc(report.headline)}</p>')
    from interp.analyses.leakage import STATUS_TONE

    rows = [[r["method"], r["status"], fmt.format_num(r["max_influence"], 3) if r["max_influence"] is not None else "-",
             r["where"] if STATUS_TONE.get(r["status"]) in WHERE_TONES else ""] for r in report.summary_rows()]
    out.append(scroll(table_html(["check", "status", "max influence (of the output scale)", "where"], rows, numeric=(2,))))
    out.append(f'<p class="muted">{esc(LEAKAGE_WHERE_NOTE)}</p>')
    out.append(f"<details><summary class=\"muted\">audit text</summary><pre>{esc(str(report))}</pre></details>")
    return "".join(out)


def _viewer_section(data) -> str:
    if data.viewer is None:
        return ""
    v = data.viewer
    note = (f'<p class="muted">Per-prompt patterns of the first {len(v.tokens)} prompts for {len(v.heads)} heads (the '
            "overview: every head on the chosen prompt, click one to open its grid; hover a cell for query, key and weight), "
            f"weights quantised to 1/255 (uint8, {v.n_bytes / 1024:,.0f} KB before base64); this page: {PAGE_SIZE}.</p>")
    return '<h2 id="viewer">Attention viewer</h2>' + viewer_html(v) + note


def _cards_section(data, images: dict[str, str]) -> str:
    parts = ['<h2 id="heads">Heads</h2><div class="cards">']
    for _, row in data.heads.iterrows():
        label = row["label"]
        parts.append(f'<div class="card" id="{esc(label)}"><h3>{esc(label)}</h3>'
                     f'<img src="{esc(images[label])}" alt="{esc(label)} mean pattern and offset profile">'
                     f"{scroll(_metric_table(row))}<h4>Claims</h4>{_claim_blocks(data, (row['layer'], row['head']))}</div>")
    parts.append("</div>")
    return "".join(parts)


CAUSAL_METRICS = ("importance",)  # the heads table's causal numbers: their rows name the behaviour and the ablation


def _metric_table(row: pd.Series) -> str:
    """The head's metrics with CIs; a causal number (importance) names its behaviour and ablation in their columns."""
    names = [c for c in row.index if f"{c}_ci_low" in row.index and _finite(row[c])]  # NaN: undefined here
    causal = any(name in CAUSAL_METRICS for name in names)
    rows = []
    for name in names:
        low, high = row[name + "_ci_low"], row[name + "_ci_high"]
        interval = fmt.format_ci(low, high) if _finite(low) else "(none: read from the weights)"
        named = [str(row.get(c, "")) if name in CAUSAL_METRICS else "" for c in ("behaviour", "ablation")]
        extra = "".join(f"<td>{esc(v)}</td>" for v in named) if causal else ""
        rows.append(f'<tr><td><a href="#g-{esc(name)}">{esc(name)}</a></td><td class="num">{esc(fmt.format_num(row[name]))}</td>'
                    f"<td class=\"num\">{esc(interval)}</td>{extra}</tr>")
    header = "<th>metric</th><th>mean</th><th>95% CI</th>" + ("<th>behaviour</th><th>ablation</th>" if causal else "")
    return f"<table><thead><tr>{header}</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"


def _claim_blocks(data, head: tuple[int, int]) -> str:
    """The claims about `head` (layer, head): every claim naming it among its subject heads."""
    if not len(data.claims):
        return '<p class="muted">No claims tested.</p>'
    mine = [(row, v) for row, v, subject in data.claim_rows() if head in subject]
    if not mine:
        return '<p class="muted">No claim was proposed for this head.</p>'
    return "".join(claim_block(row, v, data.settings.get("evidence")) for row, v in mine)


def claim_block(row: pd.Series, verdict, requested=None) -> str:
    """One claim: verdict, statement, adjusted p, source (and behaviour), then its evidence table."""
    word = str(row["verdict"])
    statement = row.get("statement", row["claim"])
    p_text = fmt.format_p(row.get("p_adjusted"), fmt.claim_floor(verdict))
    extras = [str(row.get("source", "")), f"p_adj {p_text}"]
    behaviour = getattr(getattr(verdict, "claim", None), "behaviour", None) or row.get("behaviour")
    if isinstance(behaviour, str) and behaviour:
        extras.append(f"behaviour: {behaviour}")
    expect = row.get("expect")
    if isinstance(expect, str):  # a claims-file claim: it says which verdict it expected
        extras.append(f"expected {expect}: {'as expected' if bool(row.get('passed')) else 'NOT as expected'}")
    rows = fmt.evidence_rows(verdict, requested) if verdict is not None else fmt.evidence_rows_from_columns(row)
    rows, not_run = fmt.collapse(rows)
    behaviour_text = behaviour if isinstance(behaviour, str) else ""
    body = [[f"{r.kind} ({r.measure})" if r.measure else r.kind, f"{r.effect} {r.ci}".strip(), r.rule, r.p, _outcome(r),
             *((behaviour_text, _ablation(row, verdict, r.kind)) if r.kind in fmt.CAUSAL_KINDS else ("", ""))]
            for r in rows]
    evidence = table_html(["evidence (measures)", "effect [95% CI]", "rule", "p (one-sided)", "outcome", "behaviour",
                           "ablation"], body, numeric=(1, 3), classes={4: _outcome_cls}, css="evidence")
    collapsed = f'<p class="not-run evidence">{esc(not_run)}</p>' if not_run else ""
    details = "".join(f"<li><b>{esc(r.kind)}</b>: {esc(r.why)}</li>" for r in rows if r.why and r.status not in ("not run", "undecided"))
    details = f'<details><summary class="muted">what was measured</summary><ul class="evidence">{details}</ul></details>' if details else ""
    return (f'<div class="claim"><span class="{_cls(word)}">{esc(word)}</span> {esc(statement)} '
            f'<span class="muted">({esc("; ".join(e for e in extras if e))})</span>{scroll(evidence)}{collapsed}{details}</div>')


def _ablation(row: pd.Series, verdict, kind: str) -> str:
    """The ablation behind one causal evidence row (a claims file's row: its `ablation` column, for necessity)."""
    if verdict is not None:
        return fmt.evidence_ablation(verdict, kind)
    value = row.get("ablation")
    return str(value) if kind == "necessity" and isinstance(value, str) else ""


def _outcome(r) -> str:
    """passed / failed (decisive) / undecided: why / not run: why."""
    text = r.status + (" (decisive)" if r.decisive and r.status == "failed" else "")
    return f"{text}: {r.why}" if r.status in ("not run", "undecided") and r.why else text


def _outcome_cls(text: str) -> str:
    word = str(text).split(" ")[0]
    return {"passed": "passed", "failed": "failed", "undecided": "undecided", "not": "not-run"}.get(word, "")


def _similarity_section(data, images: dict[str, str]) -> str:
    parts = ['<h2 id="redundancy">Similarity, importance and redundancy</h2>']
    for key, alt in (("similarity", "head pattern similarity heat map, clustered"), ("importance", "head importance heat map")):
        if key in images:
            parts.append(scroll(f'<img src="{esc(images[key])}" alt="{alt}">'))
    parts.append(_joint_table(data.redundancy))
    return "".join(parts)


def _joint_table(frame: pd.DataFrame | None) -> str:
    """Joint ablation in six named columns; the p-value's one-sided alternative named in its header."""
    if frame is None or not len(frame):
        return '<p class="muted">No joint ablation (fewer than two heads, or no meaningful loss).</p>'
    import inspect

    from interp.stats import sign_flip_test

    b = inspect.signature(sign_flip_test).parameters["n_permutations"].default
    rows = []
    for r in frame.itertuples():
        word = "overlap" if r.ci_high < 0 else "backup" if r.ci_low > 0 else "additive (undecided)"
        rows.append([f"{r.label_a} ~ {r.label_b}", _delta(r, "delta_a"), _delta(r, "delta_b"), _delta(r, "delta_both"),
                     f"{fmt.format_num(r.interaction)} {fmt.format_ci(r.ci_low, r.ci_high)} {word}",
                     f"{fmt.format_p(r.p_value, b)} (BH {fmt.format_p(r.p_adjusted, b)})",
                     getattr(r, "behaviour", frame.attrs.get("behaviour", "")), getattr(r, "ablation", frame.attrs.get("method", ""))])
    unit = frame.attrs.get("unit") or "nats"
    headers = ["pair (a ~ b)", f"a alone: loss +{unit} [CI]", f"b alone: loss +{unit} [CI]", f"both: loss +{unit} [CI]",
               "interaction = both - (a + b) [CI]", "p, one-sided: interaction > 0", "behaviour", "ablation"]
    return ("<h3>Joint ablation of the most similar pairs</h3>" + scroll(table_html(headers, rows, numeric=(1, 2, 3)))
            + '<p class="muted">Negative interaction: the pair overlaps (ablating both costs less than the sum); the '
            "test is one-sided for backup (interaction &gt; 0), so an overlapping pair has p near 1 by design. All "
            'columns: <a href="redundancy.csv">redundancy.csv</a>.</p>')


def _delta(r, name: str) -> str:
    return f"{fmt.format_num(getattr(r, name))} {fmt.format_ci(getattr(r, name + '_ci_low'), getattr(r, name + '_ci_high'))}"


def _claims_section(data) -> str:
    claims = data.claims
    verdicts = data.verdicts or [None] * len(claims)
    rows = []
    for (_, r), v in zip(claims.iterrows(), verdicts):
        effect = fmt.format_num(r.get("observational")) + " " + fmt.format_ci(r.get("observational_ci_low"),
                                                                              r.get("observational_ci_high"))
        effect = f"{effect.strip()} ({metric_family(r, v)})" if effect.strip() else ""
        outcomes = _outcomes(v, data.settings.get("evidence")) if v else ""
        rows.append([r["label"], r["claim"], r["verdict"], effect.strip(), fmt.format_p(r.get("p_adjusted"), fmt.claim_floor(v)),
                     outcomes, r.get("source", "")])
    headers = ["head", "claim", "verdict", "observational [CI] (family)", "p_adj", "evidence outcomes", "source"]
    return ('<h2 id="claims">All claims</h2>' + scroll(table_html(headers, rows, numeric=(3, 4), classes={2: _cls}))
            + '<p class="muted">Every number and reason: <a href="claims.csv">claims.csv</a>.</p>')


def _outcomes(verdict, requested) -> str:
    """'observational passed, necessity failed; not run: stability': evidence that ran, then the rest named once."""
    shown, rest = fmt.collapse(fmt.evidence_rows(verdict, requested), reasons=False)
    return "; ".join(p for p in (", ".join(f"{r.kind} {r.status}" for r in shown), rest) if p)


def _glossary_section(data) -> str:
    columns = list(data.heads.columns) + list(data.claims.columns)
    if data.redundancy is not None:
        columns += list(data.redundancy.columns)
    items = fmt.glossary_items(columns) + sorted(fmt.TERMS.items())
    body = "".join(f'<dt id="g-{esc(k)}">{esc(k)}</dt><dd>{esc(v)}</dd>' for k, v in items)
    return ('<h2 id="glossary">Glossary</h2><p class="muted">Every column of the CSVs is defined in '
            f'<a href="columns.md">columns.md</a> (schema version {fmt.SCHEMA_VERSION}).</p><dl class="glossary">{body}</dl>')


def _methods_section(data) -> str:
    return '<h2 id="methods">Methods</h2><ul>' + "".join(f"<li>{esc(m)}</li>" for m in data.methods) + "</ul>"


def provenance_line(prov: dict[str, Any]) -> str:
    keys = ["toolkit", "git_commit", "torch", "transformer_lens", "python", "seed", "prompt_hash", "wall_time_s"]
    names = {"toolkit": "interp-attention", "git_commit": "commit", "transformer_lens": "transformer-lens",
             "prompt_hash": "prompts", "wall_time_s": "wall time (s)"}
    return "; ".join(f"{names.get(k, k)} {prov.get(k) if prov.get(k) is not None else 'n/a'}" for k in keys)


def _footer(data) -> str:
    timings = ", ".join(f"{k} {v:.1f}" for k, v in data.timings.items())
    return (f'<footer class="muted"><p id="provenance">Provenance: {esc(provenance_line(data.provenance))}; '
            f"schema version {fmt.SCHEMA_VERSION}; this page {PAGE_SIZE}.</p><p>Stage timings (s): {esc(timings)}</p></footer>")


def _finite(value) -> bool:
    return fmt._finite(value)


# --------------------------------------------------------------------------- the circuit


def _tests_rows(found: Any) -> list[list[str]]:
    return [[r.test, f"{fmt.format_num(r.value)} {fmt.format_ci(r.ci_low, r.ci_high)}".strip(), str(r.unit)]
            for r in found.tests_frame().itertuples()]


def circuit_html(section: Any, images: dict[str, str]) -> str:
    """The HTML section: the drawing, the kept edges with their effects, the tests; or why it is absent."""
    head = '<h2 id="circuit">Circuit</h2>'
    if section is None:
        return ""
    if section.summary is None:
        return head + f'<p class="muted">No circuit: {esc(_sentence(section.note))}</p>' + _layer_patches_html(section)
    found = section.summary
    circuit = found.circuit
    parts = [head, f'<p class="muted">{esc(circuit.method)} at threshold {circuit.threshold:g} of the clean-vs-patched '
             f"gap ({circuit.tau:.3g} {esc(found.unit)}), proposed on {circuit.n_prompts} prompts; every number below is "
             f"measured on the other half: {esc(found.behaviour)}."
             + (" Each edge's effect is its own path patch (the receiver reads the sender's write from another prompt, "
                "nothing else changes)." if found.nodes is None else "") + "</p>"]
    if "circuit" in images:
        parts.append(scroll(f'<img src="{esc(images["circuit"])}" alt="the circuit: nodes by layer, edges labelled with '
                            'their input and effect">'))
    if found.nodes is not None:
        parts.append(f'<p class="muted">A head-level circuit: {len(found.edges)} edges, every edge between the kept '
                     "nodes; each node's number is its removal cost from the circuit (its write patched for every "
                     "reader), not an edge's own path patch.</p>")
        rows = [[r.node, fmt.format_num(r.score), f"{fmt.format_num(r.effect)} {fmt.format_ci(r.ci_low, r.ci_high)}"]
                for r in found.nodes.itertuples()]
        parts.append(scroll(table_html(["node", "discovery score", f"removal cost ({found.unit}) [CI]"], rows,
                                       numeric=(1, 2))) if rows else '<p class="muted">No node was kept.</p>')
    else:
        rows = [[r.edge, r.via, fmt.format_num(r.score), f"{fmt.format_num(r.effect)} {fmt.format_ci(r.ci_low, r.ci_high)}"]
                for r in found.edges.itertuples()]
        parts.append(scroll(table_html(["edge", "via", "discovery score", f"path patch effect ({found.unit}) [CI]"], rows,
                                       numeric=(2, 3))) if rows else '<p class="muted">No edge was kept.</p>')
    if circuit.untested:
        parts.append(f'<p class="muted">{esc(_untested_sentence(circuit.untested))}</p>')
    tests = _tests_rows(found)
    if tests:
        parts.append("<h3>Circuit tests (held-out prompts)</h3>"
                     + scroll(table_html(["test", "value [CI]", "unit"], tests, numeric=(1,))))
    if found.curve is not None:
        parts.append(_curve_html(found.curve, images))
    return "".join(parts)


def _untested_sentence(untested: dict[str, str]) -> str:
    """How many edges were kept untested, which (the first ten) and the first one's reason."""
    shown = sorted(untested)[:10]
    more = f" and {len(untested) - len(shown)} more" if len(untested) > len(shown) else ""
    return (f"{len(untested)} edges kept untested (the corruption does not change their sender's write, so no patch "
            f"can test them): {', '.join(shown)}{more}. {_sentence(untested[shown[0]])}")


def _curve_sentence(curve: Any) -> str:
    """CPR and CMD with their CIs against the random rankings, in words."""
    text = (f"CPR {fmt.format_num(curve.cpr.mean)} {fmt.format_ci(curve.cpr.ci_low, curve.cpr.ci_high)}, CMD "
            f"{fmt.format_num(curve.cmd.mean)} {fmt.format_ci(curve.cmd.ci_low, curve.cmd.ci_high)}")
    if curve.random is not None:
        base = curve.random
        text += (f"; {base.n_rankings} random rankings: CPR {fmt.format_num(base.cpr.mean)} (from "
                 f"{fmt.format_num(base.cpr.ci_low)} to {fmt.format_num(base.cpr.ci_high)}), CMD "
                 f"{fmt.format_num(base.cmd.mean)} (from {fmt.format_num(base.cmd.ci_low)} to "
                 f"{fmt.format_num(base.cmd.ci_high)})")
    return text


def _curve_html(curve: Any, images: dict[str, str]) -> str:
    """The faithfulness curve of discovery's scores: the figure, CPR and CMD, the points with their CIs."""
    parts = ["<h3>Faithfulness over circuit sizes (MIB's CPR and CMD)</h3>",
             f'<p class="muted">The {esc(curve.score_name)} scores of every edge (from the proposing half) ranked, the '
             f"top fraction of the {curve.n_total_edges} edges kept (dangling edges pruned) and every other edge patched "
             f"from another prompt, on the {curve.n_prompts} held-out prompts. CPR: area under the curve ranked by "
             "signed score (higher is better); CMD: area of |1 - faithfulness| ranked by |score| (lower is better); "
             "both on the linear fraction axis, as MIB defines them, with 95% bootstrap CIs over prompts. "
             f"{esc(_curve_sentence(curve))}.</p>"]
    if "circuit_curve" in images:
        parts.append(scroll(f'<img src="{esc(images["circuit_curve"])}" alt="faithfulness per fraction of edges kept: '
                            'signed and |score| rankings and the random baseline">'))
    frame = curve.frame()
    signed, absolute = frame[frame.ranking == "signed"], frame[frame.ranking == "absolute"]
    rows = [[fmt.format_num(s.fraction), str(int(s.n_edges)),
             f"{fmt.format_num(s.faithfulness)} {fmt.format_ci(s.ci_low, s.ci_high)}".strip(),
             f"{fmt.format_num(a.faithfulness)} {fmt.format_ci(a.ci_low, a.ci_high)}".strip()]
            for s, a in zip(signed.itertuples(), absolute.itertuples())]
    parts.append(scroll(table_html(["fraction", "edges kept", "faithfulness, signed [CI]", "faithfulness, |score| [CI]"],
                                   rows, numeric=(0, 1, 2, 3))))
    return "".join(parts)


def _sentence(text: str) -> str:
    """`text` ending in one full stop (a note that ends in one keeps it: no "..")."""
    return text if text.endswith((".", "!", "?")) else text + "."


LAYER_PATCHES_NOTE = ("What this model allows instead: each head's write from another prompt (resampled) patched into a "
                      "later layer's whole attention input, q, k and v of all its heads together (nothing else changes); "
                      "the behaviour's change over {n} prompts ({behaviour}).")


def _layer_patches_html(section: Any) -> str:
    frame = getattr(section, "layer_patches", None)
    if frame is None or not len(frame):
        return ""
    first = frame.iloc[0]
    rows = [[r.edge, f"{fmt.format_num(r.effect)} {fmt.format_ci(r.ci_low, r.ci_high)}"] for r in frame.itertuples()]
    note = LAYER_PATCHES_NOTE.format(n=int(first["n_prompts"]), behaviour=first["behaviour"])
    return (f'<p class="muted">{esc(note)}</p>'
            + scroll(table_html(["head -> layer (attention input)", f"effect ({esc(first['unit'])}) [CI]"], rows,
                                numeric=(1,))))


def _layer_patches_markdown(section: Any) -> list[str]:
    frame = getattr(section, "layer_patches", None)
    if frame is None or not len(frame):
        return []
    first = frame.iloc[0]
    lines = [LAYER_PATCHES_NOTE.format(n=int(first["n_prompts"]), behaviour=first["behaviour"]), ""]
    lines += [f"- {r.edge}: {fmt.format_num(r.effect)} {fmt.format_ci(r.ci_low, r.ci_high)} {first['unit']}"
              for r in frame.itertuples()]
    return lines + [""]


def circuit_markdown(section: Any) -> list[str]:
    """summary.md lines: the edges and the tests, or why there is no circuit."""
    if section is None:
        return []
    if section.summary is None:
        return ["## Circuit", "", f"No circuit: {_sentence(section.note)}", ""] + _layer_patches_markdown(section)
    found = section.summary
    lines = ["## Circuit", "", f"{found.circuit.method}: {len(found.circuit.edges)} edges (effects on held-out prompts, "
             f"{found.unit}).", ""]
    if found.nodes is not None:
        lines += [f"Nodes (removal cost from the circuit, {found.unit}):", ""]
        lines += [f"- {r.node}: {fmt.format_num(r.effect)} {fmt.format_ci(r.ci_low, r.ci_high)}" for r in found.nodes.itertuples()]
    else:
        lines += [f"- {r.edge}: {fmt.format_num(r.effect)} {fmt.format_ci(r.ci_low, r.ci_high)}" for r in found.edges.itertuples()]
    if found.circuit.untested:
        lines += ["", _untested_sentence(found.circuit.untested), ""]
    lines += [f"- {test}: {value} ({unit})" for test, value, unit in _tests_rows(found)]
    if found.curve is not None:
        lines += ["", f"Faithfulness over circuit sizes ({found.curve.score_name} scores, MIB, held-out prompts): "
                  f"{_curve_sentence(found.curve)}."]
    return lines + [""]


# --------------------------------------------------------------------------- why these heads attend

ATTEND_NOTE = ("Each discussed head (a supported claim about it alone) at the last token of {n} prompts: its score "
               "difference s(q, k) - s(q, k') between the key it attends to and the highest-scoring other key, which "
               "equals log p_k - log p_k', split exactly into (query source x key source) terms with the norm's scale "
               "frozen (interp.analyses.qk; `interp qk` for one prompt). Means over prompts [95% bootstrap CI], in "
               "score units.")


def _attend_sentence(reason: Any) -> str:
    """One head's summary: where it was attributed, how much it prefers the key, its strongest source per side."""
    sides = {r.side: r for r in reason.sources.itertuples()}
    strongest = "; ".join(f"strongest {side}-side source {r.source} {fmt.format_num(r.mean)} "
                          f"{fmt.format_ci(r.ci_low, r.ci_high)}".rstrip() for side, r in sides.items())
    return (f"{reason.label} ({reason.claim}): query {reason.query}, key = its {reason.key}; weight "
            f"{fmt.format_num(reason.weight)}, score difference {fmt.format_num(reason.difference)} over "
            f"{reason.n_prompts} prompts; {strongest}.")


def _attend_rows(reason: Any) -> list[list[str]]:
    return [[r.query_source, r.key_source, f"{fmt.format_num(r.mean)} {fmt.format_ci(r.ci_low, r.ci_high)}".strip()]
            for r in reason.pairs.itertuples()]


def attend_html(section: Any) -> str:
    """The HTML section "Why these heads attend": per head its sentence and top source pairs; or why it is empty."""
    if section is None:
        return ""
    parts = ['<h2 id="attend">Why these heads attend</h2>']
    if section.heads:
        parts.append(f'<p class="muted">{esc(ATTEND_NOTE.format(n=section.heads[0].n_prompts))}</p>')
    for reason in section.heads:
        parts.append(f"<h3>{esc(reason.label)}</h3><p>{esc(_attend_sentence(reason))}</p>")
        parts.append(scroll(table_html(["query source", "key source", "mean term [CI]"], _attend_rows(reason),
                                       numeric=(2,))))
    if section.note:
        parts.append(f'<p class="muted">{"Not attributed" if section.heads else "No head attributed"}: '
                     f"{esc(_sentence(section.note))}</p>")
    return "".join(parts)


def attend_markdown(section: Any) -> list[str]:
    """summary.md lines of the same section."""
    if section is None:
        return []
    lines = ["## Why these heads attend", ""]
    if section.heads:
        lines += [ATTEND_NOTE.format(n=section.heads[0].n_prompts), ""]
    for reason in section.heads:
        lines += [f"- {_attend_sentence(reason)} Top pairs: "
                  + "; ".join(f"{q} x {k} {v}" for q, k, v in _attend_rows(reason)) + "."]
    if section.note:
        lines += [f"{'Not attributed' if section.heads else 'No head attributed'}: {_sentence(section.note)}"]
    return lines + [""]


# --------------------------------------------------------------------------- Markdown


def markdown(data, table: pd.DataFrame) -> str:
    """summary.md: the highlights, counts, the circuit's lines (`circuit_markdown`), provenance and methods."""
    lines = [f"# Attention report: {data.title or data.summary.get('spec')}", ""]
    lines += [f"> **Prompts:** {w}" for w in data.warnings] + ([""] if data.warnings else [])
    lines += [f"- **{k}**: {v}" for k, v in data.summary.items()]
    columns = list(table.columns)
    lines += ["", "## Strongest findings", "", f"{FINDINGS_NOTE}. This table shows {table_caption(table)}; "
              "every claim in claims.csv (columns defined in columns.md).", "",
              "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(getattr(r, c)).replace("|", "\\|") for c in columns) + " |" for r in table.itertuples()]
    counts = data.claims["verdict"].value_counts() if len(data.claims) else pd.Series(dtype=int)
    lines += ["", f"Claims tested: {len(data.claims)} ({', '.join(f'{v} {k}' for k, v in counts.items())}).", ""]
    lines += circuit_markdown(data.circuit)
    lines += attend_markdown(data.attend)
    lines += ["## Provenance", "", provenance_line(data.provenance) + f"; schema version {fmt.SCHEMA_VERSION}", ""]
    lines += ["## Methods", ""] + [f"- {m}" for m in data.methods] + [""]
    return "\n".join(lines)
