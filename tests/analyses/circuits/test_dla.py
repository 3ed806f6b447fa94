"""Direct logit attribution (`interp.analyses.circuits.dla`): rows sum to the logit, known answers on the
constructed induction circuit, agreement with TransformerLens's residual decomposition on converted models."""
from __future__ import annotations

import pytest
import torch
from factories import CONSTRUCTED_VOCAB, induction_prompts

import interp
from interp.analyses.circuits import FROZEN_SCALE, direct_logit_attribution, logit_attributions
from interp.errors import BadInput
from interp.models.config import EncoderConfig
from interp.models.encoder import HookedEncoder


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
    prefix = torch.stack([torch.randperm(CONSTRUCTED_VOCAB - 1, generator=generator)[:10] for _ in range(6)])  # no repeats
    prompts = interp.data.PromptSet(torch.cat([torch.full((6, 1), CONSTRUCTED_VOCAB - 1), prefix, prefix], 1))
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
