"""Built-in head claims on models whose every head is known: the verdicts must be exact."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from interp.analyses import claims as hc
from interp.analyses.claims.causal import behaviour_mask, content_pattern
from interp.analyses.claims.evidence import modal_offset
from interp.analyses.positional import focus_per_prompt
from interp.claims import Context, Inconclusive, evaluate_claims
from interp.claims import test_claims as run_test_claims
from interp.data import PromptSet, random_tokens, repeated_tokens
from interp.models.constructed import fixed_offset_copier, induction_circuit, pattern_heads

D_VOCAB, N_CTX, PREFIX = 32, 64, 12
BOS = D_VOCAB - 1


def verdicts_of(frame):
    return {(row.label, row.claim): row.verdict for row in frame.itertuples()}


@pytest.fixture(scope="module")
def circuit():
    return induction_circuit(d_vocab=D_VOCAB, n_ctx=N_CTX)


@pytest.fixture(scope="module")
def repeated():
    return repeated_tokens(32, PREFIX, D_VOCAB - 1, bos=BOS, seed=1)


@pytest.fixture(scope="module")
def circuit_table(circuit, repeated):
    claims = [
        hc.previous_token_head(0, 0), hc.induction_head(1, 0),  # true
        hc.induction_head(0, 0), hc.first_token_head(0, 0), hc.previous_token_head(1, 0),  # false
        hc.duplicate_token_head(1, 0), hc.positional_head(1, 0, offset=-(PREFIX - 1)),  # false: induction is not a fixed offset
        hc.positional_head(0, 0), hc.previous_token_head(0, 3), hc.first_token_head(1, 1),
    ]
    return run_test_claims(circuit, claims, repeated)


@pytest.mark.heavy
def test_induction_circuit_true_claims_supported_with_every_evidence(circuit_table):
    verdicts = verdicts_of(circuit_table)
    assert verdicts[("L0H0", "previous_token")] == "supported"
    assert verdicts[("L1H0", "induction")] == "supported"
    assert verdicts[("L0H0", "positional")] == "supported"
    rows = circuit_table.set_index(["label", "claim"])
    by_claim = {(v.claim.label, v.claim.name): v for v in circuit_table.attrs["verdicts"]}
    for key in (("L0H0", "previous_token"), ("L1H0", "induction")):
        row = rows.loc[key]
        for kind in ("observational", "control_shuffled", "control_random_init", "necessity"):
            assert row[f"{kind}_passed"] == True, (key, kind)  # noqa: E712 (numpy bool)
        assert row["observational"] == pytest.approx(1.0, abs=1e-6)
        # exact heads: the ideal pattern is the head's own, so substituting it recovers all of the loss,
        # by construction: sufficiency and faithfulness are "not informative" (undecided, counted neither way)
        assert row["sufficiency"] == pytest.approx(1.0, abs=1e-4)
        for kind in ("sufficiency", "faithfulness"):
            evidence = by_claim[key].get(kind)
            assert evidence.passed is None and evidence.extra["informative"] == "no", evidence.detail
        assert row["p_adjusted"] <= 0.05


def test_induction_circuit_false_claims_refuted(circuit_table):
    verdicts = verdicts_of(circuit_table)
    for key in (("L0H0", "induction"), ("L0H0", "first_token"), ("L1H0", "previous_token"), ("L1H0", "duplicate_token"),
                ("L0H3", "previous_token")):
        assert verdicts[key] == "refuted", key
    # an induction head does not copy from a fixed offset: the positional claim at the repeat distance fails
    rows = circuit_table.set_index(["label", "claim"])
    assert rows.loc[("L1H0", "positional"), "verdict"] == "refuted"
    assert rows.loc[("L1H0", "positional"), "control_shuffled"] < 0.2


def test_dispensable_head_pattern_is_true_but_not_necessary(circuit_table):
    """L1H1 attends to the first token exactly, but writes to a subspace nothing reads: the pattern
    claim cannot be supported by causal evidence, and says so."""
    row = circuit_table.set_index(["label", "claim"]).loc[("L1H1", "first_token")]
    assert row["verdict"] == "inconclusive"
    assert row["observational"] == pytest.approx(1.0, abs=1e-6)
    assert row["observational_passed"] == True  # noqa: E712
    assert "faithfulness undecided" in row["reasons"] and "inconclusive: no effect" in row["reasons"]
    assert "necessity failed" in row["reasons"]


@pytest.fixture(scope="module")
def heads_model():
    return pattern_heads(d_vocab=D_VOCAB, n_ctx=N_CTX)


def test_pattern_heads_observational_and_controls(heads_model):
    """Period-2 prompts after a BOS (the task of pattern_heads): every role verdict is exact on the
    pattern evidence; the uniform head is refuted for every role."""
    prompts = repeated_tokens(32, 2, D_VOCAB - 1, bos=BOS, n_repeats=16, seed=2)
    claims = [hc.previous_token_head(0, 0), hc.first_token_head(0, 1), hc.self_token_head(0, 2),
              hc.local_window_head(0, 4), hc.local_window_head(0, 5), hc.positional_head(0, 1, offset="first"),
              hc.previous_token_head(0, 3), hc.first_token_head(0, 3), hc.self_token_head(0, 3), hc.positional_head(0, 3),
              hc.first_token_head(0, 0), hc.self_token_head(0, 0)]
    frame = run_test_claims(heads_model, claims, prompts, evidence=["observational", "control_shuffled", "control_random_init"])
    got = [row.verdict for row in frame.itertuples()]
    assert got == ["supported"] * 6 + ["refuted"] * 6, frame[["label", "claim", "verdict", "reasons"]].to_string()


def test_period_two_induction_illusion_is_refuted(heads_model):
    """On period-2 prompts the previous token *is* the token after the earlier occurrence, so the
    previous-token head scores 1.0 as 'induction'; once the tokens are shuffled it still attends
    where the target was (one back), so the shuffled-token control refutes the claim."""
    prompts = repeated_tokens(32, 2, D_VOCAB - 1, bos=BOS, n_repeats=16, seed=2)
    verdict = evaluate_claims(heads_model, [hc.induction_head(0, 0)], prompts)[0]
    assert verdict.get("observational").effect == pytest.approx(1.0, abs=1e-6)
    assert verdict.get("control_shuffled").passed is False
    assert verdict.get("control_shuffled").effect == pytest.approx(1.0, abs=1e-6)
    assert verdict.verdict == "refuted"


def test_fixed_offset_copier_is_not_an_induction_head(repeated):
    """A head that copies from the repeat distance looks like induction on repeats of that length:
    the claims tell them apart (its target moves with shuffled tokens, its attention does not)."""
    model = fixed_offset_copier(PREFIX, d_vocab=D_VOCAB, n_ctx=N_CTX)
    frame = run_test_claims(model, [hc.induction_head(0, 0), hc.positional_head(0, 0, offset=-(PREFIX - 1)),
                                    hc.positional_head(0, 0)], repeated)
    rows = frame.set_index(["claim", frame.index])
    assert frame.loc[0, "observational"] == pytest.approx(1.0, abs=1e-6)  # looks like induction
    # on shuffled tokens it still attends where the repeat target was: a fixed offset, not induction
    assert frame.loc[0, "verdict"] == "refuted" and frame.loc[0, "control_shuffled"] > 0.99
    assert frame.attrs["verdicts"][0].get("control_shuffled").extra["follows_tokens"] < 0.2
    assert frame.loc[1, "verdict"] == "supported"
    assert frame.loc[2, "verdict"] == "supported"  # the modal offset is found on its own
    assert "argmax_at:-11" in frame.loc[2, "reasons"]
    assert len(rows) == 3


def test_shuffled_control_stay_rule_on_content(repeated):
    """expect="stay" on a content metric: the fixed-offset head's induction score, recomputed from the
    shuffled tokens, collapses, so a claim that it should stay fails that control too."""
    import dataclasses

    model = fixed_offset_copier(PREFIX, d_vocab=D_VOCAB, n_ctx=N_CTX)
    base = hc.induction_head(0, 0)
    claim = dataclasses.replace(base, evidence={**base.evidence, "control_shuffled": hc.ShuffledControl("stay")})
    control = evaluate_claims(model, [claim], repeated, evidence=["observational", "control_shuffled"])[0].get("control_shuffled")
    assert control.passed is False and control.effect < 0.2
    with pytest.raises(ValueError, match="expect='sideways'"):
        hc.ShuffledControl("sideways")(claim, Context(model, repeated))
    no_position = dataclasses.replace(base, params={**base.params, "position_metric": None})
    with pytest.raises(ValueError, match="position_metric"):
        hc.ShuffledControl("drop")(no_position, Context(model, repeated))


def distinct_repeats(n: int, prefix_len: int, seed: int = 0) -> PromptSet:
    """BOS + a prefix of distinct tokens + the same prefix: no accidental repeats inside a copy."""
    generator = torch.Generator().manual_seed(seed)
    prefix = torch.stack([torch.randperm(D_VOCAB - 1, generator=generator)[:prefix_len] for _ in range(n)])
    tokens = torch.cat([torch.full((n, 1), BOS), prefix, prefix], dim=1)
    return PromptSet(tokens, meta={"kind": "repeated", "prefix_len": prefix_len, "offset": 1, "bos": BOS})


def test_repeat_position_metric_known_answer(circuit):
    prompts = distinct_repeats(8, PREFIX)
    ctx = Context(circuit, prompts)
    position = hc.head_metric(ctx, "induction_position")  # (prompt, layer, head)
    # the constructed induction head attends exactly prefix_len - 1 back on repeats of distinct tokens
    torch.testing.assert_close(position[:, 1, 0], torch.ones(len(prompts)))
    torch.testing.assert_close(hc.head_metric(ctx, "duplicate_position")[:, 1, 0], torch.zeros(len(prompts)))
    # the previous-token head looks one back, never prefix_len - 1 back
    torch.testing.assert_close(position[:, 0, 0], torch.zeros(len(prompts)))
    random = random_tokens(8, 20, D_VOCAB, seed=0)
    with pytest.raises(Inconclusive, match="repeat structure"):
        hc.head_metric(Context(circuit, random), "induction_position")


def test_induction_holds_at_other_repeat_lengths(circuit):
    """Real induction is not tied to one repeat length: supported at lengths 5 and 20 too."""
    for prefix in (5, 20):
        prompts = repeated_tokens(32, prefix, D_VOCAB - 1, bos=BOS, seed=prefix)
        verdict = evaluate_claims(circuit, [hc.induction_head(1, 0)], prompts,
                                  evidence=["observational", "control_shuffled", "control_random_init", "necessity"])[0]
        assert verdict.verdict == "supported", verdict.reasons


def test_bad_input_gives_reasons_not_numbers(circuit):
    # no repeats at all: every prompt is a permutation of distinct tokens
    generator = torch.Generator().manual_seed(0)
    distinct = PromptSet(torch.stack([torch.randperm(D_VOCAB - 1, generator=generator)[:20] for _ in range(32)]))
    verdict = evaluate_claims(circuit, [hc.induction_head(1, 0)], distinct)[0]
    assert verdict.verdict == "inconclusive"
    assert "repeat" in verdict.reasons[0]
    assert math.isnan(verdict.get("observational").effect)
    # too few prompts for an interval
    few = repeated_tokens(4, PREFIX, D_VOCAB - 1, bos=BOS)
    verdict = evaluate_claims(circuit, [hc.previous_token_head(0, 0)], few)[0]
    assert verdict.verdict == "inconclusive" and "too few prompts" in verdict.reasons[0]
    # a head that does not exist
    with pytest.raises(ValueError, match="L2H0"):
        run_test_claims(circuit, [hc.induction_head(2, 0)], few)
    with pytest.raises(ValueError, match="unknown claim kind 'inducton'"):
        hc.make_claim("inducton", 1, 0)


def test_next_token_claims_need_a_bidirectional_model(circuit, repeated, tiny_encoder):
    verdict = evaluate_claims(circuit, [hc.next_token_head(0, 0)], repeated)[0]
    assert verdict.verdict == "inconclusive" and "undefined" in verdict.reasons[0]
    prompts = random_tokens(32, 20, tiny_encoder.cfg.d_vocab, seed=0)
    verdict = evaluate_claims(tiny_encoder, [hc.next_token_head(0, 0)], prompts,
                              evidence=["observational", "control_shuffled", "control_random_init"])[0]
    assert verdict.verdict == "refuted" and verdict.get("observational").effect < 0.2


def test_necessity_on_prompts_without_repeats_uses_every_position(circuit):
    prompts = random_tokens(16, 30, D_VOCAB - 1, bos=BOS, seed=3)
    mask, name = behaviour_mask(prompts)
    assert name == "next-token loss on every position" and bool(mask.all())
    rep = repeated_tokens(3, 5, D_VOCAB - 1, bos=BOS)
    mask, name = behaviour_mask(rep)
    # BOS + 5 + 5 tokens: predictions from queries 6..9 (tokens 7..10) are repeats
    assert mask[0].nonzero().flatten().tolist() == [6, 7, 8, 9] and "repeated" in name


def test_argmax_offsets_agree_with_positional(circuit, repeated):
    ctx = Context(circuit, repeated)
    focus = focus_per_prompt(circuit, repeated)
    torch.testing.assert_close(hc.head_metric(ctx, "argmax_at:-1"), focus["prev_token_argmax"])
    torch.testing.assert_close(hc.head_metric(ctx, "argmax_at:0"), focus["self_token_argmax"])
    torch.testing.assert_close(hc.head_metric(ctx, "argmax_at:first"), focus["first_token_argmax"])
    assert modal_offset(ctx, 0, 0) == "-1" and modal_offset(ctx, 0, 1) == "first"
    with pytest.raises(ValueError, match="unknown head metric 'prev'"):
        hc.head_metric(ctx, "prev")


def test_content_pattern_known_answer():
    batch = PromptSet(torch.tensor([[9, 1, 2, 1, 2]]))
    induction = content_pattern(batch, "induction")[0]
    duplicate = content_pattern(batch, "duplicate_token")[0]
    # query 3 (token 1, earlier at 1) -> key 2; query 4 (token 2, earlier at 2) -> key 3; others -> first key
    assert induction.argmax(-1).tolist() == [0, 0, 0, 2, 3]
    assert duplicate.argmax(-1).tolist() == [0, 0, 0, 1, 2]
    torch.testing.assert_close(induction.sum(-1), torch.ones(5))


def test_random_init_model_same_shape_new_weights(circuit):
    fresh = hc.random_init_model(circuit, seed=5)
    assert type(fresh) is type(circuit) and fresh.cfg.d_model == circuit.cfg.d_model
    assert not torch.equal(fresh.blocks[0].attn.W_Q, circuit.blocks[0].attn.W_Q)


def test_stability_on_exact_heads(circuit, repeated):
    verdict = evaluate_claims(circuit, [hc.previous_token_head(0, 0)], repeated, evidence=["observational", "stability"])[0]
    stability = verdict.get("stability")
    assert stability.passed is True and stability.effect == 1.0
    assert "bfloat16" in stability.detail and verdict.verdict == "supported"


def test_scan_proposes_on_one_half_and_tests_on_the_other(circuit):
    prompts = repeated_tokens(64, PREFIX, D_VOCAB - 1, bos=BOS, seed=4)
    table = hc.scan(circuit, prompts, seed=0, evidence=["observational", "control_shuffled", "control_random_init"])
    assert set(table["n_prompts"]) == {32} and set(table["proposed_on"]) == {32}
    verdicts = verdicts_of(table)
    assert verdicts[("L0H0", "previous_token")] == "supported"
    assert verdicts[("L1H0", "induction")] == "supported"
    assert verdicts[("L0H1", "first_token")] == "supported"
    labels = set(table["label"])
    assert labels == {f"L{l}H{h}" for l in range(2) for h in range(4)}  # every head gets a claim


def test_scan_of_chosen_heads_tests_only_those(circuit):
    """A large model's scan is restricted to the heads asked for (the report's --layers): the same verdicts as the
    full scan gives them, and no claim about any other head."""
    prompts = repeated_tokens(64, PREFIX, D_VOCAB - 1, bos=BOS, seed=4)
    table = hc.scan(circuit, prompts, seed=0, evidence=["observational"], heads=["L1H0", (0, 0)])
    assert set(table["label"]) == {"L0H0", "L1H0"}
    assert verdicts_of(table)[("L1H0", "induction")] == "supported"
    with pytest.raises(ValueError, match="L5H0|layer 5"):
        hc.scan(circuit, prompts, heads=["L5H0"])


# --------------------------------------------------------------------------- the trained toy-induction checkpoint

TOY = Path(__file__).resolve().parents[3] / "models" / "checkpoints" / "toy-induction"


@pytest.fixture(scope="module")
def toy():
    from interp.models.io import checkpoint_paths, load_checkpoint

    if not checkpoint_paths(TOY)[0].exists():
        pytest.skip(f"{TOY}.safetensors is not built yet (interp train --task induction --seed 0 --out {TOY})")
    model = load_checkpoint(TOY)
    roles = model.metadata.get("head_roles", {})
    prev = [parse_label(h) for h in roles.get("previous_token_heads", [])]
    induction = [parse_label(h) for h in roles.get("induction_heads", [])]
    assert prev and induction, f"the checkpoint card lists no previous-token or induction heads: {roles}"
    return model, prev, induction


def parse_label(label: str) -> tuple[int, int]:
    layer, head = label[1:].split("H")
    return int(layer), int(head)


def toy_prompts(model, prefix_len: int, n: int = 48, seed: int = 7):
    return repeated_tokens(n, prefix_len, model.cfg.d_vocab, bos=model.cfg.d_vocab - 1, seed=seed)


@pytest.fixture(scope="module")
def toy_table(toy):
    model, prev, induction = toy
    prompts = toy_prompts(model, 20)
    claims = []
    for layer, head in induction:
        claims += [hc.induction_head(layer, head), hc.previous_token_head(layer, head),
                   hc.positional_head(layer, head, offset=-(20 - 1))]
    for layer, head in prev:
        claims += [hc.previous_token_head(layer, head), hc.induction_head(layer, head), hc.first_token_head(layer, head)]
    return run_test_claims(model, claims, prompts)


@pytest.mark.heavy
def test_toy_induction_heads_supported(toy, toy_table):
    """The card's induction heads are supported with every default evidence: controls, necessity
    (ablating each hurts the repeated copies; all of them together remove the repeat advantage),
    sufficiency (the ideal induction pattern recovers the ablation's loss) and faithfulness."""
    rows = toy_table.set_index(["label", "claim"])
    verdicts = {(v.claim.label, v.claim.name): v for v in toy_table.attrs["verdicts"]}
    _, _, induction = toy
    for layer, head in induction:
        label = f"L{layer}H{head}"
        row = rows.loc[(label, "induction")]
        assert row["verdict"] == "supported", (label, row["reasons"])
        assert row["sufficiency"] > 0.9 and row["necessity"] > 0  # measured 1.02-1.03
        necessity = verdicts[(label, "induction")].get("necessity")
        if "advantage_removed_role_group" in necessity.extra:
            assert necessity.extra["advantage_removed_role_group"] > 0.8


def test_toy_previous_token_heads(toy, toy_table):
    """The previous-token head(s) the induction heads rely on are supported with every default
    evidence, sufficiency included: substituting the *exact* one-hot previous-token pattern recovers
    most of the loss its ablation costs (measured on L0H2: 0.950 [0.945, 0.955]; its real pattern is
    0.25 (mean L1 per query) from the ideal, so the test is informative), and the head's own average pattern recovers it
    all. Positional at offset -1 too."""
    verdicts = {(v.claim.label, v.claim.name): v for v in toy_table.attrs["verdicts"]}
    _, prev, _ = toy
    for layer, head in prev:
        verdict = verdicts[(f"L{layer}H{head}", "previous_token")]
        for kind in ("observational", "control_shuffled", "control_random_init", "necessity", "faithfulness",
                     "sufficiency"):
            assert verdict.get(kind).passed is True, (kind, verdict.get(kind).detail)
        assert verdict.verdict == "supported", verdict.reasons
        sufficiency = verdict.get("sufficiency")
        assert sufficiency.effect > 0.9 and sufficiency.ci_low > 0.8, sufficiency.detail
        assert sufficiency.extra["recovered_by_mean_pattern"] > 0.95
        positional = run_test_claims(toy[0], [hc.positional_head(layer, head, offset=-1)], toy_prompts(toy[0], 20))
        assert positional.loc[0, "verdict"] == "supported"


def test_toy_induction_false_claims_refuted(toy, toy_table):
    rows = toy_table.set_index(["label", "claim"])
    _, prev, induction = toy
    for layer, head in induction:
        label = f"L{layer}H{head}"
        assert rows.loc[(label, "previous_token"), "verdict"] == "refuted"
        # real induction is not copying from the repeat distance: refuted on shuffled tokens
        assert rows.loc[(label, "positional"), "verdict"] == "refuted"
    for layer, head in prev:
        label = f"L{layer}H{head}"
        assert rows.loc[(label, "induction"), "verdict"] == "refuted"
        assert rows.loc[(label, "first_token"), "verdict"] == "refuted"


@pytest.mark.parametrize("prefix_len", [7, 16, 25])
def test_toy_induction_holds_at_held_out_lengths(toy, prefix_len):
    """Lengths the model never trained on: induction still holds (a fixed-offset copier would not)."""
    model, _, induction = toy
    prompts = toy_prompts(model, prefix_len, n=32, seed=prefix_len)
    verdicts = evaluate_claims(model, [hc.induction_head(l, h) for l, h in induction], prompts,
                               evidence=["observational", "control_shuffled", "control_random_init", "necessity"])
    assert [v.verdict for v in verdicts] == ["supported"] * len(induction), [v.reasons for v in verdicts]


@pytest.mark.heavy
def test_toy_scan_finds_the_induction_heads(toy):
    """scan proposes on one half and tests on the other: the card's induction heads come out supported."""
    model, _, induction = toy
    table = hc.scan(model, toy_prompts(model, 20, n=64, seed=11), seed=0)
    supported = set(zip(table.loc[table["verdict"] == "supported", "label"], table.loc[table["verdict"] == "supported", "claim"]))
    for layer, head in induction:
        assert (f"L{layer}H{head}", "induction") in supported
    assert not any(claim == "induction" and label.startswith("L0") for label, claim in supported)


def test_the_package_lists_each_lazy_name_once_and_typed():
    """`interp.analyses.claims` imports its torch modules on first use: the names it loads lazily are
    exactly those it imports for type checkers, and each resolves to the object of its module."""
    import ast
    import importlib

    source = Path(hc.__file__).read_text()
    typed = {alias.asname or alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.If)
             and getattr(node.test, "id", None) == "TYPE_CHECKING" for sub in node.body for alias in sub.names}
    assert typed == set(hc._LAZY)
    for name, module in hc._LAZY.items():
        assert getattr(hc, name) is getattr(importlib.import_module(f"interp.analyses.claims.{module}"), name)
    assert hc.scan.__module__ == "interp.analyses.claims.scanning" and set(hc.__all__) <= set(dir(hc))
