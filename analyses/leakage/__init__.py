"""Causal-leakage audit: can any output position depend on a later token, where does it enter, how much?

`audit(model)` accepts a HookedGPT / HookedEncoder, a TransformerBridge, any `nn.Module`, a
spec for `interp.load`, or any callable mapping a LongTensor (batch, seq) to a tensor
(batch, seq, ...). Attention weights alone prove nothing (a mask applied after the softmax
leaves a triangular pattern and leaks through the normaliser; normalisation or convolution over
time leaks with no attention at all), so the verdict rests on what the outputs do:

- truncation: the output at position q must not change when every position after a cut is
  removed. Run once per prefix length, it compares every length 1..L with the full length L and
  covers every (query, source) pair with a change that cannot miss: the later tokens are gone.
- perturbation: for each cut t, every token after t is replaced by a different token (shifted
  resampling, so each later position really changes), several draws, many cuts per forward pass;
  outputs at positions <= t must not move. Run at several lengths.
- gradient: the Jacobian of each position's output with respect to every later input embedding
  (through `hook_embed` or the token `nn.Embedding`): exactly zero for a correct model, so a
  leak of any size from one position into one other is seen; it counts a leak above
  tol * GRADIENT_TOL_FACTOR (its rounding is ~1e-8, its unit one source position's Jacobian).
- pattern: attention weight above the diagonal at every attention site (reported, never trusted alone).
- batch: an example's outputs must not depend on the other examples of its batch.
- padding: for models taking an `attention_mask`, pad-token content must not move real positions,
  and right padding must give real positions the outputs of the unpadded sequence.
- localisation: when a leak is found, the same paired runs are repeated with every hook point
  (or, for plain modules, every submodule output) captured, in forward order; the first site
  whose outputs at observed positions move is `first_leaking_site`.

Vocabulary: a *cut* t splits a sequence into observed positions <= t and changed positions > t;
*influence* is the largest absolute change of an observed output divided by the outputs' spread
(the root mean square of the outputs minus each feature's mean over batch and position, so a
common offset cannot hide a leak; floored at 1e-2 of the RMS, see `methods._scale`): 1e-4 means a change
of 1e-4 of the output scale; it is 0.0 exactly when nothing moved. Every comparison is judged against
the model's own rounding, measured at the shapes it compares (`floor`: each run's deviation from a float64
copy, summed over the two runs): a change counts as a leak above max(`tol`, NOISE_FACTOR x floor), and
where 3 x a float32 floor exceeds 1e-4 the float64 copy decides (deep float32 models round differently at
different lengths: SmolLM2-135M by 1.8e-4). `tol` (default 5e-5) stays the lower bound: on 8 seeds of every
correct zoo model rounding reached 2.4e-6, 1.0e-5 under an offset of -300, 1.2e-6 on random GPT-2 /
HookedGPT models and 2.8e-5 on the trained toy-induction model at 128 tokens, while the smallest planted
leak (about 1e-4 of the output) measured 9.96e-5 or more. The audited length defaults to the model's
context, at most DEFAULT_MAX_LEN (256; max_len="ctx": the whole context); what each method covered is
`LeakageReport.coverage` (`fast`: every cut of a native model, the coverage cuts of a black box). A decoder that numbers
positions from the start of a left-padded row (Hugging Face GPT-2 without position_ids) gets a
note, not a leak: no information flows from the pads, which the pad-content test checks.
A model is expected to be causal unless it *declares* itself bidirectional (`declaration`: the
caller's `bidirectional=True`, our encoder configs, a Hugging Face encoder config with
`is_decoder=False`); what the attention calls look like is reported, never an excuse. A declared
encoder is reported as bidirectional by design; its padding mask and batch are audited instead.
Each leak is then located at its line of code (`origin`); `ci` renders the report as SARIF and
JUnit.

Layout (dependencies point down): `types` (methods, verdicts, the `Finding` row, thresholds) <-
`adapter` (the model seen as tokens -> outputs, its declaration) <- `methods` (the black-box
methods, localisation) <- `floor` (the noise floors) <- `fast` (the incremental reference, coverage, the
cost estimate), `origin` (the op and line, and the line that built what it consumed) <- `report` (`LeakageReport`: the verdict's wording, defined there once, and its
renderings) <- `plan` (`plan_audit`, an `AuditPlan`) <- `stages` (`audit`, run in stages:
`run_methods`, `locate_leaks` (hook sites) and `locate_origins` (lines of code), `decide_leaks`) <- `ci`.
This package re-exports the public names users and the faces read; private helpers are imported
from the module that defines them.
"""
from interp.analyses.leakage.adapter import (
    ModelAdapter,
    declaration,
    declared_bidirectional,
    infer_n_ctx,
    infer_vocab_size,
    observed_masking,
    user_forward,
)
from interp.analyses.leakage.ci import to_junit, to_sarif
from interp.analyses.leakage.fast import CostEstimate, coverage_cuts, declared_boundaries
from interp.analyses.leakage.floor import FLOAT64_DECIDES, Floors, comparison_floor, float64_copy, measure_floors
from interp.analyses.leakage.methods import (
    batch_mixing,
    embedding_module,
    gradient,
    gradient_at_cuts,
    localisation_threshold,
    localise,
    padding_check,
    pattern_check,
    perturbation,
    site_modules,
    truncation,
)
from interp.analyses.leakage.origin import Origin
from interp.analyses.leakage.plan import AuditPlan, check_weights_finite, plan_audit
from interp.analyses.leakage.report import STATUS_TONE, VERDICT_WORDS, LeakageReport, Tone, describe_row
from interp.analyses.leakage.stages import (
    BIDIRECTIONAL_HINT,
    Decision,
    Localisation,
    MethodRuns,
    audit,
    decide_leaks,
    leak_kinds,
    locate_leaks,
    locate_origins,
    run_methods,
)
from interp.analyses.leakage.types import (
    DEFAULT_MAX_LEN,
    DEFAULT_TOL,
    FUTURE_METHODS,
    GRADIENT_TOL_FACTOR,
    HALF_PRECISION_TOL,
    LEAK_KINDS,
    LOCALISE_FRACTION,
    MAX_ROWS_PER_METHOD,
    MAX_TOL,
    MAX_TOL_HALF,
    METHOD_KIND,
    METHODS,
    NOISE_FACTOR,
    PATTERN_TOL,
    SITE_COLUMNS,
    SPREAD_FLOOR,
    TABLE_COLUMNS,
    TRUSTED,
    VERDICTS,
    Finding,
    LeakKind,
    LeakVerdict,
    Method,
    Pair,
    above_threshold,
    check_tol,
    empty_table,
    findings_table,
    method_tol,
)

__all__ = [
    "above_threshold",
    "audit",
    "AuditPlan",
    "batch_mixing",
    "BIDIRECTIONAL_HINT",
    "check_tol",
    "check_weights_finite",
    "comparison_floor",
    "CostEstimate",
    "coverage_cuts",
    "decide_leaks",
    "Decision",
    "declaration",
    "declared_bidirectional",
    "declared_boundaries",
    "DEFAULT_MAX_LEN",
    "DEFAULT_TOL",
    "describe_row",
    "embedding_module",
    "empty_table",
    "Finding",
    "findings_table",
    "FLOAT64_DECIDES",
    "float64_copy",
    "Floors",
    "FUTURE_METHODS",
    "gradient",
    "gradient_at_cuts",
    "GRADIENT_TOL_FACTOR",
    "HALF_PRECISION_TOL",
    "infer_n_ctx",
    "infer_vocab_size",
    "LEAK_KINDS",
    "leak_kinds",
    "LeakageReport",
    "LeakKind",
    "LeakVerdict",
    "Localisation",
    "localisation_threshold",
    "localise",
    "LOCALISE_FRACTION",
    "locate_leaks",
    "locate_origins",
    "MAX_ROWS_PER_METHOD",
    "MAX_TOL",
    "MAX_TOL_HALF",
    "measure_floors",
    "Method",
    "METHOD_KIND",
    "method_tol",
    "MethodRuns",
    "METHODS",
    "ModelAdapter",
    "NOISE_FACTOR",
    "observed_masking",
    "Origin",
    "padding_check",
    "Pair",
    "pattern_check",
    "PATTERN_TOL",
    "perturbation",
    "plan_audit",
    "run_methods",
    "SITE_COLUMNS",
    "site_modules",
    "SPREAD_FLOOR",
    "STATUS_TONE",
    "TABLE_COLUMNS",
    "to_junit",
    "to_sarif",
    "Tone",
    "truncation",
    "TRUSTED",
    "user_forward",
    "VERDICT_WORDS",
    "VERDICTS",
]
