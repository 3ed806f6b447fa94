"""What a report prints, decided once: p-values, evidence tables, the data dictionary.

- `format_p` is the one way a p-value is written (HTML, Markdown, CSV-free text): three
  decimals from 0.001 up, two significant digits in scientific notation below, and at the
  resampling floor "≤ 1/(B+1)" with B the number of sign flips (a permutation p-value is
  (hits + 1) / (B + 1), so no value below the floor can be shown).
- `evidence_rows` turns a `interp.claims.Verdict` into one row per evidence kind the claim
  defines: effect, CI, the pass rule, the test's p-value and a status word (passed / failed /
  undecided / not run, with why). It reads the structured `Evidence` objects only. `collapse` keeps
  the rows that measured something and names the rest once ("not run: stability, off by default"),
  so a table never holds a row of empty cells per kind not run.
- `causal_evidence` / `evidence_ablation`: a claim's causal evidence that ran, and the ablation it used
  (the evidence's `extra["ablation"]`), for the findings' causal verdict and the `ablation` columns.
- `GLOSSARY` defines every metric and column the report writes; `columns_markdown` renders
  the dictionary shipped as `columns.md` next to the CSVs (with `SCHEMA_VERSION`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from interp.claims import DEFAULT_EVIDENCE, MIN_EFFECT, SUPPORTING_KINDS, Verdict
from interp.schemas import REPORT_SCHEMA

# bump when a column, a JSON key or a file of the report changes meaning (record it in CHANGELOG.md)
SCHEMA_VERSION = REPORT_SCHEMA  # interp.schemas keeps every version the toolkit writes
FLOOR_TOLERANCE = 1e-6  # relative: p-values may come back as float32


def format_p(p: Any, n_resamples: int = 0) -> str:
    """One way to write a p-value everywhere; "≤ 1/(B+1)" at the floor of a B-resample test."""
    try:
        p = float(p)
    except (TypeError, ValueError):
        return "n/a"
    if not math.isfinite(p):
        return "n/a"
    if n_resamples and p <= (1 + FLOOR_TOLERANCE) / (n_resamples + 1):
        return f"≤ 1/{n_resamples + 1}"
    if p >= 0.001:
        return f"{p:.3f}"
    return f"{p:.1e}"


def format_num(value: Any, digits: int = 3) -> str:
    """A float with `digits` decimals (scientific below 1e-3 in magnitude); '' for NaN / None."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "" if value is None else str(value)
    if not math.isfinite(value):
        return ""
    if value != 0 and abs(value) < 10 ** -digits:
        return f"{value:.1e}"
    return f"{value:.{digits}f}"


def format_ci(low: Any, high: Any, digits: int = 3) -> str:
    lo, hi = format_num(low, digits), format_num(high, digits)
    return f"[{lo}, {hi}]" if lo and hi else ""


# --------------------------------------------------------------------------- evidence tables


@dataclass(frozen=True)
class EvidenceRow:
    """One line of a claim's evidence table, ready to print."""

    kind: str
    measure: str  # what the effect is (metric, difference, fraction recovered)
    effect: str
    ci: str
    rule: str
    p: str
    status: str  # passed | failed | undecided | not run
    why: str  # for not run / undecided: the reason; else the evidence's detail
    decisive: bool


def status_word(passed: bool | None) -> str:
    """passed / failed / undecided, for an evidence's `passed` flag."""
    return {True: "passed", False: "failed", None: "undecided"}[passed]


def _not_run_reason(kind: str, requested: Sequence[str], observational_abstained: bool) -> str:
    if kind not in requested:
        if kind == "stability":
            return "off by default (costly: reruns the test under several conditions)"
        return "skipped: the model has no meaningful next-token loss to ablate against (see Methods)"
    if observational_abstained:
        return "skipped: the observational metric could not be measured on these prompts"
    return "not gathered"


def evidence_rows(verdict: Verdict, requested: Sequence[str] | None = None) -> list[EvidenceRow]:
    """One row per evidence kind the claim defines, from the structured Evidence objects."""
    requested = tuple(DEFAULT_EVIDENCE if requested is None else requested)
    gathered = {e.kind: e for e in verdict.evidence}
    obs = gathered.get("observational")
    abstained = obs is not None and not math.isfinite(obs.effect)
    rows = []
    for kind in verdict.claim.kinds:
        e = gathered.get(kind)
        if e is None:
            rows.append(EvidenceRow(kind, "", "", "", "", "", "not run", _not_run_reason(kind, requested, abstained), False))
            continue
        threshold = verdict.claim.thresholds.get(kind)
        rule = e.rule or (threshold.rule() if threshold else "")
        rows.append(EvidenceRow(kind, e.metric or _measure(kind), format_num(e.effect), format_ci(e.ci_low, e.ci_high), rule,
                                format_p(e.p_value, e.n_resamples), status_word(e.passed), e.detail, e.decisive))
    return rows


def collapse(rows: Sequence[EvidenceRow], reasons: bool = True) -> tuple[list[EvidenceRow], str]:
    """The rows worth a table row, and one line for the rest: evidence not run, and evidence that ran but
    measured nothing (an abstention: undecided, no number), each named once, with why unless `reasons` is
    False: "not run: control_random_init, skipped: ...; stability, off by default ...". A measured-nothing
    evidence that decided the verdict (failed) keeps its row."""
    def empty(r: EvidenceRow) -> bool:
        return r.status == "not run" or (r.status == "undecided" and not r.effect)

    kept = [r for r in rows if not empty(r)]
    groups = (("not run", [r for r in rows if r.status == "not run"]),
              ("nothing measured", [r for r in rows if r.status == "undecided" and not r.effect]))
    joiner = "; " if reasons else ", "
    line = "; ".join(f"{word}: " + joiner.join(f"{r.kind}, {r.why}" if reasons and r.why else r.kind for r in group)
                     for word, group in groups if group)
    return kept, line


CAUSAL_KINDS = ("necessity", "sufficiency", "faithfulness")  # the evidence kinds that intervene on the model


def causal_evidence(verdict: Verdict | None) -> list:
    """The claim's causal evidence (`CAUSAL_KINDS`) that ran and measured or decided something (no abstentions)."""
    if verdict is None:
        return []
    return [e for e in verdict.evidence if e.kind in CAUSAL_KINDS and (_finite(e.effect) or e.passed is not None)]


def evidence_ablation(verdict: Verdict | None, kind: str | None = None) -> str:
    """How the claim's causal evidence removed the head: the `extra["ablation"]` of its `kind` evidence (default:
    necessity, else the first causal evidence that names one), else the claim's `method` parameter (pair claims,
    whose every evidence ablates); '' when no causal evidence ran or none says (a pattern substitution ablates nothing)."""
    ran = causal_evidence(verdict)
    if verdict is None or not ran:
        return ""
    chosen = [e for e in ran if e.kind == kind] if kind else sorted(ran, key=lambda e: e.kind != "necessity")
    for e in chosen:
        ablation = (e.extra or {}).get("ablation")
        if ablation:
            return str(ablation)
    method = verdict.claim.params.get("method") if hasattr(verdict.claim.params, "get") else None
    return str(method) if method and chosen else ""


_MEASURES = {
    "observational": "metric", "control_shuffled": "metric on shuffled tokens",
    "control_random_init": "trained minus random-init", "necessity": "targeted knockout minus equal-mass control",
    "sufficiency": "fraction of loss recovered", "faithfulness": "fraction of the knockout's effect the ideal reproduces",
    "zero": "behaviour change with the edge zeroed (off-distribution, supporting only)",
    "qk_attribution": "sender's terms in the receiver's score difference (supporting only)",
    "stability": "agreement rate",
}


def _measure(kind: str) -> str:
    return _MEASURES.get(kind, "")


def evidence_rows_from_columns(row: Mapping[str, Any]) -> list[EvidenceRow]:
    """For claims without a Verdict object (e.g. a claims file's): the flat `{kind}` columns."""
    rows = []
    for kind in _MEASURES:
        if kind not in row or not _finite(row.get(kind)):
            continue
        passed = row.get(f"{kind}_passed")
        status = status_word(None if passed is None or (isinstance(passed, float) and math.isnan(passed)) else bool(passed))
        rows.append(EvidenceRow(kind, _measure(kind), format_num(row[kind]),
                                format_ci(row.get(f"{kind}_ci_low"), row.get(f"{kind}_ci_high")), "", "", status, "", False))
    return rows


def claim_floor(verdict: Verdict | None) -> int:
    """B of the claim's p-value (the largest among its evidence's resample counts); 0 when unknown."""
    if verdict is None:
        return 0
    return max((e.n_resamples for e in verdict.evidence if e.kind not in SUPPORTING_KINDS), default=0)


def tested_offset(verdict: Verdict | None) -> str | None:
    """The relative offset a positional claim was tested at ("-1", "first"), from its observational evidence."""
    if verdict is None:
        return None
    obs = verdict.get("observational")
    metric = obs.metric if obs is not None else ""
    match = re.fullmatch(r"argmax_at:(.+)", metric or "")
    if match:
        return match.group(1)
    offset = verdict.claim.params.get("offset")
    return None if offset is None else str(offset)


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


# --------------------------------------------------------------------------- the data dictionary

# exact column names; suffix rules below cover `{x}_ci_low`, `{kind}_passed`, ...
GLOSSARY: dict[str, str] = {
    "label": "the head as L{layer}H{head} (0-based); several heads joined by ' ~ '; 'model' for a whole-model claim",
    "layer": "attention layer, 0-based (an integer)", "head": "head within its layer, 0-based (an integer)",
    "prev_token": "mean attention weight on the previous token (offset -1), over scored queries; in [0, 1]",
    "self_token": "mean attention weight on the query's own position (offset 0); in [0, 1]",
    "next_token": "mean attention weight on the next token (offset +1); in [0, 1]; empty for causal models",
    "first_token": "mean attention weight on the first real token ([CLS] / BOS when the prompt has one); in [0, 1]",
    "local_window": "mean attention weight on keys within 3 positions of the query (|key - query| <= 3); in [0, 1]",
    "mean_distance": "expected |key - query| under the pattern, in token positions (0 = attends to itself)",
    "entropy": "entropy of the attention row divided by log(number of keys the query may see): 1 = uniform, 0 = one key",
    "prev_token_argmax": "fraction of queries whose largest weight is on the previous token (ties split); in [0, 1]",
    "self_token_argmax": "fraction of queries whose largest weight is on themselves (ties split); in [0, 1]",
    "next_token_argmax": "fraction of queries whose largest weight is on the next token (ties split); in [0, 1]",
    "first_token_argmax": "fraction of queries whose largest weight is on the first token (ties split); in [0, 1]",
    "induction": "mean weight a repeated token puts on the token after its earlier occurrence (prefix matching, "
                 "Olsson et al. 2022); in [0, 1]; repeated prompts only",
    "duplicate_token": "mean weight a repeated token puts on its earlier occurrences; in [0, 1]; repeated prompts only",
    "copying": "OV-circuit copying score sum(eig) / sum(|eig|) of W_E W_V W_O W_U (Elhage et al. 2021), in [-1, 1]; "
               "+1 = raises the logit of the attended token; read from the weights, so no CI",
    "importance": "increase of the behaviour's loss (the `behaviour` column; nats for a loss) when the head's output is "
                  "ablated (the `ablation` column; see Methods)",
    "n_prompts": "number of prompts the row's statistics are computed over (the unit of statistics)",
    "claims_supported": "claim kinds about this head that were supported (';'-separated)",
    "claims_refuted": "claim kinds about this head that were refuted (';'-separated)",
    "claims_inconclusive": "claim kinds about this head that were inconclusive (';'-separated)",
    "claim": "claim kind (previous_token, induction, positional, first_token, self_token, ...)",
    "statement": "what the claim asserts, in words",
    "verdict": "supported / refuted / inconclusive (rules in interp.claims)",
    "p_value": "the claim's p-value: the largest one-sided p-value among its evidence (intersection-union test); "
               "a permutation p-value, never below 1/(B+1)",
    "p_adjusted": "p_value after Benjamini-Hochberg correction over the claims tested together",
    "source": "where the claim came from: the scan of every head, or a claims file",
    "reasons": "the verdict's reasons, one per evidence that decided it, joined by '; ' (for reading; the "
               "evidence columns hold the numbers)",
    "proposed_on": "number of prompts the scan used to propose the claim (disjoint from those it was tested on)",
    "expect": "the verdict a claims file expected", "passed": "whether the verdict equals the expected one",
    "name": "the claim's name in the claims file", "heads": "the claim's heads",
    "observational": "the claim's metric on held-out prompts (its threshold is in the evidence table)",
    "control_shuffled": "the claim's metric on shuffled-token prompts",
    "control_random_init": "a difference: the trained model's metric minus a randomly initialised model's, paired "
                           "per prompt (the random-init level itself is quoted in the reasons)",
    "necessity": "behaviour change when only the attention the claim predicts is knocked out (the head's weight on "
                 "the role's target keys removed and renormalised over the rest), minus that of knocking out an equal "
                 "mass of its other attention, paired per prompt; it must reach the practical minimum effect, and, "
                 "when the head matters as a whole, cost at least half of its whole-head mean ablation ('role share')",
    "sufficiency": "fraction of loss recovered, (L_ablated - L_substituted) / (L_ablated - L_clean), when the head's "
                   "pattern is replaced by the claim's ideal pattern; 1 = all of it; threshold 0.5 by default (see "
                   "'sufficiency threshold'); 'not informative' when the real pattern already is the ideal (see "
                   "'tautology guard')",
    "faithfulness": "how much of the head's effect the claim's own ideal pattern reproduces: 1 - (L_ideal - L_clean) "
                    "/ (L_knocked_out - L_clean), the knockout being the costlier of the targeted knockout and the "
                    "whole-head mean ablation; threshold 0.5 (the toolkit's convention); 'inconclusive: no effect' "
                    "when neither costs the practical minimum",
    "zero": "composition claims, supporting only (never part of the verdict): the behaviour's change when the receiver "
            "reads zero in place of the sender's write along the edge (off-distribution: zero is no value the model "
            "sees); beside the path patch, it shows whether a write that resampling cannot change matters at all",
    "qk_attribution": "composition claims through a query or key, supporting only (never part of the verdict): the "
                      "sender's exact terms in the receiver's score difference between the key it attends to and the "
                      "next-best key (ln1's scale frozen; score units, mean over the repeated copies' queries, CI over "
                      "prompts; interp.analyses.claims.qk_attribution)",
    "stability": "fraction of perturbed conditions (prompt halves, batch order, bfloat16) where the outcome agrees",
    "layer_a": "first head of the pair: layer", "head_a": "first head of the pair: head",
    "layer_b": "second head of the pair: layer", "head_b": "second head of the pair: head",
    "label_a": "first head of the pair", "label_b": "second head of the pair",
    "interaction": "delta_both - (delta_a + delta_b), nats: < 0 the heads overlap (together less than apart), "
                   "> 0 they back each other up",
    "delta_a": "loss increase (nats) when head a alone is mean-ablated",
    "delta_b": "loss increase (nats) when head b alone is mean-ablated",
    "delta_both": "loss increase (nats) when both heads are mean-ablated together",
    "behaviour": "the behaviour the row's causal numbers measured (e.g. next-token loss on the repeated copies, "
                 "masked-LM loss, embedding change): importance in heads.csv, the deltas in redundancy.csv, the causal "
                 "evidence in claims.csv; empty when the row holds no causal number",
    "ablation": "how the head's output was removed for the row's causal numbers: mean (its per-position mean over the "
                "prompts), resample (its output on another prompt), zero; empty when the row holds no causal number or "
                "its evidence does not say",
    "finding": "a finding of the report's headline (summary.md, report.json): a supported claim, one that holds "
               "observationally only, or a measured extreme",
    "family": "what a finding's effect is: attention weight (a mean weight on the claimed keys, in [0, 1]), argmax "
              "rate (the fraction of queries whose maximum weight sits on the claimed key, in [0, 1]), causal effect (a "
              "change of the behaviour, in its unit) or leakage audit; findings are ranked inside their family only, "
              "never an argmax rate against a weight",
    "evidence": "a finding's effect with its 95% CI and unit, and the claim's adjusted p-value",
    "causal": "the causal verdict of a finding's claim: supported (every causal evidence that ran passed), refuted "
              "(a decisive one failed) or inconclusive, with the necessity effect and its CI in the behaviour's unit; "
              "'not tested causally' when the claim has no causal evidence or none ran",
    "weight": "mean attention weight at the relative offset", "offset": "relative offset key - query (-1 = previous token)",
}
# terms the report uses that are not columns
TERMS: dict[str, str] = {
    "scored query": "a real (non-padding) query with at least two keys it may attend to; offset metrics also need "
                    "their target key to exist",
    "attention knockout": "necessity's intervention: remove a head's weight on some keys and renormalise over the "
                          "rest; a row left with under 2% of its mass (interp.interventions.NEAR_ZERO_REMAINDER) gets "
                          "the head's mean pattern over the other keys instead, never a division by a near-zero "
                          "remainder. The control takes the same mass from non-target keys (seeded per prompt); when "
                          "it can match under half of the target mass (the head attends almost only to its targets) "
                          "the evidence says so",
    "role share": "for necessity: the targeted knockout's cost over the whole-head mean ablation's, required >= 0.5 "
                  "when the head matters as a whole (the toolkit's convention: the claimed attention carries most of "
                  "what the head does). A false role can put a little mass on keys that matter and beat its control, "
                  "yet explain a few percent of the head",
    "tautology guard": "sufficiency and faithfulness are 'not informative' (undecided, and not counted for or "
                       "against the claim) when the head's real pattern is within 0.05 mean L1 distance per query of "
                       "the ideal (at most 2.5% of a query's attention moved): substituting the ideal then changes "
                       "nothing, and a zero-width interval is determinism, not precision",
    "resample ablation": "replacing a head's output by its value on another prompt at the same token role; kind "
                         "'auto' (interp.interventions.AUTO_RESAMPLE_BELOW) picks it over mean ablation for a head "
                         "whose across-prompt variance is under 5% of its mean squared norm (mean ablation would be "
                         "a near no-op there)",
    "verdict minimum": "a verdict needs 32 prompts (interp.claims.MIN_PROMPTS_FOR_VERDICT): below it a 95% interval "
                       "on a skewed attention metric covers less than it says (measured: 0.86-0.94 at 8 prompts); "
                       "intervals are studentized bootstrap ones",
    "mean ablation": "replacing a head's output z by its mean over the prompts at the same token role (the same "
                     "position when prompts share one layout; special tokens matched to each other otherwise)",
    "B": "the number of random sign flips behind a permutation p-value; p = (hits + 1) / (B + 1) >= 1/(B+1)",
    "one-sided test": "every p-value here tests one direction: 'the requirement holds' for evidence (effect beyond "
                      "its rule), 'interaction > 0' for joint ablation",
    "Benjamini-Hochberg": "false-discovery-rate correction over a family of tests (the scan's claims; the pairs)",
    "nats": "natural-log units of the cross-entropy loss",
    "argmax rate": "the fraction of queries whose largest attention weight sits on a key (a positional claim's "
                   "effect): 1.0 can go with a mean weight there well below 1, so it is never ranked beside a weight",
    "practical minimum effect": "the smallest causal effect that counts as support, in the behaviour's unit "
                                "(interp.claims.MIN_EFFECT): " + ", ".join(f"{v:g} {k}" for k, v in MIN_EFFECT.items())
                                + ". A CI above 0 alone never supports: with enough prompts any nonzero effect has "
                                "one. The toolkit's convention, not a paper's: 0.01 nats is a 1% change of the "
                                "per-token perplexity; 0.001 cosine distance is about the 20th percentile of MiniLM-L6's "
                                "72 single-head mean-ablation effects on its sentence embedding (median 0.0016); a "
                                "fraction (of loss recovered, "
                                "of a write taken over) must reach 0.1",
    "sufficiency threshold": "the fraction of the loss the claim's ideal pattern must recover (0.5 by default, the "
                             "presets' sufficiency=0.5): the toolkit's convention for 'most of the effect', not a "
                             "threshold taken from a paper",
}
_SUFFIXES = (
    ("_ci_low", "lower end of the 95% bootstrap confidence interval of `{base}` (over prompts)"),
    ("_ci_high", "upper end of the 95% bootstrap confidence interval of `{base}` (over prompts)"),
    ("_passed", "whether the `{base}` evidence passed: True / False / empty = undecided or not run"),
)


def define(column: str) -> str | None:
    """The glossary entry of a column (exact name, else by its suffix); None when undefined."""
    if column in GLOSSARY:
        return GLOSSARY[column]
    registered = _head_type_glossary()
    if column in registered:
        return registered[column]
    for suffix, text in _SUFFIXES:
        base = column[: -len(suffix)]
        if column.endswith(suffix) and (base in GLOSSARY or base in registered):
            return text.format(base=base)
    return None


def _head_type_glossary() -> dict[str, str]:
    """Glossary entries of registered head types' columns (`interp.analyses.head_types`): metric and argmax rate."""
    from interp.analyses.head_types import HEAD_TYPES

    out = {}
    for t in HEAD_TYPES.values():
        out[t.column] = t.description or f"mean attention weight on the keys a {t.name} head attends to; in [0, 1]"
        out[f"{t.column}_argmax"] = (f"fraction of queries whose largest weight is on a key a {t.name} head attends to "
                                     "(ties split); in [0, 1]")
    return out


def columns_markdown(files: Mapping[str, Iterable[str]]) -> str:
    """The data dictionary: every column of every CSV, defined (a column without an entry says so)."""
    lines = [f"# Columns of the report's CSV files (schema version {SCHEMA_VERSION})", "",
             "Every number is a mean over prompts unless said otherwise; intervals are 95% bootstrap intervals "
             "over prompts. p-values are one-sided permutation p-values, at least 1/(B+1) for B sign flips.", ""]
    for name, columns in files.items():
        lines += [f"## {name}", "", "| column | meaning |", "|---|---|"]
        for column in columns:
            meaning = JOINT_P.get(column) if name == "redundancy.csv" and column in JOINT_P else define(column)
            meaning = meaning or UNDEFINED
            lines.append(f"| `{column}` | {meaning} |")
        lines.append("")
    return "\n".join(lines)


UNDEFINED = "(no definition yet: add one to interp.analyses.report.format.GLOSSARY)"
JOINT_P = {
    "ci_low": "lower end of the 95% bootstrap interval of interaction (over prompts)",
    "ci_high": "upper end of the 95% bootstrap interval of interaction (over prompts)",
    "p_value": "one-sided sign-flip p-value that interaction > 0 (backup heads); a strongly negative interaction "
               "(overlap) therefore has p near 1",
    "p_adjusted": "p_value after Benjamini-Hochberg over the pairs tested",
}


def glossary_items(columns: Iterable[str]) -> list[tuple[str, str]]:
    """(column, meaning) for the HTML glossary, each column once, undefined ones left out."""
    out = []
    for column in dict.fromkeys(columns):
        if column.endswith(("_ci_low", "_ci_high", "_passed")):
            continue
        meaning = define(column)
        if meaning is not None:
            out.append((column, meaning))
    return out


def frame_columns(frame: pd.DataFrame | None) -> list[str]:
    return [] if frame is None else [str(c) for c in frame.columns]
