"""Composition claims ("L0H0 -> L1H0 via k composes"): known answers on the constructed induction circuit and
on toy-induction, the control rule, the equivalence evidence and bad input."""
import math

import pytest
import torch

import interp
from interp.analyses.claims.composition import (
    CONTROL_RULE,
    composition_claim,
    composition_edge,
    composition_row,
    control_sender,
)
from interp.claims import Context, Inconclusive, equivalence_evidence
from interp.claims import test_claims as run_test_claims
from interp.data import repeated_tokens
from interp.errors import BadInput
from interp.models.constructed import induction_circuit
from interp.paths import Node


@pytest.fixture(scope="module")
def circuit():
    return induction_circuit()


@pytest.fixture(scope="module")
def circuit_verdicts(circuit):
    """Five claims about the circuit's edges, tested (and BH-corrected) together."""
    claims = [composition_claim("L0H0 -> L1H0 via k"), composition_claim("L0H0 -> L1H0 via q"),
              composition_claim("L0H1 -> L1H0 via k"), composition_claim("L0H0 -> L1H0 via q", composes=False),
              composition_claim("L0H0 -> L1H0 via k", composes=False)]
    prompts = repeated_tokens(32, 10, 63, bos=63)
    return run_test_claims(circuit, claims, prompts)


@pytest.mark.heavy
def test_constructed_circuit_known_answers(circuit_verdicts):
    frame = circuit_verdicts
    assert list(frame.label) == ["L0H0 -> L1H0 via k", "L0H0 -> L1H0 via q", "L0H1 -> L1H0 via k",
                                 "L0H0 -> L1H0 via q", "L0H0 -> L1H0 via k"]
    assert list(frame.claim) == ["composes"] * 3 + ["does_not_compose"] * 2
    assert list(frame.verdict) == ["supported", "refuted", "refuted", "supported", "refuted"]
    assert list(frame["layer"]) == [0, 0, 0, 0, 0] and list(frame["head"]) == [0, 0, 1, 0, 0]
    # BH over all five: the supported ones clear alpha, and the smallest p-value is 1 / (n_permutations + 1)
    assert (frame.p_adjusted[frame.verdict == "supported"] < 0.05).all()


def test_composes_evidence_numbers(circuit_verdicts):
    verdict = circuit_verdicts.attrs["verdicts"][0]
    obs, nec = verdict.get("observational"), verdict.get("necessity")
    # the path patch L0H0 -> L1H0 via k on these prompts: +6.19 nats (interp.paths' figure), the control 0
    assert obs.effect == pytest.approx(6.19, abs=0.01) and obs.ci_low > 5 and obs.passed and obs.decisive
    assert obs.extra["composition_clears_p95"] == "yes" and obs.extra["composition_ratio"] > 2
    assert obs.extra["behaviour"] == "next-token loss on the repeated copies"
    assert nec.extra["control_edge"] == "L0H1 -> L1H0 via k" and nec.extra["effect_control"] == 0.0
    assert nec.passed is True and not nec.decisive and nec.effect == pytest.approx(obs.effect)
    assert "supporting only" in obs.detail and "L0H1: the other head of layer 0" in nec.detail


def test_refutations_say_within_the_band(circuit_verdicts):
    q_claim = circuit_verdicts.attrs["verdicts"][1]
    obs = q_claim.get("observational")
    assert obs.effect == 0.0 and obs.passed is False and "lies within +-0.01 nats: no composition" in obs.detail
    assert obs.extra["composition_clears_p95"] == "no"
    assert q_claim.reasons[0].startswith("observational failed")
    mirror = circuit_verdicts.attrs["verdicts"][4].get("observational")  # "L0H0 -> L1H0 via k does not compose"
    assert mirror.passed is False and "lies outside +-0.01" in mirror.detail and mirror.alternative == "equivalence"


def test_control_sender_rule(circuit):
    # every other layer-0 head scores 0 into L1H0's key: the lowest index wins the tie
    assert control_sender(circuit, "L0H0 -> L1H0 via k") == Node(0, "head", 1)
    # L0H0 scores 0.126 into L1H0's key, L0H2 and L0H3 0: L0H2
    assert control_sender(circuit, "L0H1 -> L1H0 via k") == Node(0, "head", 2)
    toy = interp.load("toy-induction")
    # L1H2's key: L0H0 scores lowest among L0H0, L0H1, L0H3 (0.115 vs 0.163, 0.121)
    assert control_sender(toy, "L0H2 -> L1H2 via k") == Node(0, "head", 0)
    row = composition_row(toy, "L0H2 -> L1H2 via k")
    assert row["score"] > row["baseline_p95"] and row["ratio"] > 2
    assert "smallest composition score" in CONTROL_RULE


def test_one_head_layers_have_no_control():
    from interp.models import GPTConfig, HookedGPT

    model = HookedGPT(GPTConfig(n_layers=2, n_heads=1, d_model=16, d_vocab=20, n_ctx=32, seed=0, attn_only=True)).eval()
    assert control_sender(model, "L0H0 -> L1H0 via k") is None
    frame = run_test_claims(model, [composition_claim("L0H0 -> L1H0 via k")], repeated_tokens(32, 6, 19, bos=19))
    necessity = frame.attrs["verdicts"][0].get("necessity")
    assert necessity.passed is None and "no control" in necessity.detail
    assert frame.verdict[0] != "supported"


def test_toy_induction_previous_token_head_composes_with_the_induction_head():
    """toy-induction: L0H2 (previous token) -> L1H2 (induction) via k composes; via q it does not (a false
    claim, refuted: its effect 0.0015 nats lies within +-0.01)."""
    model = interp.load("toy-induction")
    prompts = repeated_tokens(48, 20, model.cfg.d_vocab, bos=model.cfg.d_vocab - 1, seed=7)
    frame = run_test_claims(model, [composition_claim("L0H2 -> L1H2 via k"), composition_claim("L0H2 -> L1H2 via q")],
                            prompts)
    assert list(frame.verdict) == ["supported", "refuted"], list(frame.reasons)
    k_claim, q_claim = frame.attrs["verdicts"]
    assert k_claim.get("observational").effect > 1.5 and k_claim.get("necessity").effect > 1.5
    assert k_claim.get("necessity").extra["control_edge"] == "L0H0 -> L1H2 via k"
    assert abs(q_claim.get("observational").effect) < 0.01


def test_equivalence_evidence_known_answers(circuit):
    ctx = Context(circuit, repeated_tokens(32, 4, 63, bos=63))
    zeros, big = torch.zeros(32, dtype=torch.float64), torch.linspace(0.9, 1.1, 32, dtype=torch.float64)
    inside = equivalence_evidence("observational", zeros, ctx, band=0.01, what="x", unit="nats")
    assert inside.passed is True and inside.p_value < 0.01 and inside.rule == "CI within +-0.01 nats"
    outside = equivalence_evidence("observational", big, ctx, band=0.01, what="x")
    assert outside.passed is False and outside.p_value > 0.5 and outside.decisive
    wide = equivalence_evidence("observational", torch.linspace(-0.05, 0.05, 32), ctx, band=0.01, what="x")
    assert wide.passed is None
    with pytest.raises(ValueError, match=r"band=0\.0 must be finite and > 0"):
        equivalence_evidence("observational", zeros, ctx, band=0.0, what="x")


@pytest.mark.parametrize("edge, message", [
    ("L1H0 -> L0H0 via k", r"receiver L0H0 \(layer 0\) must sit in a later layer than the sender L1H0"),
    ("L0H0 -> L0H1 via q", r"must sit in a later layer"),
    ("L0H0 -> L1H0", r"needs 'via q', 'via k' or 'via v'"),
    ("L0H0 -> L1H0 via x", r"via 'x'; expected one of"),
    ("embed -> L1H0 via k", r"both ends must be heads"),
    ("L0H0 -> logits", r"both ends must be heads"),
    ("L0H0 to L1H0", r"is not an edge"),
])
def test_bad_edges(edge, message):
    with pytest.raises(BadInput, match=message):
        composition_claim(edge)


def test_bad_min_effect_and_an_unpatchable_model():
    from interp.models import GPTConfig, HookedGPT

    with pytest.raises(BadInput, match="min_effect=0 must be a finite number > 0"):
        composition_claim("L0H0 -> L1H0 via k", min_effect=0)
    claim = composition_claim("L0H0 -> L1H0 via k", min_effect=0.5)
    assert claim.params["min_effect"] == 0.5 and claim.target == claim.label == "L0H0 -> L1H0 via k"
    assert claim.spec()["target"] == "L0H0 -> L1H0 via k" and composition_edge("l0h0->l1h0 via K").label == claim.label
    post_norm = HookedGPT(GPTConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=64, post_norm=True)).eval()
    frame = run_test_claims(post_norm, [claim], repeated_tokens(32, 6, 40))
    verdict = frame.attrs["verdicts"][0]
    assert frame.verdict[0] == "inconclusive" and "needs a pre-norm model" in frame.reasons[0], frame.reasons[0]
    assert verdict.get("necessity") is None  # an abstaining observational test stops the rest (interp.claims.gather)
    with pytest.raises(Inconclusive, match="needs a pre-norm model"):  # the control alone abstains too, before any score
        claim.evidence["necessity"](claim, Context(post_norm, repeated_tokens(32, 6, 40)))
    assert math.isnan(frame.attrs["verdicts"][0].get("observational").effect)


def test_a_claim_on_a_shared_key_input_named_by_the_wrong_head_is_refused_before_any_work():
    """k28: 'L0H0 -> L1H1 via k' on a grouped-query model names L1H0's key head; refused up front (exit 2 through
    `interp claims`), naming the graph's edge."""
    from interp.models import GPTConfig, HookedGPT

    model = HookedGPT(GPTConfig(n_layers=2, n_heads=4, n_key_value_heads=2, d_model=32, n_ctx=32, d_vocab=20,
                                attn_only=True, seed=1)).eval()
    prompts = repeated_tokens(32, 5, d_vocab=20, seed=0)
    with pytest.raises(BadInput, match=r"'L0H0 -> L1H1 via k' is not an edge of this model's graph.*use 'L0H0 -> L1KV0 via k'"):
        run_test_claims(model, [composition_claim("L0H0 -> L1KV0 via k"), composition_claim("L0H0 -> L1H1 via k")], prompts)
    with pytest.raises(BadInput, match=r"'L0H0 -> L1KV0 via q': a key/value head is reached via k or v only"):
        composition_claim("L0H0 -> L1KV0 via q")


def test_a_claim_into_a_key_value_head_is_its_path_patch_with_group_evidence():
    """Grouped-query attention (notebook 07's question): 'L0H0 -> L1KV0 via k' on the grouped induction circuit is
    supported by its path patch (the ungrouped circuit's +6.19 nats: key/value head 0 is the induction head's key);
    the composition score is the group's strongest query head's, named, against the group's baseline (the largest of
    as many random scores, so above the single-head baseline); the control is chosen by that group score; no QK
    attribution (per query head)."""
    from factories import grouped_induction_circuit, induction_prompts

    from interp.analyses.circuits.composition import composition_scores

    model = grouped_induction_circuit()
    claim = composition_claim("L0H0 -> L1KV0 via k")
    assert claim.heads == ((0, 0),) and claim.target == "L0H0 -> L1KV0 via k" and "qk_attribution" not in claim.evidence
    frame = run_test_claims(model, [claim], induction_prompts(32))
    verdict = frame.attrs["verdicts"][0]
    obs, nec = verdict.get("observational"), verdict.get("necessity")
    assert verdict.verdict == "supported" and obs.effect == pytest.approx(6.19, abs=0.01)
    single = composition_scores(model, vias=("k",))
    row = single[(single.sender == "L0H0") & (single.receiver == obs.extra["composition_head"])].iloc[0]
    group = single[(single.sender == "L0H0") & single.receiver.isin(["L1H0", "L1H1"])]
    assert obs.extra["composition_head"] == "L1H0" and obs.extra["composition_score"] == pytest.approx(group.score.max())
    assert obs.extra["composition_baseline_p95"] > row.baseline_p95  # the max of two draws: a higher bar
    assert obs.extra["composition_ratio"] == pytest.approx(row.score / composition_row(model, claim.target)["baseline"])
    assert "the strongest query head of L1KV0's group, L1H0" in obs.detail
    assert nec.extra["control_edge"] == "L0H1 -> L1KV0 via k" and nec.passed is True


def test_composition_evidence_records_the_write_change_and_zero_ablation_beside(circuit_verdicts):
    """On the constructed circuit every sender's write changes under resampling (the test has power); the edge's zero
    ablation is reported beside the verdict, never in it; every evidence keeps its per-prompt values."""
    composes, _, _, _, absent = circuit_verdicts.attrs["verdicts"]
    obs, nec, zero = composes.get("observational"), composes.get("necessity"), composes.get("zero")
    assert obs.write_change > 1.0 and obs.extra["write_change"] == obs.write_change and nec.write_change == obs.write_change
    assert nec.extra["control_write_change"] > 1.0
    assert zero.extra["ablation"] == "zero (off-distribution)" and zero.effect > 1.0 and zero.passed is True
    assert obs.values.dtype == torch.float64 and obs.values.shape == (32,) and float(obs.values.mean()) == obs.effect
    assert absent.get("zero") is not None and absent.get("zero").passed is False  # zeroing it matters: outside the band
    assert absent.verdict == "refuted" and absent.reasons[0].startswith("observational failed")  # zero is not a reason


@pytest.fixture(scope="module")
def positional_verdicts():
    """The positional sender (`interp.models.handbuilt`): L0H0 writes positions only, the same on every prompt."""
    from interp.models import handbuilt

    model = handbuilt.positional_sender()
    prompts = repeated_tokens(32, 2, 63, bos=63, n_repeats=10)
    claims = [composition_claim("L0H0 -> L1H0 via k"), composition_claim("L0H0 -> L1H0 via k", composes=False),
              composition_claim("L0H1 -> L1H0 via k", composes=False)]
    return model, prompts, run_test_claims(model, claims, prompts)


def test_a_positional_sender_is_neither_refuted_nor_cleared(positional_verdicts):
    """Issue 42's case: zeroing L0H0 costs ~2 nats and its K-composition score is 2x the baseline, yet resampling
    cannot change its write, so the path patch is exactly 0 [0, 0]. Without power, "composes" is not refuted and
    "does not compose" not supported: both inconclusive, saying why; the zero ablation beside shows the write matters.
    A sender with power (L0H1, whose write changes) is still judged: its absence is supported."""
    model, prompts, frame = positional_verdicts
    composes, absent, other = frame.attrs["verdicts"]
    assert list(frame.verdict) == ["inconclusive", "inconclusive", "supported"]
    for verdict in (composes, absent):
        obs = verdict.get("observational")
        assert (obs.effect, obs.ci_low, obs.ci_high) == (0.0, 0.0, 0.0) and obs.write_change == 0.0
        assert obs.passed is None and obs.extra["composition_ratio"] == pytest.approx(2.0, rel=1e-3)
        assert verdict.reasons[0].startswith("observational undecided: inconclusive: the corruption does not change "
                                             "L0H0's write")
        assert verdict.get("zero").effect > 1.5 and verdict.get("zero").ci_low > 1.5
    assert composes.get("necessity").passed is None and "does not change L0H0's write" in composes.get("necessity").detail
    assert absent.get("zero").passed is False  # zero ablation disagrees with "does not compose", beside the verdict
    assert other.get("observational").write_change == pytest.approx(2 ** 0.5) and other.get("observational").passed
