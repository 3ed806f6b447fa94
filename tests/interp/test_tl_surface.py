"""interp.tl_surface (issue 36 item 9): TransformerLens's model surface on a user's own model hooked by interception.

Known answers: the stacked weights of a nanoGPT-style model reproduce its own hooks (q, result), and
`cache.logit_attrs` over a full split of the final residual stream sums to the logit; elsewhere the weights are
refused with an AttributeError saying why.
"""
import pytest
import torch
from own_models import NanoStyleGPT, encoder_lm, nanogpt_flash
from torch import nn

import interp
from interp.data import CharTokenizer


@pytest.fixture(scope="module")
def nano():
    return interp.load(nanogpt_flash())


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 61, (3, 12), generator=torch.Generator().manual_seed(0))


def test_cfg_holds_what_interception_observed(nano):
    cfg = nano.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.d_model, cfg.n_ctx, cfg.d_vocab) == (2, 4, 8, 32, 32, 61)
    assert cfg.model_name == "NanoStyleGPT" and cfg.device == torch.device("cpu") and cfg.dtype == torch.float32
    encoder = interp.load(encoder_lm())
    assert (encoder.cfg.n_layers, encoder.cfg.n_heads, encoder.cfg.d_model) == (2, 4, 32)
    with pytest.raises(AttributeError, match="normalization_type is not known for it"):
        _ = encoder.cfg.normalization_type


def test_a_models_own_cfg_is_left_alone():
    model = nanogpt_flash()
    model.cfg = {"mine": True}
    assert interp.load(model).cfg == {"mine": True}


def test_the_stacked_weights_reproduce_the_models_own_hooks(nano, tokens):
    """W_Q, b_Q from the fused c_attn give hook_q; W_O from c_proj gives hook_result (per head)."""
    _, cache = nano.run_with_cache(tokens)
    with torch.no_grad():
        embedded = nano.transformer.wte(tokens) + nano.transformer.wpe(torch.arange(tokens.shape[1]))
        x = nano.transformer.h[1].ln_1(nano.transformer.h[0](embedded))  # block 1's attention input
        q = torch.einsum("bpm,hmd->bphd", x, nano.W_Q[1]) + nano.b_Q[1]
        v = torch.einsum("bpm,hmd->bphd", x, nano.W_V[1]) + nano.b_V[1]
        result = torch.einsum("bphd,hdm->bphm", cache["blocks.1.attn.hook_z"], nano.W_O[1])
    torch.testing.assert_close(q, cache["blocks.1.attn.hook_q"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v, cache["blocks.1.attn.hook_v"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result, cache["blocks.1.attn.hook_result"], rtol=1e-5, atol=1e-5)
    assert nano.W_E.data_ptr() == nano.W_U.t().data_ptr()  # nanoGPT ties lm_head to wte
    assert nano.W_Q.shape == (2, 4, 32, 8) and nano.W_O.shape == (2, 4, 8, 32) and nano.W_pos.shape == (32, 32)


def test_logit_attrs_over_a_full_split_of_the_residual_sum_to_the_logit(nano, tokens):
    """Every head's result plus the rest of the final residual stream, attributed with cache.logit_attrs (which
    divides by ln_final.hook_scale), add up to the logit, less the final LayerNorm's bias term."""
    seen = {}
    handle = nano.transformer.ln_f.register_forward_pre_hook(lambda module, args: seen.update(resid=args[0]))
    try:
        logits, cache = nano.run_with_cache(tokens)
    finally:
        handle.remove()
    answer = tokens[:, -1]
    heads = cache.stack_head_results(layer=-1, pos_slice=-1)  # (head, batch, d_model)
    rest = seen["resid"][:, -1] - heads.sum(0)  # embeddings, attention biases, MLPs
    attrs = cache.logit_attrs(torch.cat([heads, rest[None]]), tokens=answer, pos_slice=-1)  # (component, batch)
    bias_term = nano.transformer.ln_f.bias @ nano.W_U[:, answer]
    torch.testing.assert_close(attrs.sum(0) + bias_term, logits[torch.arange(3), -1, answer], rtol=1e-4, atol=1e-4)


def test_weights_elsewhere_are_refused_saying_why():
    model = interp.load(encoder_lm())
    for name in ("W_Q", "W_U", "b_O"):
        with pytest.raises(AttributeError, match="read only from a nanoGPT / minGPT layout .* it is not laid out"):
            getattr(model, name)
    with pytest.raises(AttributeError, match="nanoGPT / minGPT layout"):
        model.tokens_to_residual_directions(3)
    with pytest.raises(AttributeError, match="no_such_thing"):  # other names: nn.Module's own error
        _ = model.no_such_thing


def test_the_token_methods_go_through_an_attached_tokenizer():
    def factory():
        model = nanogpt_flash()
        model.tokenizer = CharTokenizer("abcdefgh")
        return model

    model = interp.load(factory())
    assert model.to_str_tokens("abca") == ["a", "b", "c", "a"]
    padded = model.to_tokens(["ab", "abcd"])  # a causal model: right-padded with the tokenizer's pad id
    assert padded.tolist() == [[*model.tokenizer.encode("ab"), 0, 0], model.tokenizer.encode("abcd")]
    assert model.to_string(model.to_tokens("bad")) == ["bad"]


def test_unhooking_takes_the_surface_back():
    model = interp.load(nanogpt_flash())
    interp.unhook_sdpa(model)
    assert type(model) is NanoStyleGPT and not hasattr(model, "cfg")
    assert type(model.transformer.ln_f) is nn.LayerNorm and "hook_scale" not in model.transformer.ln_f._modules
