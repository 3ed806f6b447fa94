"""`interp.intercepted`: the modules around an intercepted model's attention, found by a probe, and the
head -> layer patch (`LayerInputPatch`) as an `interp.Run` intervention."""
from __future__ import annotations

import pytest
import torch
from own_models import direct_sdpa, hf_gpt2, nanogpt_flash, nanogpt_manual

import interp
from interp.errors import BadInput
from interp.intercepted import LayerInputPatch, Norm, layout, norm_input, readout_module


@pytest.mark.parametrize("factory, backend", [(nanogpt_flash, "auto"), (nanogpt_manual, "auto"), (hf_gpt2, "sdpa")])
def test_layout_finds_the_final_norm_and_each_input_norm(factory, backend):
    model = interp.load(factory(), backend=backend)
    found = layout(model)
    assert found.readout == "lm_head"
    assert found.final_norm == Norm("transformer.ln_f", centres=True, eps=1e-5)
    assert {layer: norm.path for layer, norm in found.input_norms.items() if norm} == {
        0: "transformer.h.0.ln_1", 1: "transformer.h.1.ln_1"}
    assert found.final_unknown == "" and found.input_unknown == {}


def test_layout_of_a_model_without_norms_says_what_its_attention_reads():
    found = layout(interp.load(direct_sdpa()))
    assert found.readout == "unembed" and found.final_norm is None and found.final_unknown == ""
    assert found.input_unknown == {0: "the model itself"}


def test_an_rms_norm_is_recognised_and_its_frozen_formula_reproduces_it():
    model = nanogpt_flash()
    model.transformer.ln_f = torch.nn.RMSNorm(32, eps=1e-6)
    torch.nn.init.normal_(model.transformer.ln_f.weight)
    hooked = interp.load(model)
    norm = layout(hooked).final_norm
    assert norm == Norm("transformer.ln_f", centres=False, eps=1e-6)
    x = torch.randn(2, 3, 32)
    torch.testing.assert_close(norm.frozen(hooked, x, norm.scale(x)).float(), hooked.transformer.ln_f(x))


def test_norm_input_keeps_the_norms_input_and_removes_its_hook():
    model = interp.load(nanogpt_flash())
    norm = layout(model).final_norm
    tokens = torch.randint(0, 61, (2, 5))
    with norm_input(model, norm) as kept:
        model(tokens)
    assert kept["x"].shape == (2, 5, 32)
    assert not model.transformer.ln_f._forward_pre_hooks
    assert readout_module(model)[0] == "lm_head"


def test_layer_input_patch_is_a_run_intervention_with_its_own_spec():
    model = interp.load(nanogpt_flash())
    prompts = interp.data.repeated_tokens(6, 5, 61, bos=0, seed=3)
    patch = LayerInputPatch((0, 2), 1)
    assert patch.label == "L0H2 -> L1 (attention input)"
    assert patch.spec() == {"intervention": "layer_input_patch", "edges": ["L0H2 -> L1 (attention input)"],
                            "source": "resample"}
    run = interp.Run(model, prompts)
    effect = run.effect(patch)
    assert effect.values.shape == (6,) and effect.values.abs().max() > 0
    same = interp.Run(model, prompts).effect(LayerInputPatch((0, 2), 1, source=prompts))  # its own prompts: no change
    torch.testing.assert_close(same.values, torch.zeros(6, dtype=torch.float64), atol=1e-6, rtol=0)
    assert not model.transformer.h[1].ln_1._forward_pre_hooks


def test_layer_input_patch_refuses_a_model_with_nothing_to_patch():
    with pytest.raises(BadInput, match="writes only into later layers"):
        interp.Run(interp.load(direct_sdpa()), interp.data.repeated_tokens(4, 4, 37)).effect(LayerInputPatch((0, 0), 0))


def _post_norm_encoder():
    from own_models import EncoderLM

    model = EncoderLM()
    for layer in model.encoder.layers:
        layer.norm_first = False  # x = norm1(x + attn(x)): the stream is normalised between writers
    return model.eval()


def test_an_nn_multihead_attention_model_gives_all_three_and_a_post_norm_one_none():
    """EncoderLM (pre-norm nn.TransformerEncoder, hooked through nn.MultiheadAttention): DLA rows sum to its logit,
    QK terms to its score differences, the head -> layer patch runs. Its post-norm twin reads an earlier block's norm:
    each is refused, saying so."""
    from own_models import encoder_lm

    from interp.analyses import qk
    from interp.analyses.circuits import attention_input_patch, logit_attributions

    model = interp.load(encoder_lm())
    prompts = interp.data.repeated_tokens(8, 6, 53, bos=0, seed=1)
    dla = logit_attributions(interp.Run(model, prompts))
    torch.testing.assert_close(dla.values.sum(1), dla.logit, atol=1e-5, rtol=1e-6)
    attribution = qk.attribute(model, prompts, "L1H0")
    terms, keep = attribution.terms()
    torch.testing.assert_close(terms.sum((1, 2)), torch.tensor(attribution.pairs["difference"].to_numpy()[keep]),
                               atol=1e-5, rtol=0)
    assert attention_input_patch(model, prompts, sender="L0H0", layer=1)["effect"].notna().all()
    post = interp.load(_post_norm_encoder())
    assert layout(post).post_norm and layout(post).input_norms[1] is None
    for call in (lambda: logit_attributions(interp.Run(post, prompts)), lambda: qk.attribute(post, prompts, "L1H0"),
                 lambda: attention_input_patch(post, prompts, sender="L0H0", layer=1)):
        with pytest.raises(BadInput, match="post-norm") as info:
            call()
        assert "direct logit attribution per head" not in str(info.value)  # it is refused here too
    interp.Run(post, prompts).effect(interp.HeadAblation([(1, 0)]))  # what the refusals name runs


def test_projections_are_read_from_the_live_weights():
    """Where the maps are is memoised, not their values: a weight edited after the first call is seen by the next."""
    from own_models import encoder_lm

    from interp.intercepted import projections

    model = interp.load(nanogpt_flash())
    before = projections(model)[1]["k"][0].clone()
    with torch.no_grad():
        model.transformer.h[1].attn.c_attn.weight[32:40] *= 2  # layer 1's key rows of head 0
    after = projections(model)[1]["k"][0]
    torch.testing.assert_close(after[0], 2 * before[0])
    torch.testing.assert_close(after[1:], before[1:])
    mha = interp.load(encoder_lm())
    W_q, b_q = projections(mha)[0]["q"]
    assert W_q.shape == (4, 32, 8) and b_q.shape == (4, 8)
