"""Claims: a head interpretation is a hypothesis, tested with evidence, never assumed.

Vocabulary, used the same way everywhere in the toolkit:
- a `Claim` names its subject heads (`L{layer}H{head}`), says in words what it asserts
  ("L0H3 attends to the previous token"), carries the hypothesis's parameters and its
  thresholds (each with the citation it comes from), and maps each *evidence kind* that applies
  to a small evidence-function object that knows how to gather that evidence;
- an `Evidence` is one test of the claim: an effect size, a confidence interval over prompts
  (the prompt is the unit of statistics), a one-sided p-value for "the requirement holds", the
  pass rule in words and `passed` (True / False / None = undecided), plus whether a failure is
  `decisive` (refutes the claim) or only withholds support;
- a `Verdict` is supported / refuted / inconclusive, with the reasons and the evidence table.

Evidence kinds (`EvidenceKind`):
  observational        the metric on held-out prompts clears its threshold
  control_shuffled     the same metric on shuffled-token prompts (content vs position)
  control_random_init  the same metric on a randomly initialised model of the same shape
  necessity            knocking out what the claim predicts hurts the behaviour more than a control
                       (for head roles: the attention on the target keys vs an equal mass elsewhere)
  sufficiency          substituting the idealised pattern keeps the behaviour (loss recovered)
  faithfulness         the claim's ideal pattern reproduces the effect of the attention it describes
  zero                 (composition claims; supporting only) zero ablation of the edge: the receiver reads zero in place of
                       the sender's write. Off-distribution (zero is no value the model sees), so never part of a verdict
  qk_attribution       (composition claims; supporting only) how much of the receiver's preference for the key
                       it attends to the sender's write carries, from the exact QK attribution
  stability            verdict and head ranking hold across prompt seeds, batches and dtypes

Supporting kinds (`SUPPORTING_KINDS`: zero, qk_attribution) are gathered and reported beside the verdict, never part
of it: `decide` and the claim's p-value leave them out, so a claim's verdict is the same with or without them.

Verdict rules (`decide`):
  supported     every evidence that ran passed, and the claim's Benjamini-Hochberg adjusted
                p-value clears `alpha` (a control marked not applicable, `extra["applicable"] = "no"`,
                e.g. no random-init copy of a user's module, counts neither way and is named);
  refuted       a decisive evidence failed clearly (the observational CI lies wholly on the wrong
                side of the threshold, or a decisive control fails);
  inconclusive  otherwise, with the reason (too few prompts, a CI straddling the threshold, a
                prompt set lacking what the claim needs, evidence that did not pass...).

Power before verdicts: a causal evidence records `write_change`, the largest relative change over prompts of the
sender's write under its corruption (`interp.analyses.circuits.power`). Below `POWER_FLOOR` (1e-6) the corruption
changes nothing (a layer-0 head writing positions, the same on every prompt), so the evidence's zero tests nothing:
`lacks_power` evidence is undecided, never refuting nor supporting ("inconclusive: the corruption does not change
L0H0's write"). Each evidence keeps its per-prompt numbers (`Evidence.values`, float64; `to_dict` for JSON).

A claim's p-value is the largest p-value among its evidence (an intersection-union test: the
claim needs every requirement, so it is only as strong as its weakest one); the p-values of all
claims tested together are corrected with Benjamini-Hochberg (`interp.stats`).

A claim about an edge between heads ("L0H0 -> L1H0 via k composes", `interp.analyses.claims.composition`)
names both heads and sets `Claim.target` to the edge, which is then its label; an absence claim ("does not
compose") is judged by `equivalence_evidence` (the CI within +-the practical minimum).

Concrete claims live beside the metrics they use (`interp.analyses.claims`); this module is the
machinery, and knows nothing of any particular metric.

Over 600 lines because it holds the whole claim vocabulary (Claim, Evidence, Threshold, Verdict, Context,
the evidence helpers and the verdict rules): every analysis imports these together, and the rules read all of them.
"""
from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping, Protocol, Sequence, SupportsFloat, get_args

import numpy as np
import pandas as pd
import torch

import interp.launch as launch
from interp.data import PromptSet
from interp.errors import BadInput
from interp.heads import Head, head_label
from interp.stats import (
    IntervalMethod,
    TooFewPrompts,
    benjamini_hochberg,
    bootstrap,
    ratio_bootstrap,
    sign_flip_test,
    spearman,
    studentized_pvalue,
)
from interp.validate import check_claims, check_model, check_prompt_arg, check_seed

if TYPE_CHECKING:
    from interp.run import Run

EvidenceKind = Literal[
    "observational",
    "control_shuffled",
    "control_random_init",
    "necessity",
    "sufficiency",
    "faithfulness",
    "zero",
    "qk_attribution",
    "stability",
]
EVIDENCE_KINDS: tuple[str, ...] = get_args(EvidenceKind)
# evidence reported beside the verdict, never part of it (neither `decide` nor the claim's p-value reads it): zero
# ablation (off-distribution: zero is no value the model sees) and a description of the mechanism (qk_attribution),
# each informative beside a causal claim without testing it
SUPPORTING_KINDS: tuple[str, ...] = ("zero", "qk_attribution")
# stability reruns the observational test under several conditions: costly, so asked for explicitly
DEFAULT_EVIDENCE: tuple[str, ...] = tuple(k for k in EVIDENCE_KINDS if k != "stability")
VerdictName = Literal["supported", "refuted", "inconclusive"]
Direction = Literal["above", "below"]
# fewer prompts give intervals that undercover on skewed attention metrics (95% intervals cover 0.85-0.93 at
# 8-16 prompts, tests/interp/test_stats_coverage.py): no verdict below it
MIN_PROMPTS_FOR_VERDICT = 32
# the evidence helpers' interval: the studentized (bootstrap-t) interval covers within 2% of 95% at 32
# prompts on real skewed metrics, where the percentile and BCa ones cover 0.92 (tests/interp/test_stats_coverage.py)
INTERVAL_METHOD: IntervalMethod = "studentized"

# The smallest causal effect that counts as support, per behaviour unit: a CI above 0 alone never
# supports (with enough prompts any nonzero effect has one). The toolkit's convention, not a paper's:
# 0.01 nats is a 1% change of the per-token perplexity; 0.001 cosine distance is about the 20th
# percentile of MiniLM-L6's 72 single-head mean-ablation effects on its sentence embedding (median
# 0.0016, on 32 corpus sentences); a fraction (of loss recovered, of a write taken over) must reach 0.1.
MIN_EFFECT: dict[str, float] = {"nats": 0.01, "cosine distance": 1e-3, "fraction": 0.1}
# A causal evidence whose corruption changes the sender's write by less than this (relative, the largest over prompts:
# `Evidence.write_change`) has no power: float32 round-off is ~1e-7, so below 1e-6 the corrupted write is the clean one
POWER_FLOOR = 1e-6


def min_effect(unit: str) -> float:
    """The practical minimum effect (`MIN_EFFECT`) for a behaviour unit; an unknown unit gets 0
    (a CI above the margin suffices), so a user's own behaviour should name a unit listed there or
    pass `min_effect=` explicitly."""
    return MIN_EFFECT.get(unit, 0.0)


class Inconclusive(Exception):
    """Raised by an evidence function that cannot decide, with the reason (e.g. no repeats in the prompts)."""


# --------------------------------------------------------------------------- the objects


@dataclass(frozen=True)
class Threshold:
    """A pass threshold on an effect, with the citation it comes from."""

    value: float  # the number the effect must clear
    source: str  # where the number comes from, e.g. "Clark et al. 2019, What does BERT look at?"
    direction: Direction = "above"  # "above": effect > value passes; "below": effect < value passes

    def __post_init__(self) -> None:
        if self.direction not in get_args(Direction):
            raise ValueError(f"Threshold direction={self.direction!r}; expected one of {list(get_args(Direction))}.")
        if not math.isfinite(self.value):
            raise ValueError(f"Threshold value={self.value} must be finite.")

    def judge(self, low: float, high: float) -> bool | None:
        """True if the whole interval clears the threshold, False if it lies wholly on the wrong side."""
        if self.direction == "above":
            return True if low > self.value else False if high < self.value else None
        return True if high < self.value else False if low > self.value else None

    def rule(self, what: str = "CI") -> str:
        sign = ">" if self.direction == "above" else "<"
        return f"{what} {sign} {self.value:g}"


class EvidenceFn(Protocol):
    """Gathers one kind of evidence for a claim: (claim, context) -> Evidence; raises Inconclusive to abstain."""

    def __call__(self, claim: "Claim", ctx: "Context") -> "Evidence": ...


@dataclass(frozen=True)
class Claim:
    """A hypothesis about one or more heads, and how to test it.

    `evidence` maps each evidence kind that applies to the object that gathers it; kinds not in
    it do not apply to this claim. Build claims with the presets of `interp.analyses.claims`
    (e.g. `previous_token_head(0, 3)`) or write your own evidence functions.
    """

    name: str  # claim kind, e.g. "previous_token"
    heads: tuple[tuple[int, int], ...]  # subject heads as (layer, head), 0-based; () for a whole-model claim
    statement: str  # what is asserted, in words: "L0H3 attends to the previous token"
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)  # the hypothesis's parameters
    thresholds: Mapping[str, Threshold] = field(default_factory=dict, hash=False)  # evidence kind -> threshold
    evidence: Mapping[str, EvidenceFn] = field(default_factory=dict, hash=False, repr=False)  # kind -> gatherer
    target: str = ""  # what the claim is about when its heads do not say it alone: an edge "L0H0 -> L1H0 via k"

    def __post_init__(self) -> None:
        try:
            heads = tuple(Head(int(l), int(h)) for l, h in self.heads)
        except (TypeError, ValueError):
            raise ValueError(f"claim {self.name!r}: heads={self.heads!r} must be (layer, head) pairs of integers, "
                             "e.g. ((0, 3),); pass () for a claim about the whole model.") from None
        object.__setattr__(self, "heads", heads)
        unknown = [k for k in self.evidence if k not in EVIDENCE_KINDS]
        if unknown:
            raise ValueError(f"claim {self.name!r}: unknown evidence kind {unknown[0]!r}; expected some of {list(EVIDENCE_KINDS)}.")
        if "observational" not in self.evidence:
            raise ValueError(f"claim {self.name!r} has no observational evidence; every claim needs one to be refutable.")

    @property
    def label(self) -> str:
        """The `target` when set (an edge "L0H0 -> L1H0 via k"); else heads as `L{layer}H{head}`, several joined
        by ' ~ '; "model" for a whole-model claim."""
        return self.target or " ~ ".join(map(head_label, self.heads)) or "model"

    @property
    def layer(self) -> int | None:
        """Layer of the first subject head (None for a whole-model claim)."""
        return self.heads[0][0] if self.heads else None

    @property
    def head(self) -> int | None:
        return self.heads[0][1] if self.heads else None

    @property
    def kinds(self) -> tuple[str, ...]:
        """Evidence kinds that apply, in the canonical order."""
        return tuple(k for k in EVIDENCE_KINDS if k in self.evidence)

    def spec(self) -> dict[str, Any]:
        """Plain data (for reports and JSON): kind, heads, statement, parameters, thresholds."""
        return {
            "claim": self.name,
            "heads": [list(h) for h in self.heads],
            **({"target": self.target} if self.target else {}),
            "statement": self.statement,
            "params": dict(self.params),
            "thresholds": {k: {"value": t.value, "direction": t.direction, "source": t.source} for k, t in self.thresholds.items()},
            "evidence": list(self.kinds),
        }

    def __str__(self) -> str:
        return self.statement


@dataclass(frozen=True)
class Evidence:
    """One test of a claim: effect, CI over prompts, p-value, the pass rule and whether it passed."""

    kind: str  # an EvidenceKind
    _: KW_ONLY  # the rest by keyword: ten numbers and flags in a row are easy to misplace
    effect: float  # effect size (a mean metric, a difference, a fraction of loss recovered...)
    ci_low: float  # confidence interval over prompts (NaN when none applies)
    ci_high: float
    p_value: float  # one-sided p-value against "the requirement fails"; NaN when no test applies
    rule: str  # the pass rule in words, e.g. "CI > 0.5"
    passed: bool | None  # True / False / None (undecided)
    decisive: bool = False  # whether a failure refutes the claim (else it only withholds support)
    n_prompts: int = 0
    detail: str = ""  # what was measured, in a sentence
    extra: Mapping[str, float | str] = field(default_factory=dict, hash=False)  # further numbers (and the behaviour) for reports
    # resamples behind p_value (sign flips); its smallest possible value is 1 / (n_resamples + 1); 0 = no test
    n_resamples: int = 0
    alternative: str = "greater"  # the p-value's test: one-sided "greater" (the requirement holds) unless stated
    metric: str = ""  # what the effect measures, e.g. "argmax_at:-1" (the offset a positional claim was tested at)
    # the per-prompt numbers behind the effect (prompt,) float64 (a difference evidence: a - b; a ratio evidence: each
    # prompt's own ratio); None when the evidence has none
    values: torch.Tensor | None = field(default=None, compare=False, hash=False, repr=False)
    # causal evidence: the largest relative change of the sender's write under the corruption, over prompts
    # (`interp.analyses.circuits.power`); below POWER_FLOOR the evidence has no power (`lacks_power`). NaN: not measured
    write_change: float = math.nan

    @classmethod
    def unmeasured(cls, kind: str, *, rule: str, n_prompts: int, detail: str, passed: bool | None = None,
                   decisive: bool = False, extra: Mapping[str, float | str] | None = None) -> "Evidence":
        """Evidence with no number behind it (effect, CI and p-value NaN): abstentions and structural refusals."""
        return cls(kind, effect=math.nan, ci_low=math.nan, ci_high=math.nan, p_value=math.nan, rule=rule, passed=passed,
                   decisive=decisive, n_prompts=n_prompts, detail=detail, extra=dict(extra or {}))

    def row(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "effect": self.effect, "ci_low": self.ci_low, "ci_high": self.ci_high,
            "p_value": self.p_value, "rule": self.rule, "passed": self.passed, "decisive": self.decisive,
            "n_prompts": self.n_prompts, "detail": self.detail, "write_change": self.write_change, **dict(self.extra),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: `row()`'s fields with `values` a list of floats (None where not finite, or no values) and
        every non-finite number None."""
        values = None if self.values is None else [_json_number(v) for v in self.values.double().flatten().tolist()]
        return {key: _json_number(value) if isinstance(value, float) else value
                for key, value in {**self.row(), "values": values}.items()}


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _without_power(evidence: Evidence) -> Evidence:
    """A powerless evidence as `decide` counts it: undecided, its detail saying why."""
    return replace(evidence, passed=None, detail=f"inconclusive: no power, the corruption changes the sender's write by "
                                                 f"{evidence.write_change:.2g} < {POWER_FLOOR:g} (relative); {evidence.detail}")


def lacks_power(evidence: Evidence) -> bool:
    """The evidence's corruption left the sender's (nonzero) write unchanged (`write_change` < `POWER_FLOOR`): its
    number is no test of the claim, so it counts neither as support nor as refutation (`decide`). A sender whose
    write is zero on every prompt (`extra["silent_sender"] == "yes"`) carries nothing: its zero effect stands."""
    change = evidence.write_change
    return math.isfinite(change) and change < POWER_FLOOR and evidence.extra.get("silent_sender") != "yes"


@dataclass(frozen=True)
class Verdict:
    """The outcome of testing one claim: supported / refuted / inconclusive, why, and the evidence."""

    claim: Claim
    verdict: VerdictName
    reasons: tuple[str, ...]
    evidence: tuple[Evidence, ...]
    p_value: float  # the claim's p-value: the largest among its evidence
    p_adjusted: float  # Benjamini-Hochberg over all claims tested together
    n_prompts: int

    def table(self) -> pd.DataFrame:
        """The evidence table: one row per evidence kind."""
        columns = ["kind", "effect", "ci_low", "ci_high", "p_value", "rule", "passed", "decisive", "n_prompts", "detail"]
        return pd.DataFrame([e.row() for e in self.evidence], columns=None if self.evidence else columns)

    def get(self, kind: str) -> Evidence | None:
        return next((e for e in self.evidence if e.kind == kind), None)


# --------------------------------------------------------------------------- the context


def memo_key(part: Any) -> Any:
    """A memo key by content: a PromptSet by its token and mask bytes, a module by its parameters' version
    (`interp.run`), a tuple part by part; anything else must be hashable by value (names, frozen dataclasses)."""
    from interp.run import parameter_version, prompt_fingerprint

    if isinstance(part, tuple):
        return tuple(memo_key(p) for p in part)
    if isinstance(part, PromptSet):
        return ("prompts", prompt_fingerprint(part))
    if isinstance(part, torch.nn.Module):
        return ("module", type(part).__qualname__, parameter_version(part))
    hash(part)  # an unhashable part is a bug of the caller: say so here, not as a silent miss
    return part


@dataclass
class Context:
    """What evidence functions share while a batch of claims is tested: the model, the prompts,
    the settings, and a memo so that claims about many heads reuse one forward pass."""

    model: torch.nn.Module
    prompts: PromptSet
    seed: int = 0
    alpha: float = 0.05
    n_permutations: int = 2000
    batch_size: int = 32
    memo: dict[Any, Any] = field(default_factory=dict, repr=False)  # memo_key(key) -> computed value
    behaviour: Any = None  # what causal evidence measures (`interp.behaviour`); None: the model's default
    # the `interp.Run` causal evidence asks (its memo holds every effect the claims used); None: built on first use
    run: Any = field(default=None, repr=False)

    def cached(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        """Compute once per key. The key's parts are read by content (`memo_key`): a prompt set by its
        tokens and mask, a model by its parameters' version, never by `id()`."""
        full = memo_key(key)
        if full not in self.memo:
            self.memo[full] = compute()
        return self.memo[full]

    def derive(self, **changes: Any) -> "Context":
        """A context with some fields changed, a fresh memo and no Run (e.g. another model or prompt set)."""
        return replace(self, memo={}, run=None, **changes)


# --------------------------------------------------------------------------- evidence helpers


def _floats(*values: SupportsFloat) -> list[float]:
    return [float(v) for v in values]


def _p_greater(margin: torch.Tensor, ctx: Context, label: str) -> float:
    """One-sided p-value that the mean per-prompt margin (prompt,) is > 0: the larger of the sign-flip
    test's (exact under symmetry) and the studentized bootstrap's (valid for skewed margins, where the
    sign-flip test alone rejects a true null up to twice as often as alpha: tests/interp/test_stats_coverage.py)."""
    flip = sign_flip_test(margin, alternative="greater", n_permutations=ctx.n_permutations, seed=ctx.seed, label=label)
    boot = studentized_pvalue(margin, n_resamples=ctx.n_permutations, seed=ctx.seed, label=f"{label}:p")
    return max(float(flip), float(boot))


def threshold_evidence(
    kind: str,
    values: torch.Tensor,
    threshold: Threshold,
    ctx: Context,
    *,
    what: str,
    decisive: bool = True,
    label: str | None = None,
    extra: Mapping[str, float | str] | None = None,
) -> Evidence:
    """Per-prompt values (prompt,) against a threshold: mean, studentized-bootstrap CI, one-sided p-value
    (`_p_greater`: sign-flip and studentized bootstrap).

    Passes when the whole CI clears the threshold, fails when it lies wholly on the wrong side,
    and is undecided (None) when it straddles it.
    """
    label = label or kind
    values = torch.as_tensor(values).double().flatten()
    mean, low, high = _floats(*bootstrap(values, seed=ctx.seed, label=label, method=INTERVAL_METHOD))
    margin = values - threshold.value if threshold.direction == "above" else threshold.value - values
    p = _p_greater(margin, ctx, label)
    passed = threshold.judge(low, high)
    verb = {True: "clears", False: "misses", None: "straddles"}[passed]
    detail = f"{what} = {mean:.3f} [{low:.3f}, {high:.3f}] {verb} the threshold {threshold.rule('')[1:]} ({threshold.source})"
    return Evidence(kind, effect=mean, ci_low=low, ci_high=high, p_value=p, rule=threshold.rule(), passed=passed,
                    decisive=decisive, n_prompts=len(values), detail=detail, extra=dict(extra or {}),
                    n_resamples=ctx.n_permutations, values=values.detach().cpu().clone())


def difference_evidence(
    kind: str,
    a: torch.Tensor,
    b: torch.Tensor,
    ctx: Context,
    *,
    what: str,
    margin: float = 0.0,
    decisive: bool = False,
    fail_below: float | None = None,
    min_effect: float = 0.0,
    unit: str = "",
    label: str | None = None,
    extra: Mapping[str, float | str] | None = None,
) -> Evidence:
    """Paired per-prompt difference a - b (prompt,) must exceed `margin`: studentized-bootstrap CI and p-value.

    Passes when the CI of the mean difference lies above `margin` *and* the mean exceeds `margin` by at
    least `min_effect` (the practical minimum, in `unit`: `interp.claims.min_effect`). Fails when the CI
    lies wholly below `fail_below` (default: `margin`), or wholly below `margin + min_effect` (an effect
    too small to matter: the detail says "below the practical minimum"); in between, undecided.
    """
    label = label or kind
    diff = (torch.as_tensor(a) - torch.as_tensor(b)).double().flatten()
    mean, low, high = _floats(*bootstrap(diff, seed=ctx.seed, label=label, method=INTERVAL_METHOD))
    p = _p_greater(diff - margin, ctx, label)
    fail_below = margin if fail_below is None else fail_below
    if min_effect < 0 or not math.isfinite(min_effect):
        raise ValueError(f"min_effect={min_effect} must be finite and >= 0.")
    practical = margin + min_effect
    small = min_effect > 0 and high < practical
    passed = True if (low > margin and mean >= practical) else False if (high < fail_below or small) else None
    suffix = f" {unit}" if unit else ""
    detail = f"{what} = {mean:.4g} [{low:.4g}, {high:.4g}]{suffix}"
    if small:
        detail += f", below the practical minimum {min_effect:g}{suffix}"
    rule = f"CI > {margin:g}" + (f" and effect >= {practical:g}{suffix}" if min_effect > 0 else "")
    return Evidence(kind, effect=mean, ci_low=low, ci_high=high, p_value=p, rule=rule, passed=passed,
                    decisive=decisive, n_prompts=len(diff), detail=detail, extra=dict(extra or {}),
                    n_resamples=ctx.n_permutations, values=diff.detach().cpu().clone())


def equivalence_evidence(
    kind: str,
    values: torch.Tensor,
    ctx: Context,
    *,
    band: float,
    what: str,
    decisive: bool = True,
    unit: str = "",
    label: str | None = None,
    extra: Mapping[str, float | str] | None = None,
) -> Evidence:
    """Per-prompt values (prompt,) equal to 0 within +-`band` (an absence claim: "this edge carries nothing").

    Passes when the studentized-bootstrap CI lies within (-band, band); fails when the CI excludes 0 and
    |mean| >= band (the effect matters); in between, undecided. The p-value is that of two one-sided tests
    (the larger of `_p_greater` for mean > -band and for mean < band). `band` is the practical minimum
    (`min_effect(unit)`): it must be > 0, or no CI could ever lie within it.
    """
    if not band > 0 or not math.isfinite(band):
        raise ValueError(f"band={band} must be finite and > 0 (the practical minimum, interp.claims.min_effect).")
    label = label or kind
    values = torch.as_tensor(values).double().flatten()
    mean, low, high = _floats(*bootstrap(values, seed=ctx.seed, label=label, method=INTERVAL_METHOD))
    p = max(_p_greater(values + band, ctx, f"{label}:above"), _p_greater(band - values, ctx, f"{label}:below"))
    within = -band < low and high < band
    matters = (low > 0 or high < 0) and abs(mean) >= band
    passed = True if within else False if matters else None
    suffix = f" {unit}" if unit else ""
    verb = {True: "lies within", False: "lies outside", None: "straddles"}[passed]
    detail = f"{what} = {mean:.4g} [{low:.4g}, {high:.4g}]{suffix} {verb} +-{band:g}{suffix}"
    rule = f"CI within +-{band:g}{suffix}"
    return Evidence(kind, effect=mean, ci_low=low, ci_high=high, p_value=p, rule=rule, passed=passed, decisive=decisive,
                    n_prompts=len(values), detail=detail, extra=dict(extra or {}), n_resamples=ctx.n_permutations,
                    alternative="equivalence", values=values.detach().cpu().clone())


def ratio_evidence(
    kind: str,
    numerator: torch.Tensor,
    denominator: torch.Tensor,
    threshold: Threshold,
    ctx: Context,
    *,
    what: str,
    decisive: bool = False,
    n_resamples: int = 1000,
    label: str | None = None,
    extra: Mapping[str, float | str] | None = None,
) -> Evidence:
    """Ratio of means sum(num) / sum(den) over prompts (e.g. fraction of loss recovered) against a threshold.

    The CI is a studentized bootstrap of the ratio of means (resampling prompts, delta-method standard
    errors); the p-value (`_p_greater`) tests the linearised requirement num - threshold * den > 0 per
    prompt, which is equivalent to the ratio clearing the threshold when the denominator is positive.
    """
    label = label or kind
    num, den = torch.as_tensor(numerator).double().flatten(), torch.as_tensor(denominator).double().flatten()
    n = len(num)
    if n < 2:
        raise TooFewPrompts(f"{kind} needs at least 2 prompts, got {n}; pass more prompts.")
    ratio, low, high = _floats(*ratio_bootstrap(num, den, n_resamples=n_resamples, seed=ctx.seed, label=label,
                                                method=INTERVAL_METHOD))
    sign = 1.0 if threshold.direction == "above" else -1.0
    p = _p_greater(sign * (num - threshold.value * den), ctx, label)
    passed = threshold.judge(low, high) if math.isfinite(low) else None
    detail = f"{what} = {ratio:.3f} [{low:.3f}, {high:.3f}] against {threshold.rule('')[1:]} ({threshold.source})"
    per_prompt = torch.where(den != 0, num / torch.where(den != 0, den, 1.0), torch.nan)  # each prompt's own ratio
    return Evidence(kind, effect=ratio, ci_low=low, ci_high=high, p_value=p, rule=threshold.rule(), passed=passed,
                    decisive=decisive, n_prompts=n, detail=detail, extra=dict(extra or {}),
                    n_resamples=ctx.n_permutations, values=per_prompt.cpu())


def abstain(kind: str, reason: str, n_prompts: int = 0, rule: str = "") -> Evidence:
    """Evidence that could not be gathered: undecided, with the reason."""
    return Evidence.unmeasured(kind, rule=rule, n_prompts=n_prompts, detail=reason)


# --------------------------------------------------------------------------- running claims


def check_claim_heads(model: torch.nn.Module, claims: Iterable[Claim]) -> None:
    """Raise a ValueError naming any claimed head the model does not have, or a claimed edge (`params["edge"]` of a
    composition claim) its graph does not have (e.g. a shared key / value input named by the wrong head of its
    group); on a model without a graph the edge claims abstain later, saying why."""
    from interp.hooks import attention_sites
    from interp.paths import check_edges, check_graph_model, parse_edge

    sites = attention_sites(model)
    claims = list(claims)
    edges = [claim.params["edge"] for claim in claims if claim.target and isinstance(claim.params.get("edge"), str)]
    if edges:
        try:
            check_graph_model(model)
        except BadInput:  # no graph to check against: the claims abstain, saying why
            edges = []
    if edges:
        check_edges(model, [parse_edge(edge) for edge in edges])
    for claim in claims:
        for layer, head in claim.heads:
            if not 0 <= layer < len(sites):
                raise ValueError(
                    f"claim {claim.name!r} names head {head_label((layer, head))}, but the model has {len(sites)} attention "
                    f"layers (0..{len(sites) - 1}); pick a layer in that range."
                )
            n_heads = sites[layer].n_heads
            if not 0 <= head < n_heads:
                raise ValueError(
                    f"claim {claim.name!r} names head {head_label((layer, head))}, but layer {layer} has {n_heads} heads "
                    f"(0..{n_heads - 1}); pick a head in that range."
                )


def _check_evidence_kinds(evidence: Sequence[str] | None) -> tuple[str, ...]:
    if evidence is None:
        return DEFAULT_EVIDENCE
    if isinstance(evidence, str):
        evidence = [evidence]
    unknown = [k for k in evidence if k not in EVIDENCE_KINDS]
    if unknown:
        raise ValueError(f"unknown evidence kind {unknown[0]!r}; expected some of {list(EVIDENCE_KINDS)}.")
    if "observational" not in evidence:
        raise ValueError(f"evidence={list(evidence)} leaves out 'observational'; every test needs it, add it.")
    return tuple(k for k in EVIDENCE_KINDS if k in evidence)


def gather(claim: Claim, ctx: Context, kinds: Sequence[str]) -> tuple[Evidence, ...]:
    """Run the claim's evidence functions for the requested kinds that apply; abstentions become undecided evidence."""
    out = []
    for kind in kinds:
        if kind not in claim.evidence:
            continue
        try:
            out.append(claim.evidence[kind](claim, ctx))
        except (Inconclusive, TooFewPrompts) as reason:
            out.append(abstain(kind, str(reason), len(ctx.prompts)))
            if kind == "observational":
                break  # prompts that cannot show the claim's metric cannot test the rest either
    return tuple(out)


def decide(evidence: Sequence[Evidence], p_adjusted: float, alpha: float, n_prompts: int,
           min_prompts: int = MIN_PROMPTS_FOR_VERDICT) -> tuple[VerdictName, tuple[str, ...]]:
    """The verdict rules (see the module docstring): returns the verdict and its reasons."""
    if n_prompts < min_prompts:
        return "inconclusive", (f"too few prompts: n < {min_prompts} (got {n_prompts}); below it a 95% interval on a "
                                "skewed attention metric covers less than it says; pass more prompts.",)
    # evidence marked not informative (a tautology, e.g. substituting a pattern that already is the ideal), and a
    # control marked not applicable (it could not run on this model: no random-init copy of a user's module), count
    # neither for nor against the claim; any other evidence that could not run withholds support
    def applies(e: Evidence) -> bool:
        return not (e.kind.startswith("control_") and e.extra.get("applicable") == "no")

    not_applicable = [e for e in evidence if not applies(e)]
    evidence = [e for e in evidence if e.extra.get("informative") != "no" and e.kind not in SUPPORTING_KINDS and applies(e)]
    # evidence without power (the corruption does not change the sender's write) is undecided, whatever it computed
    evidence = [_without_power(e) if lacks_power(e) and e.passed is not None else e for e in evidence]
    failed = [e for e in evidence if e.passed is False]
    decisive = [e for e in failed if e.decisive]
    if decisive:
        return "refuted", tuple(f"{e.kind} failed: {e.detail}" for e in decisive)
    reasons = [f"{e.kind} failed (not decisive): {e.detail}" if e.passed is False else f"{e.kind} undecided: {e.detail}"
               for e in evidence if e.passed is not True]
    if reasons:
        return "inconclusive", tuple(reasons)
    if not math.isfinite(p_adjusted) or p_adjusted > alpha:
        return "inconclusive", (f"every evidence passed but the adjusted p-value {p_adjusted:.3g} does not clear "
                                f"alpha={alpha:g} after correcting for all claims tested; pass more prompts.",)
    return "supported", tuple(f"{e.kind} passed: {e.detail}" for e in evidence) + tuple(
        f"{e.kind} {e.detail}" for e in not_applicable)


def evaluate_claims(
    model: "torch.nn.Module | Run",
    claims: Claim | Sequence[Claim],
    prompts: PromptSet | None = None,
    *,
    alpha: float = 0.05,
    seed: int | None = None,
    evidence: Sequence[str] | None = None,
    batch_size: int | None = None,
    min_prompts: int = MIN_PROMPTS_FOR_VERDICT,
    progress: bool = False,
    behaviour: Any = None,
    device: launch.Device = None,
    dtype: launch.DType = None,
) -> list[Verdict]:
    """Test many claims at once; one `Verdict` each, with p-values corrected over all of them.

    `model`: an `interp.Run` (its model, prompts, behaviour, batch size and seed; every causal number is read
    through it, so its memo holds them afterwards) or a model with its `prompts` (a Run is built: batch size 32,
    seed 0, one hooked forward per intervention, `behaviour`, `device` / `dtype` moving one copy of the model).
    `evidence` picks the kinds to gather (default: all but "stability"); a kind a claim does not define is skipped
    for that claim. `behaviour` (`interp.behaviour`: a name, a Behaviour or a callable) is what causal evidence
    measures unless a claim names its own; default: the model's (a Run's: its own).
    """
    run = _claims_run(model, prompts, seed=seed, batch_size=batch_size, behaviour=behaviour, device=device, dtype=dtype)
    claims = check_claims(claims, Claim, "test_claims")  # a single Claim is one claim
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} must be in (0, 1).")
    kinds = _check_evidence_kinds(evidence)
    check_claim_heads(run.model, claims)
    prompts = run.prompts
    # the smallest sign-flip p-value is 1 / (n_permutations + 1): make it small enough to survive BH
    n_permutations = max(2000, math.ceil(4 * len(claims) / alpha))
    ctx = Context(run.model, prompts, seed=run.seed, alpha=alpha, n_permutations=n_permutations,
                  batch_size=run.batch_size, behaviour=run.behaviour, run=run)
    from interp.progress import tracked

    claims_iter = tracked(claims, len(claims), "testing claims", enabled=progress, unit="claims")
    gathered = [gather(claim, ctx, kinds) for claim in claims_iter]
    p_values = np.array([_claim_p(ev) for ev in gathered])
    _, p_adjusted = benjamini_hochberg(p_values, alpha)
    verdicts = []
    for claim, ev, p, p_adj in zip(claims, gathered, p_values, p_adjusted):
        verdict, reasons = decide(ev, float(p_adj), alpha, len(prompts), min_prompts)
        verdicts.append(Verdict(claim, verdict, reasons, ev, float(p), float(p_adj), len(prompts)))
    return verdicts


def _claim_p(evidence: Sequence[Evidence]) -> float:
    """Intersection-union p-value: the largest p among the evidence that has one (supporting kinds left out)."""
    ps = [e.p_value for e in evidence if math.isfinite(e.p_value) and e.kind not in SUPPORTING_KINDS]
    return max(ps) if ps else math.nan


def verdict_frame(verdicts: Sequence[Verdict]) -> pd.DataFrame:
    """One row per claim: claim, statement, heads, verdict, p-values, reasons, and per evidence kind
    `{kind}` (effect), `{kind}_ci_low`, `{kind}_ci_high`, `{kind}_passed`; then `behaviour` (what the
    causal evidence measured, from its `extra["behaviour"]`; empty when none ran) and `n_prompts`."""
    rows = []
    kinds_seen = [k for k in EVIDENCE_KINDS if any(v.get(k) for v in verdicts)]
    for v in verdicts:
        row: dict[str, Any] = {
            "claim": v.claim.name, "label": v.claim.label, "layer": v.claim.layer, "head": v.claim.head,
            "statement": v.claim.statement, "verdict": v.verdict, "p_value": v.p_value, "p_adjusted": v.p_adjusted,
            "reasons": "; ".join(v.reasons),
        }
        for kind in kinds_seen:
            e = v.get(kind)
            row[kind] = e.effect if e else math.nan
            row[f"{kind}_ci_low"] = e.ci_low if e else math.nan
            row[f"{kind}_ci_high"] = e.ci_high if e else math.nan
            row[f"{kind}_passed"] = e.passed if e else None
        row["behaviour"] = next((str(e.extra["behaviour"]) for e in v.evidence if "behaviour" in (e.extra or {})), "")
        row["n_prompts"] = v.n_prompts
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame.attrs["verdicts"] = list(verdicts)  # the full objects, for evidence tables
    return frame



def _claims_run(model: Any, prompts: PromptSet | None, *, seed: int | None, batch_size: int | None, behaviour: Any,
                device: launch.Device, dtype: launch.DType) -> "Run":
    """The Run the claims read their causal numbers from: the one given (nothing else beside it), or one built
    from the model and prompts as `test_claims` has always measured (one hooked forward per intervention)."""
    from interp.run import Run, Strategy, as_run

    if isinstance(model, Run):
        return as_run(model, prompts, where="test_claims", seed=seed, batch_size=batch_size, behaviour=behaviour,
                      device=device, dtype=dtype)
    check_model(model, "test_claims")
    check_prompt_arg(prompts, "test_claims")
    seed = check_seed(0 if seed is None else seed, "test_claims")
    return as_run(model, prompts, where="test_claims", seed=seed, batch_size=32 if batch_size is None else batch_size,
                  behaviour=behaviour, device=device, dtype=dtype, strategy=Strategy.HOOKED)

def test_claims(
    model: "torch.nn.Module | Run",
    claims: Claim | Sequence[Claim],
    prompts: PromptSet | None = None,
    *,
    alpha: float = 0.05,
    seed: int | None = None,
    evidence: Sequence[str] | None = None,
    batch_size: int | None = None,
    min_prompts: int = MIN_PROMPTS_FOR_VERDICT,
    progress: bool = False,
    behaviour: Any = None,
    device: launch.Device = None,
    dtype: launch.DType = None,
) -> pd.DataFrame:
    """Test claims on prompts: one row per claim with its verdict, adjusted p-value, reasons and evidence columns.

    Example::

        from interp.analyses.claims import previous_token_head, induction_head
        table = test_claims(model, [previous_token_head(0, 1), induction_head(1, 2)], prompts)
        table = test_claims(run, claims)          # an interp.Run: its settings, and its memo keeps every effect

    `table.attrs["verdicts"]` holds the `Verdict` objects (`.table()` gives each evidence table).
    Test on prompts that did not suggest the claims (`interp.analyses.claims.scan` does the split).
    `model`, `seed`, `batch_size`, `behaviour`, `device` / `dtype`: as `evaluate_claims`.
    """
    return verdict_frame(evaluate_claims(model, claims, prompts, alpha=alpha, seed=seed, evidence=evidence,
                                         batch_size=batch_size, min_prompts=min_prompts, progress=progress,
                                         behaviour=behaviour, device=device, dtype=dtype))


# not a pytest test, despite its name (setattr: a function's type has no __test__)
setattr(test_claims, "__test__", False)  # noqa: B010


# --------------------------------------------------------------------------- stability (generic)


@dataclass(frozen=True)
class Stability:
    """Rerun another evidence kind (default observational) under perturbed conditions and compare.

    Conditions: `n_splits` random halves of the prompts (prompt seeds), the prompts in another
    order with another batch size (batch composition), and the model in bfloat16. Passes when the
    base evidence's outcome agrees in every condition and, where the base evidence function has a
    `head_scores(claim, ctx) -> (layer, head) array`, the Spearman correlation of the head ranking
    with the original is at least `min_rank_corr` everywhere. Not decisive: an unstable verdict
    withholds support. Costly (one full rerun per condition), so off by default.
    """

    base: str = "observational"
    n_splits: int = 3
    min_rank_corr: float = 0.9
    dtypes: tuple[str, ...] = ("bfloat16",)

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        import copy

        base_fn = claim.evidence[self.base]
        reference = base_fn(claim, ctx)
        ranks = getattr(base_fn, "head_scores", None)
        ref_scores = None if ranks is None else np.asarray(ranks(claim, ctx))
        conditions: dict[str, Context] = {}
        for s in range(1, self.n_splits + 1):
            half, _ = ctx.prompts.split(0.5, seed=ctx.seed + s)
            conditions[f"prompt half seed {ctx.seed + s}"] = ctx.derive(prompts=half)
        order = torch.randperm(len(ctx.prompts), generator=torch.Generator().manual_seed(ctx.seed + 101))
        conditions["prompts reordered, batch size 7"] = ctx.derive(prompts=ctx.prompts[order], batch_size=7)
        for name in self.dtypes:
            dtype = getattr(torch, name)
            conditions[f"model in {name}"] = ctx.derive(model=copy.deepcopy(ctx.model).to(dtype))
        agree, corrs, notes = [], [], []
        for name, sub in conditions.items():
            try:
                ev = base_fn(claim, sub)
            except (Inconclusive, TooFewPrompts) as reason:
                agree.append(False)
                notes.append(f"{name}: undecided ({reason})")
                continue
            agree.append(ev.passed == reference.passed)
            corr = math.nan
            if ranks is not None and ref_scores is not None:  # both set, or neither
                corr = _spearman(ref_scores, np.asarray(ranks(claim, sub)))
                corrs.append(corr)
            notes.append(f"{name}: {ev.effect:.3f} passed={ev.passed}" + (f", rank corr {corr:.3f}" if math.isfinite(corr) else ""))
        rate = float(np.mean(agree))
        min_corr = float(np.nanmin(corrs)) if corrs and not np.all(np.isnan(corrs)) else math.nan
        passed = all(agree) and (math.isnan(min_corr) or min_corr >= self.min_rank_corr)
        rule = f"outcome agrees in every condition; head-rank Spearman >= {self.min_rank_corr:g}"
        detail = (f"{self.base} outcome (passed={reference.passed}) agrees in {sum(agree)}/{len(agree)} conditions"
                  + (f", lowest rank corr {min_corr:.3f}" if math.isfinite(min_corr) else "") + ": " + "; ".join(notes))
        return Evidence("stability", effect=rate, ci_low=math.nan, ci_high=math.nan, p_value=math.nan, rule=rule,
                        passed=passed, n_prompts=len(ctx.prompts), detail=detail, extra={"min_rank_corr": min_corr})


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank agreement for stability: two identical constant rankings agree (1.0)."""
    a, b = np.ravel(a), np.ravel(b)
    if (np.ptp(a) == 0 or np.ptp(b) == 0) and np.allclose(a, b, atol=1e-3):
        return 1.0
    return spearman(a, b)
