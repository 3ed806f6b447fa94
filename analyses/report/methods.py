"""The report's Methods section: one paragraph a line, saying what was drawn and run, nothing else."""
from __future__ import annotations

import pandas as pd

import interp.analyses.report.format as fmt
from interp.analyses.claims.registry import NOT_MEASURED
from interp.data import PromptSet

# evidence for models without a meaningful loss (encoders, random task heads): ablation evidence
# would measure a random head's logits, and a bridge cannot be rebuilt at random initialisation
NO_LOSS_EVIDENCE = ("observational", "control_shuffled")


def behaviour_method(behaviour, prompts: PromptSet) -> str:
    """The Methods line that names the behaviour."""
    return (f"Behaviour: {behaviour.describe(prompts)} ({behaviour.description}; reads the final "
            f"{'logits' if behaviour.reads == 'logits' else 'hidden state, never the LM head'}). Importance, joint "
            "ablation and the claims' necessity, sufficiency and faithfulness measure its change.")


LEAKAGE_CHECKS = {
    "truncation": "outputs must not change when every later position is removed",
    "perturbation": "outputs at positions <= t must not move when every token after t changes",
    "gradient": "the Jacobian of each output with respect to every later input embedding must be zero",
    "pattern": "attention weight above the diagonal (reported, never trusted alone)",
    "batch": "an example's outputs must not depend on the other examples of its batch",
    "padding": "pad-token content must not move real positions, and padding must not change them",
}


def paragraphs(prompts: PromptSet, *, seed: int, leakage, has_loss: bool, claims: pd.DataFrame, verdicts=(),
               top_pairs: int) -> list[str]:
    """The Methods section, one paragraph a line; `leakage` is the audit's LeakageReport (or None), `top_pairs`
    the number of most similar pairs the joint ablation tested."""
    lines = [_prompts_paragraph(prompts, seed), _patterns_paragraph(), _claims_paragraph(claims, verdicts, has_loss)]
    if has_loss:
        lines.append(
            "Importance: the increase of the behaviour's loss (named above) when a head's output (z) is replaced by its "
            f"per-position mean over the prompts (mean ablation). Joint ablation of the {top_pairs} most similar pairs: "
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
            f"over prompts (1,000 resamples, seed {seed}); a claim's evidence uses studentized (bootstrap-t) intervals, "
            "which keep their 95% coverage on skewed attention metrics, and a verdict needs at least 32 prompts.")


def _patterns_paragraph() -> str:
    return ("Mean patterns average each query position over the prompts where it is a real token; every heat map "
            "uses one colour scale (0 to 1) unless the colour bar says otherwise. The offset profile is the mean "
            "weight at each relative offset key - query (-1 = previous token); its error bars are a "
            "normal-approximation 95% interval over prompts from streamed moments (no per-prompt values are kept).")


def _claims_paragraph(claims: pd.DataFrame, verdicts, has_loss: bool) -> str:
    floors = sorted({fmt.claim_floor(v) for v in verdicts if v is not None} - {0})
    b_text = ", ".join(f"B = {b:,}" for b in floors) or "B = 2,000"
    return (
        "Claims: `interp.analyses.claims.scan` proposes one claim per head on one half of the prompts and tests "
        "it on the other half, never on the prompts that proposed it. Each claim needs observational evidence "
        "(metric CI vs the literature's threshold) and is checked against controls: the same metric on "
        "shuffled-token prompts (position vs content)"
        + ("; on a randomly initialised model of the same shape (control_random_init is the difference trained - "
           "random-init); necessity (knocking out the attention the claim predicts against knocking out an equal "
           "mass of other attention), sufficiency (idealised pattern substitution: fraction of loss recovered, "
           "'not informative' when the head already is the ideal) and faithfulness (the share of the knockout's "
           "effect the ideal pattern reproduces), each against a practical minimum effect, on the "
           "behaviour named above" if has_loss else "")
        + ". Every p-value is a one-sided sign-flip permutation test that the requirement holds, with "
        f"{b_text} flips; p = (hits + 1) / (B + 1), so a p-value at that floor is printed \u2264 1/(B+1). A claim's "
        "p-value is the largest of its evidence; p-values are Benjamini-Hochberg corrected (alpha 0.05) within "
        "each family tested together: the scan's claims over every head, and the claims file's claims, "
        f"separately; {len(claims)} claims about the heads shown appear here."
    )
