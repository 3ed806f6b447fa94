"""The claims machinery (interp.claims) with hand-made evidence: verdict rules, p-value correction, errors."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from interp.claims import (
    DEFAULT_EVIDENCE,
    EVIDENCE_KINDS,
    INTERVAL_METHOD,
    MIN_PROMPTS_FOR_VERDICT,
    POWER_FLOOR,
    SUPPORTING_KINDS,
    Claim,
    Context,
    Evidence,
    Inconclusive,
    Threshold,
    decide,
    difference_evidence,
    equivalence_evidence,
    evaluate_claims,
    lacks_power,
    ratio_evidence,
    threshold_evidence,
    verdict_frame,
)
from interp.claims import (
    test_claims as run_test_claims,
)
from interp.data import random_tokens
from interp.stats import benjamini_hochberg


@dataclass(frozen=True)
class Fixed:
    """Evidence from fixed per-prompt values against the claim's threshold for `kind`."""

    kind: str
    values: tuple[float, ...]
    decisive: bool = True

    def __call__(self, claim, ctx):
        values = torch.tensor(self.values[: len(ctx.prompts)], dtype=torch.float64)
        return threshold_evidence(self.kind, values, claim.thresholds[self.kind], ctx, what="fixed", decisive=self.decisive)


@dataclass(frozen=True)
class Abstains:
    reason: str

    def __call__(self, claim, ctx):
        raise Inconclusive(self.reason)


def make_claim(observed, *, head=(0, 0), controls=None, threshold=0.5, name="toy") -> Claim:
    evidence = {"observational": Fixed("observational", tuple(observed))}
    thresholds = {"observational": Threshold(threshold, "test")}
    for kind, (values, decisive) in (controls or {}).items():
        evidence[kind] = Fixed(kind, tuple(values), decisive)
        thresholds[kind] = Threshold(threshold, "test")
    return Claim(name, (head,), f"L{head[0]}H{head[1]} is a {name} head", {}, thresholds, evidence)


def spread(center: float, n: int = 32, width: float = 0.02, seed: int = 0) -> list[float]:
    generator = torch.Generator().manual_seed(seed)
    return (center + width * torch.randn(n, generator=generator, dtype=torch.float64)).tolist()


@pytest.fixture(scope="module")
def prompts():
    return random_tokens(32, 12, 40, seed=0)


@pytest.fixture()
def ctx(tiny_gpt, prompts):
    return Context(tiny_gpt, prompts, seed=0)


def test_threshold_judges_intervals():
    above = Threshold(0.5, "x")
    assert above.judge(0.6, 0.9) is True
    assert above.judge(0.1, 0.4) is False
    assert above.judge(0.4, 0.6) is None
    below = Threshold(0.5, "x", "below")
    assert below.judge(0.1, 0.4) is True
    assert below.judge(0.6, 0.9) is False
    with pytest.raises(ValueError, match="direction='sideways'"):
        Threshold(0.5, "x", "sideways")


def test_threshold_evidence_passes_fails_and_straddles(ctx):
    threshold = Threshold(0.5, "test")
    high = threshold_evidence("observational", torch.tensor(spread(0.8), dtype=torch.float64), threshold, ctx, what="m")
    low = threshold_evidence("observational", torch.tensor(spread(0.2), dtype=torch.float64), threshold, ctx, what="m")
    mid = threshold_evidence("observational", torch.tensor(spread(0.5, width=0.3), dtype=torch.float64), threshold, ctx, what="m")
    assert high.passed is True and high.p_value < 0.01 and high.ci_low > 0.5
    assert abs(high.effect - float(np.mean(spread(0.8)))) < 1e-12
    assert low.passed is False and low.p_value > 0.99
    assert mid.passed is None and mid.ci_low < 0.5 < mid.ci_high
    assert high.n_prompts == 32 and high.rule == "CI > 0.5"


def test_difference_and_ratio_evidence_known_answers(ctx):
    a, b = torch.tensor(spread(1.0), dtype=torch.float64), torch.tensor(spread(0.0, seed=1), dtype=torch.float64)
    diff = difference_evidence("necessity", a, b, ctx, what="d")
    assert diff.passed is True and abs(diff.effect - float((a - b).mean())) < 1e-12
    flat = difference_evidence("faithfulness", torch.zeros(32), torch.zeros(32), ctx, what="d", fail_below=1e-6)
    assert flat.passed is False and flat.effect == 0.0
    den = torch.tensor(spread(2.0, width=0.3), dtype=torch.float64)
    ratio = ratio_evidence("sufficiency", 0.9 * den, den, Threshold(0.5, "test"), ctx, what="r")
    assert abs(ratio.effect - 0.9) < 1e-12 and abs(ratio.ci_low - 0.9) < 1e-9 and ratio.passed is True
    assert ratio.p_value < 0.01


def test_verdict_rules():
    def ev(kind, passed, decisive=True, p=0.001):
        return Evidence(kind, effect=1.0, ci_low=0.9, ci_high=1.1, p_value=p, rule="CI > 0.5", passed=passed, decisive=decisive,
                        n_prompts=32, detail=f"{kind} detail")

    assert decide([ev("observational", True), ev("necessity", True)], 0.01, 0.05, 32)[0] == "supported"
    verdict, reasons = decide([ev("observational", False), ev("necessity", True)], 0.01, 0.05, 32)
    assert verdict == "refuted" and "observational failed" in reasons[0]
    verdict, reasons = decide([ev("observational", True), ev("control_shuffled", False)], 0.01, 0.05, 32)
    assert verdict == "refuted" and "control_shuffled" in reasons[0]
    verdict, reasons = decide([ev("observational", True), ev("necessity", False, decisive=False)], 0.01, 0.05, 32)
    assert verdict == "inconclusive" and "not decisive" in reasons[0]
    verdict, reasons = decide([ev("observational", None)], 0.01, 0.05, 32)
    assert verdict == "inconclusive" and "undecided" in reasons[0]
    verdict, reasons = decide([ev("observational", True)], 0.2, 0.05, 32)
    assert verdict == "inconclusive" and "adjusted p-value" in reasons[0]
    verdict, reasons = decide([ev("observational", False)], 0.01, 0.05, 5)
    assert verdict == "inconclusive" and "too few prompts" in reasons[0]


@pytest.mark.parametrize("passed", [True, False, None])
def test_supporting_kinds_never_enter_the_verdict_or_the_p_value(passed):
    """zero and qk_attribution are reported beside the verdict: whatever they say, and whatever their p-values, the
    verdict, its reasons and the claim's p-value are those of the other evidence."""
    from interp.claims import _claim_p

    assert SUPPORTING_KINDS == ("zero", "qk_attribution") and set(SUPPORTING_KINDS) <= set(EVIDENCE_KINDS)
    base = [Evidence("observational", effect=1.0, ci_low=0.9, ci_high=1.1, p_value=0.002, rule="CI > 0.5", passed=True,
                     decisive=True, n_prompts=32, detail="obs")]
    for kind in SUPPORTING_KINDS:
        side = Evidence(kind, effect=-1.0, ci_low=-2.0, ci_high=-0.5, p_value=0.9, rule="supporting only",
                        passed=passed, decisive=True, n_prompts=32, detail="side")
        assert decide(base + [side], 0.01, 0.05, 32) == decide(base, 0.01, 0.05, 32) == (
            "supported", ("observational passed: obs",))
        assert _claim_p(base + [side]) == _claim_p(base) == 0.002


@pytest.mark.parametrize("passed", [True, False])
def test_evidence_without_power_neither_refutes_nor_supports(passed):
    """An evidence whose corruption leaves the sender's write unchanged (write_change < POWER_FLOOR) is undecided in the
    verdict, whatever it computed; a silent sender (its write is zero) keeps its outcome, and so does one with power."""
    def ev(change, **extra):
        return Evidence("observational", effect=0.0, ci_low=0.0, ci_high=0.0, p_value=0.001, rule="CI within +-0.01",
                        passed=passed, decisive=True, n_prompts=32, detail="patch", write_change=change, extra=extra)

    verdict, reasons = decide([ev(0.0)], 0.001, 0.05, 32)
    assert verdict == "inconclusive" and reasons == ("observational undecided: inconclusive: no power, the corruption "
                                                     "changes the sender's write by 0 < 1e-06 (relative); patch",)
    assert decide([ev(POWER_FLOOR / 2)], 0.001, 0.05, 32)[0] == "inconclusive"
    expected = "supported" if passed else "refuted"
    assert decide([ev(POWER_FLOOR * 2)], 0.001, 0.05, 32)[0] == expected
    assert decide([ev(math.nan)], 0.001, 0.05, 32)[0] == expected  # not a causal evidence: no power to judge
    assert decide([ev(0.0, silent_sender="yes")], 0.001, 0.05, 32)[0] == expected
    assert lacks_power(ev(0.0)) and not lacks_power(ev(1.0)) and not lacks_power(ev(0.0, silent_sender="yes"))


def test_evidence_keeps_its_per_prompt_values(ctx):
    """Every helper keeps the per-prompt numbers behind its effect (float64, on the CPU), and `to_dict` writes them as a
    list (None where not finite) beside the write change."""
    a = torch.linspace(0.5, 1.5, 32)
    b = torch.linspace(0.0, 0.2, 32)
    threshold = threshold_evidence("observational", a, Threshold(0.2, "test"), ctx, what="a")
    difference = difference_evidence("necessity", a, b, ctx, what="a - b")
    equivalence = equivalence_evidence("observational", b / 100, ctx, band=0.01, what="b")
    ratio = ratio_evidence("sufficiency", a, torch.cat([torch.zeros(1), a[1:] * 2]), Threshold(0.2, "test"), ctx, what="r")
    assert threshold.values.dtype == torch.float64 and torch.allclose(threshold.values, a.double())
    assert torch.allclose(difference.values, (a - b).double()) and difference.effect == pytest.approx(float((a - b).mean()))
    assert torch.allclose(equivalence.values, (b / 100).double())
    assert math.isnan(float(ratio.values[0])) and torch.allclose(ratio.values[1:], torch.full((31,), 0.5, dtype=torch.float64))
    data = ratio.to_dict()
    assert data["values"][0] is None and data["values"][1] == pytest.approx(0.5) and len(data["values"]) == 32
    assert data["write_change"] is None and data["kind"] == "sufficiency"
    json.dumps(data, allow_nan=False)  # plain JSON
    assert Evidence.unmeasured("necessity", rule="", n_prompts=3, detail="none").to_dict()["values"] is None


def test_evaluate_claims_verdicts_and_bh(tiny_gpt, prompts):
    claims = [
        make_claim(spread(0.9), head=(0, 0), controls={"control_shuffled": (spread(0.9, seed=3), True)}),
        make_claim(spread(0.1), head=(0, 1)),
        make_claim(spread(0.9), head=(1, 0), controls={"control_shuffled": (spread(0.1, seed=4), True)}),
        make_claim(spread(0.9), head=(1, 1), controls={"necessity": (spread(0.1, seed=5), False)}),
        make_claim(spread(0.52, width=0.3), head=(1, 2)),
    ]
    verdicts = evaluate_claims(tiny_gpt, claims, prompts, alpha=0.05)
    assert [v.verdict for v in verdicts] == ["supported", "refuted", "refuted", "inconclusive", "inconclusive"]
    # a claim's p-value is the largest of its evidence's (intersection-union), then BH over all claims
    for v in verdicts:
        assert v.p_value == max(e.p_value for e in v.evidence)
    _, adjusted = benjamini_hochberg(np.array([v.p_value for v in verdicts]), 0.05)
    np.testing.assert_allclose([v.p_adjusted for v in verdicts], adjusted)
    table = verdicts[0].table()
    assert list(table["kind"]) == ["observational", "control_shuffled"]
    assert table["passed"].tolist() == [True, True]


def test_test_claims_frame_columns(tiny_gpt, prompts):
    claims = [make_claim(spread(0.9), controls={"control_shuffled": (spread(0.9, seed=3), True)}), make_claim(spread(0.1), head=(1, 3))]
    frame = run_test_claims(tiny_gpt, claims, prompts)
    for column in ("claim", "layer", "head", "verdict", "p_value", "p_adjusted", "reasons", "observational",
                   "observational_ci_low", "observational_ci_high", "control_shuffled", "n_prompts"):
        assert column in frame.columns
    assert frame["layer"].tolist() == [0, 1] and frame["head"].tolist() == [0, 3]
    assert frame["n_prompts"].tolist() == [32, 32]
    assert math.isnan(frame.loc[1, "control_shuffled"])  # evidence the second claim does not define
    assert len(frame.attrs["verdicts"]) == 2
    assert run_test_claims.__test__ is False


def test_evidence_selection_skips_kinds(tiny_gpt, prompts):
    claim = make_claim(spread(0.9), controls={"control_shuffled": (spread(0.1, seed=4), True)})
    full = evaluate_claims(tiny_gpt, [claim], prompts)[0]
    only = evaluate_claims(tiny_gpt, [claim], prompts, evidence=["observational"])[0]
    assert full.verdict == "refuted" and only.verdict == "supported"
    assert [e.kind for e in only.evidence] == ["observational"]
    with pytest.raises(ValueError, match="unknown evidence kind 'necesity'"):
        evaluate_claims(tiny_gpt, [claim], prompts, evidence=["observational", "necesity"])
    with pytest.raises(ValueError, match="leaves out 'observational'"):
        evaluate_claims(tiny_gpt, [claim], prompts, evidence=["necessity"])


def test_abstaining_evidence_makes_inconclusive(tiny_gpt, prompts):
    claim = make_claim(spread(0.9))
    claim = Claim(claim.name, claim.heads, claim.statement, {}, claim.thresholds,
                  {**claim.evidence, "necessity": Abstains("the prompts have no repeats")})
    verdict = evaluate_claims(tiny_gpt, [claim], prompts)[0]
    assert verdict.verdict == "inconclusive"
    assert "no repeats" in verdict.reasons[0]
    assert verdict.get("necessity").passed is None


def test_too_few_prompts_is_inconclusive(tiny_gpt):
    verdict = evaluate_claims(tiny_gpt, [make_claim(spread(0.9, n=4))], random_tokens(4, 12, 40))[0]
    assert verdict.verdict == "inconclusive" and "too few prompts" in verdict.reasons[0]
    # 31 prompts of a clear head: still no verdict, and the reason says why and what to do
    assert MIN_PROMPTS_FOR_VERDICT == 32
    verdict = evaluate_claims(tiny_gpt, [make_claim(spread(0.9, n=31))], random_tokens(31, 12, 40))[0]
    assert verdict.verdict == "inconclusive"
    assert "too few prompts: n < 32 (got 31)" in verdict.reasons[0] and "pass more prompts" in verdict.reasons[0]
    assert verdict.get("observational").passed is True  # the evidence is still measured and shown
    enough = evaluate_claims(tiny_gpt, [make_claim(spread(0.9, n=32))], random_tokens(32, 12, 40))[0]
    assert enough.verdict == "supported"
    one = evaluate_claims(tiny_gpt, [make_claim([0.9])], random_tokens(1, 12, 40))[0]
    assert one.verdict == "inconclusive" and one.get("observational").passed is None


def test_heads_that_do_not_exist(tiny_gpt, prompts):
    with pytest.raises(ValueError, match=r"L5H0.*2 attention layers"):
        run_test_claims(tiny_gpt, [make_claim(spread(0.9), head=(5, 0))], prompts)
    with pytest.raises(ValueError, match=r"L1H9.*4 heads"):
        run_test_claims(tiny_gpt, [make_claim(spread(0.9), head=(1, 9))], prompts)


def test_bad_claims_and_inputs(tiny_gpt, prompts):
    with pytest.raises(ValueError, match=r"heads=\['L0H1'\] must be \(layer, head\) pairs"):
        Claim("x", ["L0H1"], "s", {}, {}, {"observational": Fixed("observational", (1.0,))})
    with pytest.raises(ValueError, match="unknown evidence kind 'vibes'"):
        Claim("x", ((0, 0),), "s", {}, {}, {"observational": Fixed("observational", (1.0,)), "vibes": Fixed("vibes", (1.0,))})
    with pytest.raises(ValueError, match="no observational evidence"):
        Claim("x", ((0, 0),), "s", {}, {}, {"necessity": Fixed("necessity", (1.0,))})
    with pytest.raises(ValueError, match="no claims"):
        run_test_claims(tiny_gpt, [], prompts)
    with pytest.raises(TypeError, match="Claim objects"):
        run_test_claims(tiny_gpt, ["L0H0 is induction"], prompts)
    with pytest.raises(ValueError, match="alpha=1.5"):
        run_test_claims(tiny_gpt, [make_claim(spread(0.9))], prompts, alpha=1.5)


def test_whole_model_claim(tiny_gpt, prompts):
    claim = Claim("causal", (), "the model is causal", {}, {"observational": Threshold(0.5, "test")},
                  {"observational": Fixed("observational", tuple(spread(0.9)))})
    frame = run_test_claims(tiny_gpt, [claim], prompts)
    assert frame.loc[0, "label"] == "model" and frame.loc[0, "verdict"] == "supported"
    assert frame.loc[0, "layer"] is None


def test_claim_spec_and_labels():
    claim = make_claim(spread(0.9), head=(1, 2))
    spec = claim.spec()
    assert spec["claim"] == "toy" and spec["heads"] == [[1, 2]] and spec["evidence"] == ["observational"]
    assert spec["thresholds"]["observational"] == {"value": 0.5, "direction": "above", "source": "test"}
    assert claim.label == "L1H2" and str(claim) == "L1H2 is a toy head"
    assert set(DEFAULT_EVIDENCE) == set(EVIDENCE_KINDS) - {"stability"}


def test_many_claims_keep_small_p_values_reachable(tiny_gpt, prompts):
    """With 60 true claims, the permutation resolution must let BH still support them all."""
    claims = [make_claim(spread(0.9, seed=i), head=(i % 2, i % 4)) for i in range(60)]
    frame = run_test_claims(tiny_gpt, claims, prompts)
    assert (frame["verdict"] == "supported").all()
    assert frame["p_adjusted"].max() <= 0.05


def test_verdict_frame_passed_column(tiny_gpt, prompts):
    verdicts = evaluate_claims(tiny_gpt, [make_claim(spread(0.9))], prompts)
    frame = verdict_frame(verdicts)
    assert frame["observational_passed"].tolist() == [True]
    assert frame["verdict"].tolist() == ["supported"]


def test_evidence_is_built_by_keyword():
    """Only the kind is positional: ten numbers and flags in a row are easy to misplace."""
    with pytest.raises(TypeError):
        Evidence("observational", 1.0, 0.9, 1.1, 0.01, "CI > 0.5", True)  # type: ignore[misc]
    ev = Evidence("observational", effect=1.0, ci_low=0.9, ci_high=1.1, p_value=0.01, rule="CI > 0.5", passed=True)
    assert ev.row()["effect"] == 1.0 and ev.passed is True and ev.decisive is False


def test_unmeasured_evidence_has_no_numbers():
    ev = Evidence.unmeasured("sufficiency", rule="CI > 0.5", n_prompts=12, detail="loss does not move", extra={"dL": 0.0})
    assert math.isnan(ev.effect) and math.isnan(ev.ci_low) and math.isnan(ev.p_value)
    assert (ev.passed, ev.decisive, ev.n_prompts, ev.detail, dict(ev.extra)) == (None, False, 12, "loss does not move", {"dL": 0.0})


def test_evidence_helpers_use_the_studentized_interval_and_a_guarded_p_value(ctx):
    """The helpers' CI is `interp.stats.bootstrap(method=INTERVAL_METHOD)` with the context's seed and the
    label; the p-value is the larger of the sign-flip and studentized-bootstrap ones."""
    from interp.stats import bootstrap, ratio_bootstrap, sign_flip_test, studentized_pvalue

    assert INTERVAL_METHOD == "studentized"
    generator = torch.Generator().manual_seed(5)
    values = 1 - torch.empty(32, dtype=torch.float64).exponential_(20.0, generator=generator)  # skewed left, ~0.95
    ev = threshold_evidence("observational", values, Threshold(0.9, "t"), ctx, what="m")
    _, low, high = bootstrap(values, seed=0, label="observational", method="studentized")
    assert (ev.ci_low, ev.ci_high) == (float(low), float(high))
    margin = values - 0.9
    flip = float(sign_flip_test(margin, n_permutations=ctx.n_permutations, seed=0, label="observational"))
    boot = float(studentized_pvalue(margin, n_resamples=ctx.n_permutations, seed=0, label="observational:p"))
    assert ev.p_value == max(flip, boot)
    # the ratio's interval is the studentized ratio of means
    den = 1 + torch.rand(32, dtype=torch.float64, generator=generator)
    ratio = ratio_evidence("sufficiency", values * den, den, Threshold(0.5, "t"), ctx, what="r")
    r, low, high = ratio_bootstrap(values * den, den, seed=0, label="sufficiency", method="studentized")
    assert (ratio.effect, ratio.ci_low, ratio.ci_high) == (float(r), float(low), float(high))
    assert ratio.passed is True
    # difference_evidence keeps min_effect / unit
    diff = difference_evidence("necessity", values, values - 0.005, ctx, what="d", min_effect=0.01, unit="nats")
    assert diff.passed is False and "below the practical minimum 0.01 nats" in diff.detail


def test_claims_take_a_run_and_read_their_numbers_through_it(tiny_gpt):
    """test_claims(run, claims): the Run's prompts, seed and batch size, and its memo keeps the claims' effects;
    the (model, claims, prompts) form builds a Run of its own and gives the same table."""
    from interp.analyses.claims import induction_head
    from interp.data import repeated_tokens
    from interp.errors import BadInput
    from interp.run import Run, Strategy

    prompts = repeated_tokens(32, 6, 39, seed=0, bos=39)

    claims = [induction_head(1, 2)]
    run = Run(tiny_gpt, prompts, strategy=Strategy.HOOKED, batch_size=32)
    by_run = run_test_claims(run, claims, evidence=("observational", "necessity"))
    by_model = run_test_claims(tiny_gpt, claims, prompts, evidence=("observational", "necessity"))
    assert by_run[["verdict", "p_value", "necessity"]].equals(by_model[["verdict", "p_value", "necessity"]])
    effects = [key.what for key in run.memo_keys() if key.kind == "effect"]
    assert any('"heads": [[1, 2]]' in what for what in effects)  # the whole-head ablation
    assert any('"knockout": [1, 2]' in what for what in effects)  # the targeted knockout and its control
    with pytest.raises(BadInput, match=r"a Run carries its prompts and settings; \['prompts'\]"):
        run_test_claims(run, claims, prompts)
    with pytest.raises(BadInput, match=r"\['seed'\] cannot be given beside it"):
        run_test_claims(run, claims, seed=3)
