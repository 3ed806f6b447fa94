"""interp.hook_sdpa: per-head hooks on models that call scaled_dot_product_attention, outputs unchanged."""
import copy

import pytest
import torch
import torch.nn.functional as F
from own_models import DirectSDPA, NanoStyleGPT
from torch import nn

import interp
import interp.sdpa as sdpa
from interp.errors import BadInput, ModelError
from interp.hooks import attention_sites, live_hooks
from interp.sdpa import NoSDPACalls, hook_sdpa, sdpa_sites, unhook_sdpa
from interp.verify import verify_hooks

TOL = dict(atol=1e-5, rtol=1e-5)


def tokens(d_vocab=37, n_pos=12, batch=3, seed=1):
    return torch.randint(0, d_vocab, (batch, n_pos), generator=torch.Generator().manual_seed(seed))


def assert_verified(model, **kwargs):
    frame = verify_hooks(model, **kwargs)
    assert frame["passed"].all(), frame[~frame["passed"]].to_string()
    return frame


# --------------------------------------------------------------------------- the three cases


def test_nanogpt_flash_hooks_named_by_module_path():
    original = NanoStyleGPT(flash=True).eval()
    model = hook_sdpa(copy.deepcopy(original))
    sites = attention_sites(model)
    assert [s.module for s in sites] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    assert sites[0].hooks["pattern"] == "transformer.h.0.attn.hook_pattern"
    assert set(sites[0].hooks) == {"q", "k", "v", "attn_scores", "pattern", "z", "result"}
    assert all(s.causal is True and s.n_heads == 4 and s.d_head == 8 for s in sites)
    assert sites[0].output_module == "transformer.h.0.attn.c_proj"
    x = tokens(61, 20)
    assert torch.equal(model(x), original(x))  # no hook live: the model's own forward
    logits, cache = model.run_with_cache(x)
    assert torch.allclose(logits, original(x), **TOL)
    assert cache["transformer.h.1.attn.hook_pattern"].shape == (3, 4, 20, 20)
    assert cache["transformer.h.1.attn.hook_q"].shape == (3, 20, 4, 8)
    assert not live_hooks(model)
    assert_verified(model)


def test_direct_sdpa_call_with_bool_mask_and_scale():
    original = DirectSDPA().eval()
    model = hook_sdpa(copy.deepcopy(original))
    (site,) = attention_sites(model)
    assert site.module == "" and site.hooks["pattern"] == "hook_pattern" and site.scale == 0.3
    assert site.causal is True and site.output_module == "proj"
    x = tokens(37, 16)
    _, cache = model.run_with_cache(x)
    # known answer: the pattern computed by hand from the module's own weights
    h = model.embed(x) + model.pos_embed(torch.arange(16))
    q, k, _ = (t.unflatten(-1, (3, 8)) for t in model.qkv(h).chunk(3, dim=-1))  # (batch, pos, head, d_head)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * 0.3
    scores = scores.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(cache["hook_pattern"], scores.softmax(-1), **TOL)
    assert torch.allclose(cache["hook_attn_scores"], scores, **TOL)
    assert_verified(model)


@pytest.fixture(scope="module")
def gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=100, n_positions=32,
                                     bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    return transformers.GPT2LMHeadModel(config).eval()


def llama(**overrides):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32, intermediate_size=64,
        vocab_size=100, max_position_embeddings=32, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        **{"attn_implementation": "sdpa", **overrides},
    )
    return transformers.LlamaForCausalLM(config).eval()


def padding_mask():
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, :3] = 0  # left padding, as for generation
    return mask


def test_hf_gpt2_in_sdpa_mode(gpt2):
    model = interp.load(copy.deepcopy(gpt2), backend="sdpa")
    sites = attention_sites(model)
    assert [s.module for s in sites] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    assert sites[0].output_module == "transformer.h.0.attn.c_proj"  # a Conv1D, found by its input
    x = tokens(100, 10, batch=2)
    assert torch.equal(model(x).logits, gpt2(x).logits)
    out, _ = model.run_with_cache(x, attention_mask=padding_mask())
    expected = gpt2(x, attention_mask=padding_mask()).logits
    assert torch.allclose(out.logits[1], expected[1], **TOL) and torch.allclose(out.logits[0, 3:], expected[0, 3:], **TOL)
    assert_verified(model)
    assert_verified(model, tokens=x, attention_mask=padding_mask())


def test_hf_llama_grouped_query_attention():
    original = llama()
    model = hook_sdpa(copy.deepcopy(original))
    site = attention_sites(model)[0]
    assert site.module == "model.layers.0.self_attn" and site.n_heads == 4 and site.n_kv_heads == 2
    assert any("enable_gqa" in note for note in site.notes)
    x = tokens(100, 10, batch=2)
    _, cache = model.run_with_cache(x)
    assert cache["model.layers.0.self_attn.hook_k"].shape == (2, 10, 2, 8)  # what the call received
    assert cache["model.layers.0.self_attn.hook_q"].shape == (2, 10, 4, 8)
    assert_verified(model)


def test_hf_llama_repeat_kv_is_said():
    """With an attention mask, Hugging Face repeats k/v heads before the call: the hooks carry the repeated
    heads and the site's notes say so."""
    x, mask = tokens(100, 10, batch=2), padding_mask()
    original = llama()
    model = hook_sdpa(copy.deepcopy(original), example={"input_ids": x, "attention_mask": mask})
    site = sdpa_sites(model)["model.layers.0.self_attn"]
    assert site.kv_groups == 2 and site.n_kv_heads == 4
    assert any("repeat_kv" in note for note in attention_sites(model)[0].notes)
    out, cache = model.run_with_cache(x, attention_mask=mask)
    k = cache["model.layers.0.self_attn.hook_k"]  # (batch, pos, head, d_head)
    assert torch.equal(k[:, :, 0], k[:, :, 1]) and torch.equal(k[:, :, 2], k[:, :, 3])
    assert torch.allclose(out.logits[1], original(x, attention_mask=mask).logits[1], **TOL)
    assert_verified(model, tokens=x, attention_mask=mask)


# --------------------------------------------------------------------------- the explicit path against the kernel


class OneCall(nn.Module):
    """Calls SDPA on its inputs with fixed keyword arguments; `proj` takes the merged heads."""

    def __init__(self, **call):
        super().__init__()
        self.call = call

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **self.call)


def qkv(n_query=5, n_key=5, heads=4, kv_heads=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, heads, n_query, 8, generator=g), torch.randn(2, kv_heads, n_key, 8, generator=g),
            torch.randn(2, kv_heads, n_key, 6, generator=g))


def float_mask(n_query, n_key):
    mask = torch.randn(n_query, n_key, generator=torch.Generator().manual_seed(3))
    mask[0, 2:] = float("-inf")
    mask[1, 3] = torch.finfo(torch.float32).min
    return mask


CASES = {
    "plain": (dict(), dict()),
    "causal_square": (dict(is_causal=True), dict()),
    "causal_top_left": (dict(is_causal=True), dict(n_query=3, n_key=6)),
    "bool_mask_with_empty_row": (dict(attn_mask=torch.tensor([[True] * 5, [False] * 5, [True, False] * 2 + [True]] + [[True] * 5] * 2)), dict()),
    "float_mask": (dict(attn_mask=float_mask(5, 5)), dict()),
    "scale": (dict(scale=0.05), dict()),
    "gqa": (dict(enable_gqa=True, is_causal=True), dict(kv_heads=2)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_explicit_path_equals_kernel(case):
    call, shapes = CASES[case]
    inputs = qkv(**shapes)
    model = hook_sdpa(OneCall(**call), example=inputs)
    expected = F.scaled_dot_product_attention(*inputs, **call)
    assert torch.equal(model(*inputs), expected)
    watched = {}
    with model.hooks(fwd_hooks=[("hook_pattern", lambda t, hook: watched.setdefault("pattern", t))]):
        explicit = model(*inputs)
    assert torch.allclose(explicit, expected, **TOL), (explicit - expected).abs().max()
    assert watched["pattern"].shape[-2:] == (shapes.get("n_query", 5), shapes.get("n_key", 5))
    frame = verify_hooks(model, tokens=inputs)
    # an additive float mask shifts the finite scores away from q k^T: verify_hooks' documented limit
    skipped = {"hooks_present"} | ({"scores_qk"} if case == "float_mask" else set())
    assert frame[~frame.check.isin(skipped)]["passed"].all(), frame[~frame.passed].to_string()
    # no Linear takes the merged heads: hook_result is missing, and the check says why
    assert "hook_result unavailable" in frame.set_index("check").loc["hooks_present", "detail"]


def test_no_hook_live_runs_the_kernel_unintercepted(monkeypatch):
    model = hook_sdpa(DirectSDPA().eval())
    entered = []
    enter = sdpa._Interceptor.__enter__
    monkeypatch.setattr(sdpa._Interceptor, "__enter__", lambda self: entered.append(1) or enter(self))
    model(tokens())
    assert entered == []
    with model.hooks(fwd_hooks=[("hook_z", lambda t, hook: t)]):
        model(tokens())
    assert entered == [1]


def test_edits_take_effect_and_zeroing_a_head_removes_its_write():
    model = hook_sdpa(NanoStyleGPT().eval())
    x = tokens(61, 10)
    base = model(x)

    def zero_head(t, hook):
        t[:, :, 1] = 0.0
        return t

    with model.hooks(fwd_hooks=[("transformer.h.0.attn.hook_z", zero_head)]):
        ablated = model(x)
    results = {}
    with model.hooks(fwd_hooks=[("transformer.h.0.attn.hook_z", zero_head),
                                ("transformer.h.0.attn.hook_result", lambda t, hook: results.setdefault("r", t))]):
        model(x)
    assert not torch.allclose(base, ablated)
    assert results["r"][:, :, 1].abs().max() == 0  # the head writes nothing once its z is zero


def test_dropout_only_in_training_and_after_the_pattern():
    model = hook_sdpa(NanoStyleGPT(flash=True).eval())
    for module in model.modules():
        if hasattr(module, "dropout") and isinstance(module.dropout, float):
            module.dropout = 0.5
    x = tokens(61, 10)
    _, cache = model.run_with_cache(x)
    assert torch.allclose(cache["transformer.h.0.attn.hook_pattern"].sum(-1), torch.ones(3, 4, 10), **TOL)
    model.train()
    torch.manual_seed(0)
    _, train_cache = model.run_with_cache(x)
    pattern = train_cache["transformer.h.0.attn.hook_pattern"]
    assert torch.allclose(pattern.sum(-1), torch.ones(3, 4, 10), **TOL)  # before dropout, as the name says
    assert torch.allclose(pattern, cache["transformer.h.0.attn.hook_pattern"], **TOL)


# --------------------------------------------------------------------------- loading, undoing, errors


def test_load_auto_picks_interception_and_unhook_restores():
    original = NanoStyleGPT().eval()
    keys = list(original.state_dict())
    model = interp.load(original)
    assert sdpa.is_intercepted(model) and type(model).__name__ == "SDPAHookedNanoStyleGPT"
    assert isinstance(model, NanoStyleGPT) and list(model.state_dict()) == keys
    assert interp.hook_sdpa(model) is model  # twice is harmless
    unhook_sdpa(model)
    assert type(model) is NanoStyleGPT and not hasattr(model.transformer.h[0].attn, "hook_q")


def test_nanogpt_manual_path_is_recognised():
    """nanoGPT without flash computes softmax(q @ k^T * scale, masked) @ v by hand: the same hooks, verified."""
    original = NanoStyleGPT(flash=False).eval()
    model = hook_sdpa(copy.deepcopy(original))
    sites = attention_sites(model)
    assert [s.module for s in sites] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    assert sites[0].causal is True and sites[0].scale == pytest.approx(8 ** -0.5)
    assert any("by hand" in note for note in sites[0].notes)
    x = tokens(61, 20)
    assert torch.equal(model(x), original(x))
    logits, cache = model.run_with_cache(x)
    assert torch.allclose(logits, original(x), **TOL)
    flash = hook_sdpa(NanoStyleGPT(flash=True).eval())  # same seed, same weights
    _, flash_cache = flash.run_with_cache(x)
    for name in ("transformer.h.1.attn.hook_pattern", "transformer.h.1.attn.hook_z", "transformer.h.0.attn.hook_q"):
        assert torch.allclose(cache[name], flash_cache[name], **TOL)
    assert_verified(model)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_hf_eager_attention_is_recognised_with_its_finfo_min_mask_as_minus_inf(family, gpt2):
    """Hugging Face's eager path writes attention by hand, masking with finfo.min: hooked, the mask reads -inf."""
    if family == "gpt2":
        gpt2.config._attn_implementation = "eager"  # the fixture's weights, the hand-written path
        original = copy.deepcopy(gpt2)
        gpt2.config._attn_implementation = "sdpa"
    else:
        original = llama(attn_implementation="eager")
    model = interp.load(copy.deepcopy(original), backend="sdpa")
    site = attention_sites(model)[0]
    assert site.causal is True and site.scale == pytest.approx(8 ** -0.5) and any("by hand" in n for n in site.notes)
    x, mask = tokens(100, 10, batch=2), padding_mask()
    out, cache = model.run_with_cache(x, attention_mask=mask)
    expected = original(x, attention_mask=mask).logits
    assert torch.allclose(out.logits[1], expected[1], **TOL) and torch.allclose(out.logits[0, 3:], expected[0, 3:], **TOL)
    assert torch.isneginf(cache[site.hook("attn_scores")][1, :, 0, 1:]).all()
    assert_verified(model)
    assert_verified(model, tokens=x, attention_mask=mask)


def test_attention_neither_sdpa_nor_recognised_has_no_per_head_hooks():
    from own_models import EinsumAttentionLM

    with pytest.raises(BadInput, match="per-head hooks are unavailable.*black box"):  # interp.loading.NoHooks
        interp.load(EinsumAttentionLM().eval())
    with pytest.raises(NoSDPACalls):
        hook_sdpa(EinsumAttentionLM().eval())


class ThreeD(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.mixer = nn.Identity()

    def forward(self, x):
        h = self.embed(x)  # (batch, pos, d): no head axis
        return F.scaled_dot_product_attention(h, h, h)


class Twice(DirectSDPA):
    def forward(self, tokens):
        x = self.embed(tokens)[:, None]
        return F.scaled_dot_product_attention(F.scaled_dot_product_attention(x, x, x), x, x)


class FailsOnTokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, features):
        return self.proj(features)  # wants float features: token ids fail


def test_bad_models_get_clear_errors():
    with pytest.raises(BadInput, match="root module.*4-D \\(batch, head, pos, d_head\\)"):
        hook_sdpa(ThreeD())
    with pytest.raises(BadInput, match="more than once"):
        hook_sdpa(Twice())
    with pytest.raises(ModelError, match="FailsOnTokens.forward failed on the probe input.*example="):
        hook_sdpa(FailsOnTokens())
    with pytest.raises(BadInput, match="cannot tell the vocabulary"):
        hook_sdpa(nn.Sequential(nn.Linear(3, 3)))


def test_a_failing_hook_leaves_nothing_attached():
    model = hook_sdpa(NanoStyleGPT().eval())

    def boom(t, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks(fwd_hooks=[("transformer.h.1.attn.hook_pattern", boom)]):
            model(tokens(61, 6))
    assert not live_hooks(model)
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    assert torch.equal(model(tokens(61, 6)), model(tokens(61, 6)))


class TwoCandidateMatmuls(nn.Module):
    """Two (batch, head, q, d) @ (batch, head, d, k) products before one softmax: which one is q @ k^T is
    a guess, so the attention is not recognised (a wrong guess would hook the wrong tensors)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)

    def forward(self, x):
        h = self.embed(x).view(x.shape[0], x.shape[1], 2, 4).transpose(1, 2)  # (batch, head, pos, d_head)
        rotated = h @ torch.eye(4).expand(x.shape[0], 2, 4, 4)  # a per-head linear map, also 4-D @ 4-D
        pattern = torch.softmax(rotated @ h.transpose(-2, -1), dim=-1)
        return pattern @ h


def test_ambiguous_hand_written_attention_is_not_guessed():
    with pytest.raises(NoSDPACalls):
        hook_sdpa(TwoCandidateMatmuls())


@pytest.mark.parametrize("model_factory", [lambda: NanoStyleGPT(flash=True), lambda: NanoStyleGPT(flash=False), DirectSDPA])
def test_gradients_through_the_explicit_path_equal_the_kernels(model_factory):
    model = hook_sdpa(model_factory().eval())
    x = tokens(37, 10)
    grads = []
    for fwd_hooks in ([], [(site.hook("pattern"), lambda t, hook: t) for site in attention_sites(model)]):
        model.zero_grad()
        with model.hooks(fwd_hooks=fwd_hooks):
            model(x).logsumexp(-1).sum().backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    for name, grad in grads[0].items():
        assert torch.allclose(grads[1][name], grad, atol=1e-5, rtol=1e-4), name
