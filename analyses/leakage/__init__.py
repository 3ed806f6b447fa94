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
from interp.analyses.leakage.adapter import declaration, declared_bidirectional
from interp.analyses.leakage.ci import to_junit, to_sarif
from interp.analyses.leakage.origin import Origin
from interp.analyses.leakage.report import VERDICT_WORDS, LeakageReport
from interp.analyses.leakage.stages import audit
from interp.analyses.leakage.types import METHODS, VERDICTS, Finding, LeakKind, Method

# what a user calls and reads: the audit, its report and rows, their CI renderings, the methods and verdicts
__all__ = [
    "audit",
    "LeakageReport",
    "Finding",
    "Origin",
    "to_junit",
    "to_sarif",
    "declaration",
    "declared_bidirectional",
    "LeakKind",
    "Method",
    "METHODS",
    "VERDICT_WORDS",
    "VERDICTS",
]

# importable from here too, but no part of the surface (`name as name`: an explicit re-export): the stages, the
# thresholds, the methods one by one, and the helpers the faces use
from interp.analyses.leakage.adapter import ModelAdapter as ModelAdapter
from interp.analyses.leakage.adapter import infer_n_ctx as infer_n_ctx
from interp.analyses.leakage.adapter import infer_vocab_size as infer_vocab_size
from interp.analyses.leakage.adapter import observed_masking as observed_masking
from interp.analyses.leakage.adapter import user_forward as user_forward
from interp.analyses.leakage.fast import CostEstimate as CostEstimate
from interp.analyses.leakage.fast import coverage_cuts as coverage_cuts
from interp.analyses.leakage.fast import declared_boundaries as declared_boundaries
from interp.analyses.leakage.floor import FLOAT64_DECIDES as FLOAT64_DECIDES
from interp.analyses.leakage.floor import Floors as Floors
from interp.analyses.leakage.floor import comparison_floor as comparison_floor
from interp.analyses.leakage.floor import float64_copy as float64_copy
from interp.analyses.leakage.floor import measure_floors as measure_floors
from interp.analyses.leakage.methods import batch_mixing as batch_mixing
from interp.analyses.leakage.methods import embedding_module as embedding_module
from interp.analyses.leakage.methods import gradient as gradient
from interp.analyses.leakage.methods import gradient_at_cuts as gradient_at_cuts
from interp.analyses.leakage.methods import localisation_threshold as localisation_threshold
from interp.analyses.leakage.methods import localise as localise
from interp.analyses.leakage.methods import padding_check as padding_check
from interp.analyses.leakage.methods import pattern_check as pattern_check
from interp.analyses.leakage.methods import perturbation as perturbation
from interp.analyses.leakage.methods import site_modules as site_modules
from interp.analyses.leakage.methods import truncation as truncation
from interp.analyses.leakage.plan import AuditPlan as AuditPlan
from interp.analyses.leakage.plan import check_weights_finite as check_weights_finite
from interp.analyses.leakage.plan import plan_audit as plan_audit
from interp.analyses.leakage.report import STATUS_TONE as STATUS_TONE
from interp.analyses.leakage.report import Tone as Tone
from interp.analyses.leakage.report import describe_row as describe_row
from interp.analyses.leakage.stages import BIDIRECTIONAL_HINT as BIDIRECTIONAL_HINT
from interp.analyses.leakage.stages import Decision as Decision
from interp.analyses.leakage.stages import Localisation as Localisation
from interp.analyses.leakage.stages import MethodRuns as MethodRuns
from interp.analyses.leakage.stages import decide_leaks as decide_leaks
from interp.analyses.leakage.stages import leak_kinds as leak_kinds
from interp.analyses.leakage.stages import locate_leaks as locate_leaks
from interp.analyses.leakage.stages import locate_origins as locate_origins
from interp.analyses.leakage.stages import run_methods as run_methods
from interp.analyses.leakage.types import DEFAULT_MAX_LEN as DEFAULT_MAX_LEN
from interp.analyses.leakage.types import DEFAULT_TOL as DEFAULT_TOL
from interp.analyses.leakage.types import FUTURE_METHODS as FUTURE_METHODS
from interp.analyses.leakage.types import GRADIENT_TOL_FACTOR as GRADIENT_TOL_FACTOR
from interp.analyses.leakage.types import HALF_PRECISION_TOL as HALF_PRECISION_TOL
from interp.analyses.leakage.types import LEAK_KINDS as LEAK_KINDS
from interp.analyses.leakage.types import LOCALISE_FRACTION as LOCALISE_FRACTION
from interp.analyses.leakage.types import MAX_ROWS_PER_METHOD as MAX_ROWS_PER_METHOD
from interp.analyses.leakage.types import MAX_TOL as MAX_TOL
from interp.analyses.leakage.types import MAX_TOL_HALF as MAX_TOL_HALF
from interp.analyses.leakage.types import METHOD_KIND as METHOD_KIND
from interp.analyses.leakage.types import NOISE_FACTOR as NOISE_FACTOR
from interp.analyses.leakage.types import PATTERN_TOL as PATTERN_TOL
from interp.analyses.leakage.types import SITE_COLUMNS as SITE_COLUMNS
from interp.analyses.leakage.types import SPREAD_FLOOR as SPREAD_FLOOR
from interp.analyses.leakage.types import TABLE_COLUMNS as TABLE_COLUMNS
from interp.analyses.leakage.types import TRUSTED as TRUSTED
from interp.analyses.leakage.types import LeakVerdict as LeakVerdict
from interp.analyses.leakage.types import Pair as Pair
from interp.analyses.leakage.types import above_threshold as above_threshold
from interp.analyses.leakage.types import check_tol as check_tol
from interp.analyses.leakage.types import empty_table as empty_table
from interp.analyses.leakage.types import findings_table as findings_table
from interp.analyses.leakage.types import method_tol as method_tol
