"""The calibration study of the claims' causal evidence (`interp.analyses.claims.calibration`, issue #20):
claims of known truth, tested by the causal evidence alone.

The table's structure and truth labels are checked against the models' known heads; the targets
(false claims never supported, nor passing any causal evidence kind; true claims about heads that
matter supported; true claims about heads with no effect inconclusive, saying so, never refuted)
are asserted too. The evidence before issue #20 missed some of them (false roles passed necessity and
faithfulness; a redundant-pair head whose ablation costs 1e-5 nats was "supported"). The fast suite
runs in the default suite (about 15 s on one thread); the full sweep is slow.
"""
from __future__ import annotations

import numpy as np
import pytest

from interp.analyses.claims import calibration as cal
from interp.analyses.claims import make_claim
from interp.claims import evaluate_claims
from interp.data import random_tokens, repeated_tokens
from interp.models import constructed


@pytest.fixture(scope="module")
def fast_table():
    return cal.calibration_table("fast", seed=0)


def _row(table, model, claim, heads):
    rows = table[(table.model == model) & (table.claim == claim) & (table.heads == heads)]
    assert len(rows) == 1, f"expected one row for {model} {claim} {heads}, got {len(rows)}"
    return rows.iloc[0]


@pytest.mark.heavy
def test_table_has_one_row_per_claim_with_the_stated_columns(fast_table):
    assert list(fast_table.columns) == cal.COLUMNS
    assert set(fast_table.suite) == {"fast"}
    assert set(fast_table.truth) <= set(cal.TRUTHS)
    assert set(fast_table.verdict) <= {"supported", "refuted", "inconclusive"}
    assert not fast_table.duplicated(["model", "claim", "heads"]).any()
    assert cal.N_PROMPTS >= 32
    for flag in (f"{k}_passed" for k in cal.CAUSAL_FLAGS):
        assert set(fast_table[flag].dropna()) <= {True, False}


@pytest.mark.heavy
def test_fast_suite_has_one_false_claim_per_role_on_an_important_toy_head(fast_table):
    toy = fast_table[(fast_table.model == "toy-induction") & (fast_table.claim != "backs_up")]
    false = toy[toy.truth == "false"]
    causal_roles = {"previous_token", "self_token", "first_token", "local_window", "induction", "duplicate_token"}
    assert sorted(false.claim) == sorted(causal_roles)  # next_token: bidirectional only; positional: no causal evidence
    assert (false.mass < cal.FALSE_BELOW).all()
    assert (false.importance > 0.1).all()  # each on a head whose ablation costs more than 0.1 nats


@pytest.mark.heavy
def test_known_heads_are_labelled_by_their_metrics(fast_table):
    assert _row(fast_table, "toy-induction", "previous_token", "L0H2").truth == "true"  # 0.88 on query - 1
    for head in range(4):
        assert _row(fast_table, "toy-induction", "induction", f"L1H{head}").truth == "true"
    backups = fast_table[fast_table.claim == "backs_up"]
    assert set(backups.heads) == {"L1H0+L0H2", "L1H1+L0H2", "L1H2+L0H2", "L1H3+L0H2", "L1H0+L0H0"}
    assert set(backups.truth) == {"false"}
    circuit = "constructed induction_circuit"
    assert _row(fast_table, circuit, "previous_token", "L0H0").truth == "true"
    assert _row(fast_table, circuit, "induction", "L1H0").truth == "true"
    assert _row(fast_table, circuit, "self_token", "L1H2").truth == "true_no_effect"
    assert _row(fast_table, "constructed pattern_heads", "first_token", "L0H1").truth == "true_no_effect"
    assert _row(fast_table, "constructed redundant_pair", "previous_token", "L0H1").truth == "true_no_effect"
    assert _row(fast_table, "constructed single_head(first_token)", "first_token", "L0H0").truth == "true_no_effect"
    silenced = "constructed induction_circuit, L1H0 W_O zeroed"
    assert _row(fast_table, silenced, "induction", "L1H0").truth == "true_no_effect"
    assert _row(fast_table, silenced, "previous_token", "L0H0").truth == "true_no_effect"
    hand_set = fast_table[fast_table.model.str.startswith("constructed") & (fast_table.claim != "backs_up")]
    assert np.allclose(hand_set.mass, 1.0, atol=1e-4)  # hand-set patterns are exact
    no_effect = fast_table[fast_table.truth == "true_no_effect"]
    assert (no_effect.importance.abs() < 1e-3).all()
    positional = fast_table[fast_table.model == "handbuilt positional_sender"]
    assert list(positional.claim) == ["does_not_compose", "dispensable"] and set(positional.truth) == {"false"}


@pytest.mark.heavy
def test_false_claims_without_power_are_never_supported(fast_table):
    """The positional sender's L0H0 writes the same positions on every prompt: resampling and mean ablation leave it
    unchanged, so the tests of "does not compose" and "dispensable" measure exactly 0 and have no power (issue 42)."""
    positional = fast_table[fast_table.model == "handbuilt positional_sender"]
    assert (positional.verdict == "inconclusive").all(), positional
    assert positional.reasons.str.contains("does not change L0H0's write").all()
    assert list(positional.evidence) == ["observational", "observational"]  # zero ablation: beside, never judged


def test_role_truth_rules_on_known_masses():
    masses = {"previous_token": np.array([[0.8, 0.1, 0.4]]), "local_window": np.array([[0.9, 0.2, 0.6]]),
              "self_token": np.array([[0.1, 0.05, 0.2]])}
    importance = np.array([[2.0, 2.0, 0.001]])
    truth = lambda kind, head: cal.role_truth(kind, 0, head, masses, importance, minimum=0.01)[0]  # noqa: E731
    assert truth("previous_token", 0) == "true"
    assert truth("local_window", 0) == "overlap"  # contains the head's previous-token role
    assert truth("previous_token", 1) == "false"  # 0.1 < 0.3
    assert truth("previous_token", 2) == "overlap"  # a partial share
    assert truth("local_window", 2) == "overlap"  # its role, but the head does not matter
    assert truth("self_token", 1) == "false"


def test_role_kinds_follow_the_model_and_prompts(tiny_gpt, tiny_encoder):
    repeats = repeated_tokens(4, 5, 40)
    plain = random_tokens(4, 10, 40)
    repeat_roles = ("induction", "duplicate_token")
    assert cal.role_kinds(tiny_gpt, repeats) == ("previous_token", "self_token", "first_token", "local_window",
                                                 *repeat_roles)
    assert "next_token" in cal.role_kinds(tiny_encoder, repeats)  # bidirectional
    assert not set(repeat_roles) & set(cal.role_kinds(tiny_gpt, plain))
    assert "positional" not in cal.role_kinds(tiny_encoder, repeats)  # no causal evidence


def test_head_importance_is_exact_on_hand_set_heads():
    model = constructed.pattern_heads(d_vocab=16, n_ctx=32)
    prompts = repeated_tokens(32, 2, 15, bos=15, n_repeats=8)
    importance, minimum = cal.head_importance(model, prompts, heads=[(0, 0), (0, 1)])
    assert minimum == 0.01  # nats
    assert importance[0, 0] > 1.0 and importance[0, 1] == 0.0  # L0H1 writes to nothing the output reads
    assert np.isnan(importance[0, 2:]).all()  # not asked for


def test_causal_verdict_leaves_out_the_observational_metric():
    model = constructed.pattern_heads(d_vocab=16, n_ctx=32)
    prompts = repeated_tokens(32, 2, 15, bos=15, n_repeats=8)
    (verdict,) = evaluate_claims(model, [make_claim("previous_token", 0, 1)], prompts,
                                 evidence=["observational", "necessity", "faithfulness"])
    assert verdict.verdict == "refuted"  # L0H1 is a sink head: its metric refutes the claim
    assert [e.kind for e in cal.judged_evidence(verdict)] == ["necessity", "faithfulness"]
    ((causal, reasons),) = cal.causal_verdicts([verdict])
    assert causal == "inconclusive" and all("observational" not in r for r in reasons)


@pytest.mark.heavy
def test_summary_states_each_target(fast_table):
    summary = cal.calibration_summary(fast_table)
    assert list(summary.columns) == ["suite", "measure", "count", "n", "rate", "target", "met"]
    assert list(summary.measure) == [
        "false claims supported", "false claims passing necessity", "false claims passing sufficiency",
        "false claims passing faithfulness", "true claims (heads that matter) supported",
        "true no-effect claims inconclusive, saying no effect", "true no-effect claims refuted", "overlap claims supported"]
    assert (summary["count"] <= summary["n"]).all()
    counts = summary.set_index("measure")["n"]
    assert counts["false claims supported"] == (fast_table.truth == "false").sum() == 13
    assert counts["true claims (heads that matter) supported"] == (fast_table.truth == "true").sum()


@pytest.mark.heavy
def test_main_prints_the_table_and_summary(fast_table, monkeypatch, capsys):
    monkeypatch.setattr(cal, "calibration_table", lambda suite, seed=0: fast_table)
    cal.main([])
    out = capsys.readouterr().out
    assert "false claims supported" in out and "fast suite: 40 claims" in out


def test_unknown_suite_is_refused():
    with pytest.raises(ValueError, match="suite='medium'; expected one of"):
        cal.calibration_table("medium")  # type: ignore[arg-type]


def _assert_false_targets(table):
    summary = cal.calibration_summary(table).set_index("measure")
    false = [m for m in summary.index if m.startswith("false claims")]
    missed = summary.loc[false][~summary.loc[false, "met"].astype(bool)]
    assert missed.empty, f"targets missed:\n{missed}\nclaims:\n{table[table.truth == 'false']}"


@pytest.mark.heavy
def test_false_claims_pass_no_causal_evidence(fast_table):
    _assert_false_targets(fast_table)


@pytest.mark.heavy
def test_true_claims_about_heads_that_matter_are_supported(fast_table):
    true = fast_table[fast_table.truth == "true"]
    assert len(true) == 9
    assert (true.verdict == "supported").all(), true[true.verdict != "supported"]


@pytest.mark.heavy
def test_true_claims_about_heads_without_effect_are_never_refuted(fast_table):
    no_effect = fast_table[fast_table.truth == "true_no_effect"]
    assert (no_effect.verdict != "refuted").all(), no_effect[no_effect.verdict == "refuted"]


@pytest.mark.heavy
def test_true_claims_about_heads_without_effect_end_inconclusive_saying_so(fast_table):
    no_effect = fast_table[fast_table.truth == "true_no_effect"]
    ok = (no_effect.verdict == "inconclusive") & no_effect.no_effect_reason
    assert ok.all(), no_effect[~ok]


@pytest.fixture(scope="module")
def full_table():
    return cal.calibration_table("full", seed=0)


@pytest.mark.slow
def test_full_sweep_false_claims_pass_no_causal_evidence(full_table):
    _assert_false_targets(full_table)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="local-window heads (toy-induction L0H1, MiniLM L0H4 and L0H5) are not "
                                       "supported: the window's ideal recovers too little, and L0H1's knockout costs "
                                       "less than half of its ablation (measured after issue #20)")
def test_full_sweep_true_claims_about_heads_that_matter_are_supported(full_table):
    true = full_table[full_table.truth == "true"]
    assert len(true) >= 9
    assert (true.verdict == "supported").all(), true[true.verdict != "supported"]


@pytest.mark.slow
def test_full_sweep_true_claims_without_effect_are_never_refuted(full_table):
    no_effect = full_table[full_table.truth == "true_no_effect"]
    assert len(no_effect) >= 18
    assert (no_effect.verdict != "refuted").all(), no_effect[no_effect.verdict == "refuted"]
