"""Circuits measured: direct logit attribution (`interp.analyses.circuits.dla`), composition scores
(`interp.analyses.circuits.composition`) and the constructed circuits whose edges are known
(`interp.models.constructed`: induction, V-composition, an unread head)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import interp
from interp.analyses.circuits import (
    FROZEN_SCALE,
    baseline,
    composition_scores,
    direct_logit_attribution,
    logit_attributions,
)
from interp.analyses.circuits import composition as composition_module
from interp.errors import BadInput
from interp.models import constructed
from interp.models.config import EncoderConfig, GPTConfig
from interp.models.encoder import HookedEncoder
from interp.models.gpt import HookedGPT
from interp.paths import EdgePatch, graph

D_VOCAB = 64  # the constructed models' default vocabulary; BOS is 63
N_DRAWS = 50  # baseline draws in the tests (the default 200 only narrows the baseline)


def induction_prompts(n: int = 16):
    return interp.data.repeated_tokens(n, 10, D_VOCAB - 1, bos=D_VOCAB - 1)


def period3_prompts(n: int = 16):
    return interp.data.repeated_tokens(n, 3, D_VOCAB - 1, bos=D_VOCAB - 1, n_repeats=6)


@pytest.fixture(scope="module")
def induction():
    return constructed.induction_circuit()


@pytest.fixture(scope="module")
def v_circuit():
    return constructed.v_composition_circuit()


@pytest.fixture(scope="module")
def unread():
    return constructed.unread_head_circuit()


@pytest.fixture(scope="module")
def toy():
    return interp.load("toy-induction")


def _random_gpt(normalization_type="LN", seed: int = 0, **overrides) -> HookedGPT:
    """A small random model whose norm gains and biases are random too, so every term of the maths matters."""
    cfg = GPTConfig(n_layers=3, n_heads=2, d_model=12, d_head=4, n_ctx=16, d_vocab=20, d_mlp=16,
                    normalization_type=normalization_type, seed=seed, **overrides)
    model = HookedGPT(cfg).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".w"):
                param.copy_(1 + 0.3 * torch.randn(param.shape, generator=generator))
            elif name.endswith((".b", "b_O", "b_out", "b_U", "b_Q", "b_K", "b_V", "b_in")):
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    return model


# ------------------------------------------------------------------------------ direct logit attribution


def _logits_by_hand(model, prompts, targets, weights):
    """(prompt,) the model's own logits of `targets` (prompt, pos), weighted over positions."""
    with torch.no_grad():
        logits = model(prompts.tokens, **prompts.model_kwargs()).double()
    picked = logits.gather(-1, targets[..., None])[..., 0]
    return (picked * weights).sum(-1)


def _next_token_targets(prompts, behaviour):
    weights = torch.zeros(prompts.tokens.shape, dtype=torch.float64)
    weights[:, :-1] = behaviour.target_weights(prompts).double()
    targets = torch.zeros_like(prompts.tokens)
    targets[:, :-1] = prompts.tokens[:, 1:]
    return targets, weights


def test_dla_rows_sum_to_the_clean_logit_on_toy_induction(toy):
    """Over the default target (next token, the repeated copies), each prompt's components sum to the logit
    the model's own forward gives, to float32 tolerance: the frozen scale makes the attribution exact."""
    prompts = interp.data.repeated_tokens(12, 20, toy.cfg.d_vocab, bos=toy.cfg.d_vocab - 1, seed=7)
    run = interp.Run(toy, prompts)
    result = logit_attributions(run)
    targets, weights = _next_token_targets(prompts, run.behaviour)
    by_hand = _logits_by_hand(toy, prompts, targets, weights)
    torch.testing.assert_close(result.logit, by_hand, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(result.values.sum(1), by_hand, atol=1e-4, rtol=1e-5)
    assert result.labels[0] == "embed" and "pos_embed" not in result.labels  # rotary: no position table
    assert result.labels[-2:] == ("bias", "readout_bias")
    assert len(result.labels) == 2 + toy.cfg.n_layers * toy.cfg.n_heads + 1  # embed, heads, bias, readout_bias


def test_dla_frame_has_the_tidy_columns_and_says_the_scale_is_frozen(toy):
    prompts = interp.data.repeated_tokens(8, 20, toy.cfg.d_vocab, bos=toy.cfg.d_vocab - 1, seed=7)
    frame = direct_logit_attribution(toy, prompts, batch_size=3)
    assert list(frame.columns) == ["component", "kind", "layer", "head", "mean", "ci_low", "ci_high", "share",
                                   "n_prompts", "unit"]
    assert (frame["unit"] == "logit").all() and (frame["n_prompts"] == 8).all()
    assert (frame["ci_low"] <= frame["mean"] + 1e-12).all() and (frame["mean"] <= frame["ci_high"] + 1e-12).all()
    assert frame.attrs["frozen_scale"] == FROZEN_SCALE and "frozen" in frame.attrs["frozen_scale"]
    assert frame["mean"].sum() == pytest.approx(frame.attrs["logit"], abs=1e-4)
    heads = frame[frame["kind"] == "head"]
    assert heads[["layer", "head"]].astype(int).values.tolist() == [[l, h] for l in range(2) for h in range(4)]
    assert frame.loc[frame["kind"] == "embed", "layer"].isna().all()  # not a layer: absent, not -1
    stream = frame[frame["kind"] != "readout_bias"]
    assert stream["share"].sum() == pytest.approx(1.0)


def test_dla_is_the_same_from_a_run_and_in_any_batch_size(toy):
    prompts = interp.data.repeated_tokens(7, 20, toy.cfg.d_vocab, bos=toy.cfg.d_vocab - 1, seed=3)
    whole = logit_attributions(interp.Run(toy, prompts, batch_size=16))
    pieces = logit_attributions(interp.Run(toy, prompts, batch_size=2))
    torch.testing.assert_close(whole.values, pieces.values, atol=1e-5, rtol=1e-5)
    run = interp.Run(toy, prompts)
    frame = direct_logit_attribution(run)
    assert frame.equals(direct_logit_attribution(run))  # memoised in the Run
    assert frame["mean"].tolist() == pytest.approx(direct_logit_attribution(toy, prompts)["mean"].tolist())


def test_dla_on_the_induction_circuit_puts_the_direct_effect_on_l1h0(induction):
    """Known answer: only L1H0 writes `out`, which W_U reads (logit 30 for the copied token), no norm, no
    biases: L1H0 carries the whole logit and every other row is exactly 0."""
    frame = direct_logit_attribution(induction, induction_prompts()).set_index("component")
    assert frame.loc["L1H0", "mean"] > 20  # 30 where the copy is unambiguous, split where the prefix repeats
    assert frame.loc["L1H0", "mean"] == pytest.approx(frame.attrs["logit"])
    assert frame.loc["L1H0", "share"] == pytest.approx(1.0)
    others = frame.drop(index="L1H0")
    assert others["mean"].abs().max() < 1e-9 and others["ci_high"].abs().max() < 1e-9
    for head in induction.metadata["dispensable_heads"] + ["L0H0"]:
        assert frame.loc[head, "mean"] == 0.0


def test_dla_answer_and_logit_difference_at_the_last_real_token(induction):
    """answer=: the copied token at the last position of a repeated prompt is known; the logit difference
    against any other real token is 30 (L1H0 writes only the answer's logit); left padding is skipped."""
    generator = torch.Generator().manual_seed(0)
    prefix = torch.stack([torch.randperm(D_VOCAB - 1, generator=generator)[:10] for _ in range(6)])  # no repeats
    prompts = interp.data.PromptSet(torch.cat([torch.full((6, 1), D_VOCAB - 1), prefix, prefix], 1))
    # the last token ends the second copy: the induction head attends to the token after its first occurrence,
    # the first of the prefix, and copies it with logit 30
    answer, wrong = prefix[:, 0], prefix[:, 1]
    single = logit_attributions(interp.Run(induction, prompts), answer=answer)
    diff = logit_attributions(interp.Run(induction, prompts), answer=answer, incorrect=wrong)
    head = single.labels.index("L1H0")
    torch.testing.assert_close(single.values[:, head], torch.full((6,), 30.0, dtype=torch.float64))
    torch.testing.assert_close(single.values.sum(1), single.logit)
    torch.testing.assert_close(diff.values.sum(1), diff.logit)
    torch.testing.assert_close(diff.values[:, head], single.values[:, head])  # W_U gives `wrong` nothing from L1H0
    mask = torch.cat([torch.zeros(6, 2), torch.ones(prompts.tokens.shape)], 1).long()
    padded = interp.data.PromptSet(torch.cat([torch.full((6, 2), 5), prompts.tokens], 1), attention_mask=mask)
    shifted = logit_attributions(interp.Run(induction, padded), answer=answer)
    torch.testing.assert_close(shifted.values, single.values)


def test_dla_refuses_bad_input(induction, toy):
    prompts = induction_prompts(4)
    with pytest.raises(BadInput, match=r"answer has shape \(3,\); expected \(4,\)"):
        direct_logit_attribution(induction, prompts, answer=[1, 2, 3])
    with pytest.raises(BadInput, match=r"answer\[1\] = 64 is outside the vocabulary \[0, 64\)"):
        direct_logit_attribution(induction, prompts, answer=[1, 64, 3, 4])
    with pytest.raises(BadInput, match="incorrect= needs answer="):
        direct_logit_attribution(induction, prompts, incorrect=3)
    with pytest.raises(BadInput, match="integer token ids"):
        direct_logit_attribution(induction, prompts, answer=torch.tensor([1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(BadInput, match="scores no next-token predictions.*pass answer="):
        direct_logit_attribution(induction, prompts, behaviour="embedding")
    tokens = interp.data.random_tokens(4, 5, 10)
    for options, message in ((dict(post_norm=True), "needs a pre-norm model"), (dict(lm_head="mlm"), "lm_head='mlm'")):
        encoder = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_vocab=10, n_ctx=8, **options))
        with pytest.raises(BadInput, match=message):
            direct_logit_attribution(encoder, tokens, answer=1)
    with pytest.raises(BadInput, match="a Run carries its prompts"):
        direct_logit_attribution(interp.Run(toy, prompts), batch_size=2)


def _converted(family: str):
    """A converted Hugging Face model with random weights (`factories.randomise`, as the conversion tests), offline."""
    transformers = pytest.importorskip("transformers")
    from interp.models.convert import convert_model
    from factories import randomise

    if family == "gpt2":  # LayerNorm with gain and bias, learned positions, MLP biases
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=24,
                                                                  n_layer=2, n_head=3))
    else:  # RMSNorm (no centring, no bias), rotary, gated MLP, grouped-query attention (6 query heads, 2 kv heads)
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=50, max_position_embeddings=32, hidden_size=48, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, intermediate_size=40, attention_bias=True))
    return convert_model(randomise(hf, 0)).eval()


@pytest.fixture(scope="module")
def gpt2():
    return _converted("gpt2")


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def converted(request, gpt2):
    return gpt2 if request.param == "gpt2" else _converted("llama")


def _tl_label(label: str) -> str:
    """TransformerLens's decomposition label for one of our rows ('MLP1' is its '1_mlp_out')."""
    return f"{label[3:]}_mlp_out" if label.startswith("MLP") else label


def test_dla_equals_transformer_lens_logit_attrs_on_converted_models(converted):
    """Every row, component for component, against `cache.logit_attrs` of TransformerLens's full residual
    decomposition (heads, MLP outputs, embed, pos_embed, bias), on a converted GPT-2 (a final LayerNorm
    with a real gain and bias) and a converted Llama (RMSNorm, grouped-query attention)."""
    gpt2 = converted
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 50, (6, 9), generator=generator)
    answer, wrong = torch.randint(0, 50, (6,), generator=generator), torch.randint(0, 50, (6,), generator=generator)
    prompts = interp.data.PromptSet(tokens)
    with torch.no_grad():
        _, cache = gpt2.run_with_cache(tokens)
    for incorrect in (None, wrong):
        result = logit_attributions(interp.Run(gpt2, prompts, batch_size=4), answer=answer, incorrect=incorrect)
        stack, labels = cache.get_full_resid_decomposition(pos_slice=-1, expand_neurons=False, return_labels=True)
        theirs = dict(zip(labels, cache.logit_attrs(stack, tokens=answer, incorrect_tokens=incorrect, pos_slice=-1)))
        ours = {_tl_label(label): result.values[:, i] for i, label in enumerate(result.labels)}
        assert set(ours) - {"readout_bias"} == set(theirs)
        for label, values in theirs.items():
            torch.testing.assert_close(ours[label], values.double(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(result.values.sum(1), result.logit, atol=1e-5, rtol=1e-5)
        ln_bias = getattr(gpt2.ln_final, "b", torch.zeros(gpt2.cfg.d_model))
        readout = gpt2.b_U[answer] + ln_bias @ gpt2.W_U[:, answer]
        if incorrect is not None:
            readout = readout - gpt2.b_U[wrong] - ln_bias @ gpt2.W_U[:, wrong]
        torch.testing.assert_close(ours["readout_bias"], readout.double().detach(), atol=1e-5, rtol=1e-5)


def test_dla_default_target_equals_transformer_lens_over_every_position(converted):
    """The default target (next token, every position for unstructured prompts): TransformerLens's per-position
    logit attributions of each next token, averaged over the scored positions."""
    gpt2 = converted
    tokens = torch.randint(0, 50, (5, 8), generator=torch.Generator().manual_seed(4))
    prompts = interp.data.PromptSet(tokens)
    run = interp.Run(gpt2, prompts)
    result = logit_attributions(run)
    with torch.no_grad():
        _, cache = gpt2.run_with_cache(tokens)
    stack, labels = cache.get_full_resid_decomposition(expand_neurons=False, return_labels=True)  # (c, batch, pos, d)
    targets, weights = _next_token_targets(prompts, run.behaviour)
    attrs = cache.logit_attrs(stack, tokens=targets)  # (component, batch, pos)
    theirs = dict(zip(labels, (attrs.double() * weights).sum(-1)))
    for i, label in enumerate(result.labels[:-1]):
        torch.testing.assert_close(result.values[:, i], theirs[_tl_label(label)], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.logit, _logits_by_hand(gpt2, prompts, targets, weights), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.values.sum(1), result.logit, atol=1e-5, rtol=1e-5)


def test_dla_head_row_is_its_write_through_the_clean_scale(gpt2):
    """By hand: a head's row is its cached write (`hook_result`), centred, divided by the clean run's cached
    final scale (`ln_final.hook_scale`), dotted with w * W_U[:, answer]."""
    tokens = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(5))
    prompts, answer = interp.data.PromptSet(tokens), tokens[:, 0]
    result = logit_attributions(interp.Run(gpt2, prompts), answer=answer)
    with torch.no_grad():
        _, cache = gpt2.run_with_cache(tokens)
    write = cache["blocks.1.attn.hook_result"][:, -1, 2]  # (batch, d_model): L1H2's write at the last position
    centred = write - write.mean(-1, keepdim=True)
    direction = gpt2.ln_final.w[:, None] * gpt2.W_U[:, answer]  # (d_model, batch)
    by_hand = (centred / cache["ln_final.hook_scale"][:, -1] * direction.T).sum(-1)
    torch.testing.assert_close(result.values[:, result.labels.index("L1H2")], by_hand.double(), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------ composition scores


def _nonzero(frame, tol: float = 1e-12):
    return sorted(f"{row.sender} -> {row.receiver} via {row.via}" for row in frame.itertuples() if row.score > tol)


def test_composition_on_the_induction_circuit_finds_only_the_k_edge(induction):
    frame = composition_scores(induction, n_draws=N_DRAWS)
    assert len(frame) == 4 * 4 * 3
    assert _nonzero(frame) == ["L0H0 -> L1H0 via k"]
    above = frame[frame["score"] > frame["baseline_p95"]]
    assert above[["sender", "receiver", "via"]].values.tolist() == [["L0H0", "L1H0", "k"]]
    assert (frame.loc[frame["score"] <= frame["baseline_p95"], "score"] == 0).all()
    # L0H0 maps tok to prev one-hot, L1H0's key reads prev against its query's tok: 63 aligned dimensions
    assert float(above["score"].iloc[0]) == pytest.approx(1 / math.sqrt(D_VOCAB - 1))


def test_composition_on_the_v_circuit_finds_only_the_v_edge(v_circuit):
    frame = composition_scores(v_circuit, n_draws=N_DRAWS)
    assert _nonzero(frame) == ["L0H0 -> L1H0 via v"]
    edge = frame[frame["score"] > 0].iloc[0]
    assert edge["score"] > edge["baseline_p95"] and edge["ratio"] > 2


def test_composition_the_unread_head_composes_with_nothing(unread):
    frame = composition_scores(unread, n_draws=N_DRAWS)
    assert (frame.loc[frame["sender"] == "L0H1", "score"] == 0).all() and (frame["sender"] == "L0H1").sum() == 2 * 3
    assert _nonzero(frame) == ["L0H0 -> L1H0 via k"]


def test_composition_is_invariant_to_rescaling_a_heads_weights():
    model = _random_gpt()
    before = composition_scores(model, n_draws=N_DRAWS)
    with torch.no_grad():
        model.blocks[0].attn.W_O[1] *= 8.0  # powers of two: the float32 weights scale exactly
        model.blocks[1].attn.W_V[0] *= 0.25
        model.blocks[2].attn.W_Q[1] *= 4.0
    after = composition_scores(model, n_draws=N_DRAWS)
    assert before["score"].tolist() == pytest.approx(after["score"].tolist(), rel=1e-9)
    assert before["score"].min() > 0  # random weights: every pair composes a little


def _brute_force(model: HookedGPT, sender, receiver, via: str) -> float:
    """The score from the d_model x d_model products themselves, the receiver's ln1 gain and centring folded in."""
    W_Q, W_K, W_V, W_O = (getattr(model, name).detach().double() for name in ("W_Q", "W_K", "W_V", "W_O"))
    d_model = W_Q.shape[2]
    ln1 = model.blocks[receiver[0]].ln1
    centre = torch.eye(d_model, dtype=torch.float64) - 1.0 / d_model
    norm = centre @ torch.diag(ln1.w.detach().double()) if hasattr(ln1, "b") else torch.diag(ln1.w.detach().double())
    ov_s = W_V[sender] @ W_O[sender]
    r = receiver
    reads = {"q": norm @ W_Q[r] @ (norm @ W_K[r]).T, "k": norm @ W_K[r] @ (norm @ W_Q[r]).T, "v": norm @ W_V[r] @ W_O[r]}
    return float((ov_s @ reads[via]).norm() / (ov_s.norm() * reads[via].norm()))


@pytest.mark.parametrize("normalization_type", ["LN", "RMS"])
def test_composition_matches_a_brute_force_computation(normalization_type):
    model = _random_gpt(normalization_type, seed=2)
    frame = composition_scores(model, n_draws=N_DRAWS)
    assert len(frame) == (2 * 2 + 4 * 2) * 3  # receivers in layers 1 and 2, senders in every earlier layer
    for row in frame.itertuples():
        expected = _brute_force(model, (row.sender_layer, row.sender_head), (row.receiver_layer, row.receiver_head), row.via)
        assert row.score == pytest.approx(expected, rel=1e-9), (row.sender, row.receiver, row.via)


def test_composition_folds_the_layernorm_centring():
    """A sender that writes only along the all-ones direction: a LayerNorm receiver removes it (score 0); an
    RMSNorm receiver, which does not centre, reads it."""
    for normalization_type, composes in (("LN", False), ("RMS", True)):
        model = _random_gpt(normalization_type, seed=3)
        with torch.no_grad():
            model.blocks[0].attn.W_O[0] = torch.randn(4, 1, generator=torch.Generator().manual_seed(0)).expand(4, 12)
        frame = composition_scores(model, n_draws=N_DRAWS)
        scores = frame.loc[frame["sender"] == "L0H0", "score"]
        assert (scores.max() > 1e-3) == composes, normalization_type
        if not composes:
            assert scores.max() < 1e-7


def test_baseline_is_about_one_over_sqrt_d_model_whatever_d_head():
    """The random baseline's order: 1 / sqrt(d_model), not sqrt(d_head / d_model) (see the module)."""
    for d_model, d_head in ((64, 8), (64, 32), (256, 16)):
        for via in ("q", "k", "v"):
            draws = baseline(d_model, d_head, via, n_draws=40)
            assert float(draws.mean()) == pytest.approx(1 / math.sqrt(d_model), rel=0.05), (d_model, d_head, via)
            assert float(draws.std()) < 0.25 * float(draws.mean())  # narrower as d_head grows
            assert float(draws.quantile(0.95)) < 0.5 * math.sqrt(d_head / d_model)
    first = baseline(32, 8, "k", n_draws=20)
    first[0] = 99.0  # a copy: the memo is not the caller's
    torch.testing.assert_close(baseline(32, 8, "k", n_draws=20), baseline(32, 8, "k", n_draws=20, seed=0))
    assert float(baseline(32, 8, "k", n_draws=20)[0]) != 99.0
    assert not torch.equal(baseline(32, 8, "k", n_draws=20), baseline(32, 8, "k", n_draws=20, seed=1))


def test_composition_refuses_bad_input(induction):
    with pytest.raises(BadInput, match="at least two layers"):
        composition_scores(constructed.single_head("previous_token", d_vocab=8, n_ctx=8))
    with pytest.raises(BadInput, match=r"via 'x'; expected some of \['q', 'k', 'v'\]"):
        composition_scores(induction, vias=("q", "x"))
    with pytest.raises(BadInput, match="has no W_Q"):
        composition_scores(nn.Linear(3, 3))
    with pytest.raises(BadInput, match="n_draws=1"):
        composition_scores(induction, n_draws=1)
    with pytest.raises(BadInput, match="via 'o'"):
        baseline(16, 4, "o")
    assert composition_module.N_DRAWS == 200


# ------------------------------------------------------------------------------ constructed circuits


@pytest.mark.parametrize("name, prompts", [("induction", induction_prompts), ("v_circuit", period3_prompts),
                                           ("unread", induction_prompts)])
def test_constructed_circuit_edges_are_exactly_those_a_path_patch_finds(name, prompts, request):
    """metadata["edges"] is exact: patching any listed edge (resampled sender) changes the loss by nats, every
    other edge of the graph by nothing."""
    model = request.getfixturevalue(name)
    run = interp.Run(model, prompts(12))
    edges = graph(model)
    effects = run.effects([EdgePatch((edge,)) for edge in edges])
    found = sorted(edge.label for edge, effect in zip(edges, effects) if abs(effect.mean) > 1e-4)
    assert found == sorted(model.metadata["edges"])
    assert min(effect.mean for edge, effect in zip(edges, effects) if edge.label in found) > 1.0
    assert max(abs(effect.mean) for edge, effect in zip(edges, effects) if edge.label not in found) < 1e-6


def test_v_composition_circuit_predicts_the_token_two_back(v_circuit):
    """Period-3 prompts: the second and later copies cost nothing; each essential head ablated alone (zero)
    costs ln(d_vocab - 1) there, each dispensable head nothing. Truth and metadata as the other builders."""
    assert v_circuit.truth == {"L0H0": "previous_token", "L0H1": "first_token", "L0H2": "self_token",
                               "L0H3": "uniform", "L1H0": "previous_token", "L1H1": "first_token",
                               "L1H2": "self_token", "L1H3": "uniform"}
    assert v_circuit.metadata["edges"] == ["embed -> L0H0 via v", "L0H0 -> L1H0 via v", "L1H0 -> logits"]
    run = interp.Run(v_circuit, period3_prompts(8))
    assert float(run.clean().max()) < 1e-6
    for head in v_circuit.metadata["essential_heads"]:
        assert run.effect(interp.HeadAblation(head, "zero")).mean == pytest.approx(math.log(D_VOCAB - 1), rel=1e-4)
    for head in v_circuit.metadata["dispensable_heads"]:
        assert abs(run.effect(interp.HeadAblation(head, "zero")).mean) < 1e-6
    # a single previous-token head would predict the token one back: wrong on period 3, so the model needs both


def test_unread_head_circuit_has_a_previous_token_decoy_that_nothing_reads(unread, induction):
    assert unread.truth == {"L0H0": "previous_token", "L0H1": "previous_token", "L1H0": "induction", "L1H1": "uniform"}
    assert unread.metadata["unread_heads"] == ["L0H1"] and unread.metadata["edges"] == induction.metadata["edges"]
    prompts = induction_prompts(8)
    with torch.no_grad():
        _, cache = unread.run_with_cache(prompts.tokens, names_filter="blocks.0.attn.hook_pattern")
    pattern = cache["blocks.0.attn.hook_pattern"]  # (batch, head, query, key)
    torch.testing.assert_close(pattern[:, 1], pattern[:, 0])  # the decoy's pattern is L0H0's
    run = interp.Run(unread, prompts)
    assert run.clean().tolist() == pytest.approx(interp.Run(induction, prompts).clean().tolist(), abs=1e-6)
    assert run.effect(interp.HeadAblation("L0H1", "zero")).mean == 0.0
    assert run.effect(interp.HeadAblation("L0H0", "zero")).mean > 1.0
    frame = direct_logit_attribution(run).set_index("component")
    assert frame.loc["L0H1", "mean"] == 0.0 and frame.loc["L1H0", "mean"] > 20
