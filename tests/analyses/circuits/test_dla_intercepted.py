"""Direct logit attribution per head on users' own models hooked by interception: the same numbers as on the
converted HookedGPT of the same weights, rows that sum to the model's own logit, refusals that say what works."""
from __future__ import annotations

import pytest
import torch
from own_models import direct_sdpa, hf_gpt2, nanogpt_flash, rotary_gpt_trained
from torch import nn

import interp
from interp.analyses.circuits import direct_logit_attribution, logit_attributions
from interp.errors import BadInput


@pytest.fixture(scope="module")
def rotary():
    return interp.load(rotary_gpt_trained())


def test_per_head_dla_of_a_users_rotary_fork_equals_the_converted_models(rotary, toy):
    """RotaryGPT carries toy-induction's weights in a user's layout: each head's DLA, the output biases' and the
    readout's rows equal HookedGPT's to 1e-4 (the embedding is the intercepted model's `rest`), CIs included."""
    prompts = interp.data.repeated_tokens(12, 8, 256, bos=0, seed=3)
    own = direct_logit_attribution(rotary, prompts).set_index("component")
    ref = direct_logit_attribution(toy, prompts).set_index("component")
    heads = [c for c in ref.index if c.startswith("L")]
    assert list(own.index) == ["rest", *heads, "bias", "readout_bias"]
    for column in ("mean", "ci_low", "ci_high"):
        torch.testing.assert_close(torch.tensor(own.loc[heads, column].to_numpy()),
                                   torch.tensor(ref.loc[heads, column].to_numpy()), atol=1e-4, rtol=0)
    for own_row, ref_row in (("rest", "embed"), ("bias", "bias"), ("readout_bias", "readout_bias")):
        assert own.loc[own_row, "mean"] == pytest.approx(ref.loc[ref_row, "mean"], abs=1e-4)
    assert own.loc["L1H3", "mean"] > 1.0  # the induction heads write the repeated token's logit


@pytest.mark.parametrize("factory", [nanogpt_flash, direct_sdpa])
def test_intercepted_rows_sum_to_the_models_own_logit(factory):
    """Per prompt, the rows sum to the logit the model's own forward gives (final norm frozen, or none at all),
    with answer= and incorrect= too."""
    model = interp.load(factory())
    d_vocab = interp.modelinfo.vocab_size(model)
    prompts = interp.data.repeated_tokens(6, 5, d_vocab, bos=0, seed=2)
    result = logit_attributions(interp.Run(model, prompts), answer=3, incorrect=4)
    torch.testing.assert_close(result.values.sum(1), result.logit, atol=1e-5, rtol=1e-6)
    with torch.no_grad():
        logits = model(prompts.tokens).double()[:, -1]
    torch.testing.assert_close(result.logit, logits[:, 3] - logits[:, 4], atol=1e-5, rtol=1e-6)


def test_hugging_face_model_under_sdpa_interception_matches_its_conversion():
    """A GPT-2 loaded with backend='sdpa' (intercepted) and converted (HookedGPT): the same per-head DLA."""
    own, converted = interp.load(hf_gpt2(), backend="sdpa"), interp.load(hf_gpt2())
    prompts = interp.data.repeated_tokens(6, 6, 100, bos=0, seed=4)
    own_frame = direct_logit_attribution(own, prompts).set_index("component")
    ref_frame = direct_logit_attribution(converted, prompts).set_index("component")
    heads = [c for c in ref_frame.index if c.startswith("L")]
    torch.testing.assert_close(torch.tensor(own_frame.loc[heads, "mean"].to_numpy()),
                               torch.tensor(ref_frame.loc[heads, "mean"].to_numpy()), atol=1e-4, rtol=0)


class _OddNorm(nn.Module):
    """A norm of the user's own (not LayerNorm, not RMSNorm): its scale cannot be frozen."""

    def forward(self, x):
        return torch.tanh(x)


def test_an_unknown_final_norm_is_refused_with_what_works_instead():
    model = nanogpt_flash()
    model.transformer.ln_f = _OddNorm()
    hooked = interp.load(model)
    prompts = interp.data.repeated_tokens(4, 4, 61, bos=0)
    with pytest.raises(BadInput, match="reads the output of transformer.ln_f \\(_OddNorm\\)") as info:
        direct_logit_attribution(hooked, prompts)
    assert "head ablations (interp.Run)" in str(info.value)
    interp.Run(hooked, prompts).effect(interp.HeadAblation([(0, 0)]))  # what the advice names runs
