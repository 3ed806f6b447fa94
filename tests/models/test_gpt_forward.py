"""The model owns its forward: resuming from a cached residual (`run_from`), each head's write
(`head_write`), the one masked next-token loss, and the one "can this forward stop early?" answer."""
import pytest
import torch

from interp.ablation import AblationEngine, resumable
from interp.behaviour import next_token_mask, next_token_weights
from interp.capture import can_stop_early, stop_after
from interp.data import PromptSet, random_tokens
from interp.errors import BadType
from interp.models import EncoderConfig, GPTConfig, HookedEncoder, HookedGPT
from interp.models.gpt import masked_next_token_loss, next_token_cross_entropy

SMALL = dict(n_layers=3, n_heads=4, d_model=32, d_vocab=40, n_ctx=64, seed=0)


def _randomised(model: torch.nn.Module) -> torch.nn.Module:
    """Non-trivial norms and biases (the default init leaves them at 1 and 0)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.split(".")[-1].startswith("W_"):
                param.add_(0.1 * torch.randn(param.shape, generator=generator))
    return model.eval()


@pytest.fixture(scope="module", params=["pre-norm", "post-norm", "parallel", "attn-only"])
def model(request):
    extra = {"pre-norm": {}, "post-norm": {"post_norm": True}, "parallel": {"parallel_attn_mlp": True},
             "attn-only": {"attn_only": True}}[request.param]
    return _randomised(HookedGPT(GPTConfig(**SMALL, **extra)))


def _padded(n: int = 4, n_pos: int = 12) -> PromptSet:
    prompts = random_tokens(n, n_pos, SMALL["d_vocab"], seed=3)
    mask = torch.ones_like(prompts.tokens)
    mask[0, :3] = 0  # left padding
    mask[1, 9:] = 0  # right padding
    return PromptSet(prompts.tokens, mask)


@pytest.mark.parametrize("padded", [False, True])
def test_run_from_resid_pre_equals_the_full_forward_at_every_layer(model, padded):
    prompts = _padded() if padded else random_tokens(4, 12, SMALL["d_vocab"], seed=3)
    mask = prompts.attention_mask
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        logits, cache = model.run_with_cache(prompts.tokens, attention_mask=mask, names_filter=names)
        for layer in range(model.cfg.n_layers):
            resumed = model.head(model.run_from(layer, cache[names[layer]], attention_mask=mask))
            torch.testing.assert_close(resumed, logits, atol=1e-5, rtol=1e-5)


def test_run_from_after_attention_only_where_the_model_says_it_is_exact(model):
    prompts = _padded()
    mask = prompts.attention_mask
    expect = not (model.cfg.post_norm or model.cfg.parallel_attn_mlp)
    assert model.resumable is expect and resumable(model) is expect
    if not expect:
        with pytest.raises(ValueError, match="cannot resume after its attention"):
            model.run_from(1, torch.zeros(4, 12, SMALL["d_model"]), after_attention=True)
        return
    names = [f"blocks.{layer}.hook_resid_mid" for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        final, cache = model.run_with_cache(prompts.tokens, attention_mask=mask, stop_at_layer=model.cfg.n_layers,
                                            names_filter=names)
        for layer in range(model.cfg.n_layers):
            resumed = model.run_from(layer, cache[names[layer]], attention_mask=mask, after_attention=True)
            torch.testing.assert_close(resumed, final, atol=1e-5, rtol=1e-5)
        stopped = model.run_from(0, cache[names[0]], attention_mask=mask, after_attention=True, stop_at_layer=2)
        torch.testing.assert_close(stopped, model(prompts.tokens, attention_mask=mask, stop_at_layer=2), atol=1e-5, rtol=1e-5)


def test_run_from_refuses_what_it_cannot_resume():
    model = HookedGPT(GPTConfig(**SMALL)).eval()
    resid = torch.zeros(2, 5, SMALL["d_model"])
    with pytest.raises(ValueError, match="expected 0 <= layer < stop_at_layer <= 3"):
        model.run_from(3, resid)
    with pytest.raises(ValueError, match=r"expected \(batch, pos, 32\)"):
        model.run_from(0, resid[..., :8])
    with pytest.raises(ValueError, match="attention_mask has shape"):
        model.run_from(0, resid, attention_mask=torch.ones(2, 4))


def test_the_ablation_engine_falls_back_to_the_hooked_forward_where_resuming_is_not_exact(model):
    prompts = random_tokens(6, 10, SMALL["d_vocab"], seed=1)
    sets = [[(0, 1)], [(1, 2)], [(0, 0), (2, 3)]]
    fast = AblationEngine(model, prompts, "mean", batch_size=3)
    slow = AblationEngine(model, prompts, "mean", batch_size=3, fast=False)
    assert fast.fast is model.resumable
    for got, want in zip(fast._losses(sets), slow._losses(sets)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_engines_fast_path_model_is_its_hooked_gpt():
    gpt = HookedGPT(GPTConfig(**SMALL))
    engine = AblationEngine(gpt, random_tokens(4, 8, SMALL["d_vocab"], seed=1), "zero", batch_size=2)
    assert engine.resumable_model is gpt
    engine.model = torch.nn.Linear(2, 2)  # a model the fast path cannot resume
    with pytest.raises(BadType, match="resuming needs a HookedGPT.*got Linear"):
        _ = engine.resumable_model  # the property raises


def test_head_writes_sum_to_the_attention_output_minus_its_bias(model):
    prompts = _padded()
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(model.cfg.n_layers)]
    names += [f"blocks.{layer}.hook_attn_out" for layer in range(model.cfg.n_layers)]
    names += [f"blocks.{layer}.attn.hook_result" for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(prompts.tokens, attention_mask=prompts.attention_mask, names_filter=names)
        for layer in range(model.cfg.n_layers):
            z = cache[f"blocks.{layer}.attn.hook_z"]  # (batch, pos, head, d_head)
            writes = torch.stack([model.head_write(layer, h, z[:, :, h]) for h in range(model.cfg.n_heads)], dim=2)
            torch.testing.assert_close(writes, cache[f"blocks.{layer}.attn.hook_result"], atol=1e-6, rtol=1e-5)
            attn_out = cache[f"blocks.{layer}.hook_attn_out"] - model.blocks[layer].attn.b_O
            torch.testing.assert_close(writes.sum(2), attn_out, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# the one masked next-token loss


def _old_masked_loss(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`interp.behaviour.masked_next_token_loss` as it was written before it moved to the model."""
    per = next_token_cross_entropy(logits, tokens)
    weights = mask.to(per.device, torch.float64)
    return ((per.double() * weights).sum(-1) / weights.sum(-1).clamp(min=1.0)).to(per.dtype)


def test_the_masked_next_token_loss_equals_the_old_one():
    model = _randomised(HookedGPT(GPTConfig(**SMALL)))
    prompts = _padded()
    mask = next_token_mask(prompts, "all")
    mask[2, :4] = False  # a prompt scored only from position 4
    with torch.no_grad():
        logits = model(prompts.tokens, attention_mask=prompts.attention_mask)
    loss = masked_next_token_loss(logits, prompts.tokens, mask)
    assert loss.shape == (4,)
    assert torch.equal(loss, _old_masked_loss(logits, prompts.tokens, mask))
    by_hand = torch.nn.functional.cross_entropy(logits[2, 4:-1], prompts.tokens[2, 5:])
    torch.testing.assert_close(loss[2], by_hand)
    nothing = torch.zeros_like(mask)
    assert torch.equal(masked_next_token_loss(logits, prompts.tokens, nothing), torch.zeros(4))


@pytest.mark.parametrize("chunk", [256, 5])
def test_the_fused_loss_from_the_residual_equals_the_masked_loss_on_the_logits(chunk):
    model = _randomised(HookedGPT(GPTConfig(**SMALL)))
    prompts = _padded()
    with torch.no_grad():
        resid = model(prompts.tokens, attention_mask=prompts.attention_mask, stop_at_layer=model.cfg.n_layers)
        fused = model.next_token_loss_from_resid(resid, prompts.tokens, next_token_weights(prompts, "all"), chunk=chunk)
        want = masked_next_token_loss(model.head(resid), prompts.tokens, next_token_mask(prompts, "all"))
    torch.testing.assert_close(fused, want, atol=1e-6, rtol=1e-6)


def test_an_encoders_logits_from_the_residual_go_through_its_mlm_head():
    encoder = _randomised(HookedEncoder(EncoderConfig(**SMALL, lm_head="mlm")))
    tokens = random_tokens(2, 8, SMALL["d_vocab"], seed=0).tokens
    with torch.no_grad():
        resid = encoder(tokens, stop_at_layer=encoder.cfg.n_layers)
        torch.testing.assert_close(encoder.head(resid), encoder(tokens))
        torch.testing.assert_close(encoder.logits_from_hidden(encoder.ln_final(resid)), encoder(tokens))


# ---------------------------------------------------------------------------------------------
# can the forward stop early?


class _Plain(torch.nn.Module):
    def forward(self, tokens):
        return tokens


class _Stoppable(torch.nn.Module):
    def forward(self, tokens, stop_at_layer=None):
        return tokens


def test_one_function_says_whether_a_forward_can_stop_early():
    gpt = HookedGPT(GPTConfig(**SMALL))
    assert can_stop_early(gpt) and can_stop_early(HookedEncoder(EncoderConfig(**SMALL)))
    assert can_stop_early(_Stoppable()) and not can_stop_early(_Plain())
    assert stop_after(gpt, [0, 2, 1]) == {"stop_at_layer": 3}
    assert stop_after(_Plain(), [1]) == {}


def test_resumed_ablations_of_an_mlm_encoder_read_the_logits_through_its_mlm_head():
    encoder = _randomised(HookedEncoder(EncoderConfig(**SMALL, lm_head="mlm")))
    prompts = random_tokens(6, 8, SMALL["d_vocab"], seed=2)
    sets = [[(0, 1)], [(1, 2), (2, 0)]]

    def loss_fn(logits, prompts):
        return logits[:, :, 0].mean(-1)

    fast = AblationEngine(encoder, prompts, "mean", behaviour=loss_fn, batch_size=3)
    assert fast.fast
    slow = AblationEngine(encoder, prompts, "mean", behaviour=loss_fn, batch_size=3, fast=False)
    for got, want in zip(fast._losses(sets), slow._losses(sets)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
