"""interp.hook_attention: per-head hooks on models built from nn.MultiheadAttention, outputs unchanged."""
import copy

import pytest
import torch
from torch import nn

from interp.hooks import attention_sites, hooked, live_hooks
from interp.mha import HookedMultiheadAttention, hook_attention, unhook_attention

TOL = dict(atol=1e-6, rtol=1e-5)


def make_encoder(batch_first: bool, seed: int = 0) -> nn.TransformerEncoder:
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=batch_first)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()


class UserGPT(nn.Module):
    """A user's own small GPT written with nn.MultiheadAttention (pre-norm, causal mask)."""

    def __init__(self, d_vocab=50, d_model=24, n_heads=3, n_layers=2, n_ctx=16):
        super().__init__()
        self.embed = nn.Embedding(d_vocab, d_model)
        self.pos = nn.Embedding(n_ctx, d_model)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln": nn.LayerNorm(d_model),
            "attn": nn.MultiheadAttention(d_model, n_heads, batch_first=True),
            "mlp": nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)),
        }) for _ in range(n_layers))
        self.unembed = nn.Linear(d_model, d_vocab)

    def forward(self, tokens):
        n = tokens.shape[1]
        x = self.embed(tokens) + self.pos(torch.arange(n))
        causal = torch.ones(n, n, dtype=torch.bool).triu(1)  # True = not allowed
        for block in self.blocks:
            h = block["ln"](x)
            x = x + block["attn"](h, h, h, attn_mask=causal, need_weights=False)[0]
            x = x + block["mlp"](x)
        return self.unembed(x)


def inputs(batch_first: bool):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 32, generator=g)
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[0, 5:] = True  # left-aligned padding on the first sequence
    padding[2, 6:] = True
    return (x if batch_first else x.transpose(0, 1)), padding


def real(out, padding, batch_first):
    out = out if batch_first else out.transpose(0, 1)
    return out[~padding]


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("case", ["plain", "causal_float", "causal_bool", "padding", "padding_and_causal"])
def test_transformer_encoder_outputs_unchanged_and_undo_restores(batch_first, case):
    enc = make_encoder(batch_first)
    x, padding = inputs(batch_first)
    causal_float = nn.Transformer.generate_square_subsequent_mask(7)
    kwargs = {
        "plain": {},
        "causal_float": {"mask": causal_float, "is_causal": True},
        "causal_bool": {"mask": torch.ones(7, 7, dtype=torch.bool).triu(1)},
        "padding": {"src_key_padding_mask": padding},
        "padding_and_causal": {"mask": causal_float, "src_key_padding_mask": padding},
    }[case]
    state = copy.deepcopy(enc.state_dict())
    with torch.no_grad():
        before = enc(x, **kwargs)
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            before_slow = enc(x, **kwargs)  # torch's reference path, no nested tensors
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
        model = hook_attention(enc)
        assert model is enc and isinstance(enc, nn.TransformerEncoder)
        assert list(enc.state_dict()) == list(state)
        enc.load_state_dict(state)  # the state dict of the unhooked model still loads
        after = enc(x, **kwargs)
        watched, cache = enc.run_with_cache(x, **kwargs)  # hooks live: the explicit path runs
    for out in (after, watched):
        torch.testing.assert_close(out, before_slow, **TOL)
        # torch's nested-tensor path zero-fills padded outputs; real positions agree with it
        torch.testing.assert_close(real(out, padding, batch_first), real(before, padding, batch_first), **TOL)
    assert cache["layers.1.self_attn.hook_pattern"].shape == (3, 4, 7, 7)
    unhook_attention(enc)
    assert type(enc) is nn.TransformerEncoder
    assert type(enc.layers[0].self_attn) is nn.MultiheadAttention
    assert not hasattr(enc, "hook_dict") and enc.use_nested_tensor == batch_first
    with torch.no_grad():
        torch.testing.assert_close(enc(x, **kwargs), before, atol=0, rtol=0)


def test_hooks_have_module_path_names_and_shapes():
    enc = hook_attention(make_encoder(True))
    x, padding = inputs(True)
    mask = nn.Transformer.generate_square_subsequent_mask(7)
    _, cache = enc.run_with_cache(x, mask=mask, src_key_padding_mask=padding)
    expected = {"hook_q": (3, 7, 4, 8), "hook_k": (3, 7, 4, 8), "hook_v": (3, 7, 4, 8), "hook_attn_scores": (3, 4, 7, 7),
                "hook_pattern": (3, 4, 7, 7), "hook_z": (3, 7, 4, 8), "hook_result": (3, 7, 4, 32)}
    assert list(enc.hook_dict) == [f"layers.{l}.self_attn.{h}" for l in range(2) for h in expected]
    for layer in range(2):
        for hook, shape in expected.items():
            assert cache[f"layers.{layer}.self_attn.{hook}"].shape == shape
    scores = cache["layers.0.self_attn.hook_attn_scores"]
    assert torch.isneginf(scores[:, :, torch.ones(7, 7, dtype=torch.bool).triu(1)]).all()  # causal: -inf
    assert torch.isneginf(scores[0, :, :, 5:]).all()  # padded keys of sequence 0: -inf
    pattern = cache["layers.0.self_attn.hook_pattern"]
    torch.testing.assert_close(pattern, torch.softmax(scores, -1))
    assert (pattern[0, :, :, 5:] == 0).all()
    sites = attention_sites(enc)
    assert [s.module for s in sites] == ["layers.0.self_attn", "layers.1.self_attn"]
    assert sites[1].hook("pattern") == "layers.1.self_attn.hook_pattern" and sites[0].n_heads == 4 and sites[0].d_head == 8


def test_user_gpt_outputs_unchanged_edits_take_effect_and_undo():
    torch.manual_seed(0)
    model = UserGPT().eval()
    tokens = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        before = model(tokens)
        hook_attention(model)
        assert isinstance(model, UserGPT)
        after = model(tokens)
        cached, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(after, before, **TOL)
    torch.testing.assert_close(cached, before, **TOL)
    assert cache["blocks.1.attn.hook_pattern"].shape == (2, 3, 9, 9)
    # the heads' results sum, plus out_proj.bias, to the attention module's output
    attn = model.blocks[0]["attn"]
    res = cache["blocks.0.attn.hook_result"]
    assert res.shape == (2, 9, 3, 24)
    z = cache["blocks.0.attn.hook_z"]
    torch.testing.assert_close(
        res.sum(2) + attn.out_proj.bias, attn.out_proj(z.flatten(2)), **TOL
    )

    def zero_head(pattern, hook):
        pattern[:, 1] = 0.0
        return pattern

    with torch.no_grad():
        edited = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", zero_head)])
    assert (edited - before).abs().max() > 1e-3
    assert live_hooks(model) == []
    unhook_attention(model)
    assert type(model) is UserGPT and type(model.blocks[0]["attn"]) is nn.MultiheadAttention
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), before, atol=0, rtol=0)


def test_parameters_are_shared_not_copied():
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    hooked_mha = hook_attention(mha)
    assert isinstance(hooked_mha, HookedMultiheadAttention)
    assert hooked_mha.in_proj_weight is mha.in_proj_weight and hooked_mha.out_proj is mha.out_proj
    assert list(hooked_mha.state_dict()) == list(mha.state_dict())
    assert unhook_attention(hooked_mha) is mha


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize(
    "options",
    [{}, {"bias": False}, {"kdim": 5, "vdim": 7}, {"add_bias_kv": True}, {"add_zero_attn": True}],
    ids=["default", "no_bias", "kdim_vdim", "bias_kv", "zero_attn"],
)
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_multihead_attention_forward_equivalence(batch_first, options, need_weights, average):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(12, 3, batch_first=batch_first, **options).eval()
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 5, 12, generator=g)
    k = torch.randn(2, 6, options.get("kdim", 12), generator=g)
    v = torch.randn(2, 6, options.get("vdim", 12), generator=g)
    if not batch_first:
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    padding = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    attn_mask = torch.zeros(5, 6).masked_fill(torch.ones(5, 6, dtype=torch.bool).triu(2), float("-inf"))
    kwargs = dict(key_padding_mask=padding, attn_mask=attn_mask, need_weights=need_weights, average_attn_weights=average)
    with torch.no_grad():
        ref_out, ref_w = mha(q, k, v, **kwargs)
        out, w = hook_attention(mha)(q, k, v, **kwargs)
    torch.testing.assert_close(out, ref_out, **TOL)
    if need_weights:
        torch.testing.assert_close(w, ref_w, **TOL)
    else:
        assert w is None and ref_w is None


def test_unbatched_input_and_3d_mask():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2).eval()
    x = torch.randn(4, 8)  # (pos, embed_dim), no batch
    mask3 = torch.randn(2, 4, 4)  # (batch * head, query, key) float, added to the scores
    with torch.no_grad():
        ref = mha(x, x, x, attn_mask=mask3, average_attn_weights=False)
        got = hook_attention(mha)(x, x, x, attn_mask=mask3, average_attn_weights=False)
    torch.testing.assert_close(got[0], ref[0], **TOL)
    torch.testing.assert_close(got[1], ref[1], **TOL)


def test_is_causal_without_mask_is_refused_as_torch_does():
    mha = hook_attention(nn.MultiheadAttention(8, 2, batch_first=True))
    x = torch.randn(1, 3, 8)
    with pytest.raises(RuntimeError, match="Need attn_mask"):
        mha(x, x, x, is_causal=True)


def test_hook_that_raises_leaves_no_hook_attached():
    enc = hook_attention(make_encoder(True))
    x, _ = inputs(True)

    def boom(tensor, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        enc.run_with_hooks(x, fwd_hooks=[("layers.0.self_attn.hook_pattern", boom)])
    assert live_hooks(enc) == []
    with pytest.raises(RuntimeError, match="boom"):
        with hooked(enc, [("layers.1.self_attn.hook_q", boom)]):
            enc(x)
    assert live_hooks(enc) == []


def test_training_mode_gradients_reach_the_shared_parameters():
    torch.manual_seed(0)
    model = hook_attention(UserGPT()).train()
    tokens = torch.randint(0, 50, (2, 5))
    model(tokens).sum().backward()
    grad = model.blocks[0]["attn"].in_proj_weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="no torch.nn.MultiheadAttention"):
        hook_attention(nn.Linear(3, 3))
    with pytest.raises(TypeError, match="needs an nn.Module"):
        hook_attention("not a model")
    with pytest.raises(ValueError, match="no hooked attention"):
        unhook_attention(nn.Sequential(nn.Linear(2, 2)))


def test_hooking_twice_is_harmless():
    enc = make_encoder(True)
    hook_attention(enc)
    names = list(enc.hook_dict)
    hook_attention(enc)
    assert list(enc.hook_dict) == names


def test_deepcopy_of_a_hooked_model_keeps_hooks_and_shared_parameters():
    enc = hook_attention(make_encoder(True))
    twin = copy.deepcopy(enc)
    attn = twin.layers[0].self_attn
    assert attn.original.in_proj_weight is attn.in_proj_weight  # still shared inside the copy
    assert attn.in_proj_weight is not enc.layers[0].self_attn.in_proj_weight
    x, _ = inputs(True)
    _, cache = twin.run_with_cache(x)
    assert "layers.0.self_attn.hook_pattern" in cache
    unhook_attention(twin)
    assert type(twin.layers[0].self_attn) is nn.MultiheadAttention


@pytest.mark.parametrize("options", [{"add_zero_attn": True}, {"add_bias_kv": True}, {}])
def test_fast_and_explicit_paths_agree_with_is_causal_and_extra_keys(options):
    torch.manual_seed(0)
    mha = hook_attention(nn.MultiheadAttention(8, 2, batch_first=True, **options)).eval()
    x = torch.randn(2, 5, 8)
    mask = nn.Transformer.generate_square_subsequent_mask(5)
    with torch.no_grad():
        fast, _ = mha(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)
        with hooked(mha, [("hook_pattern", lambda t, hook: t)]):
            explicit, _ = mha(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)
    torch.testing.assert_close(fast, explicit, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kdim", [None, 5])
def test_in_weights_are_the_wrapped_modules_projections(kdim):
    mha = nn.MultiheadAttention(6, 2, kdim=kdim, vdim=kdim, batch_first=True)
    w_q, w_k, w_v = HookedMultiheadAttention(mha).in_weights()
    if kdim is None:  # packed: the thirds of in_proj_weight
        assert torch.equal(torch.cat([w_q, w_k, w_v]), mha.in_proj_weight)
    else:
        assert (w_q, w_k, w_v) == (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
        assert w_k.shape == (6, 5)


def test_hook_root_is_the_model_itself():
    from interp.sites import hook_root

    model = hook_attention(make_encoder(True))
    assert hook_root(model) is model and "layers.0.self_attn.hook_pattern" in hook_root(model).hook_dict


def test_reset_parameters_reinitialises_the_shared_parameters_as_torch_does():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    with torch.no_grad():
        for param in mha.parameters():
            param.fill_(0.5)
    hooked = HookedMultiheadAttention(mha)
    torch.manual_seed(1)
    hooked.reset_parameters()
    assert mha.in_proj_weight is hooked.in_proj_weight  # still shared with the wrapped module
    assert not hooked.in_proj_bias.any() and not hooked.out_proj.bias.any()
    assert float(hooked.in_proj_weight.detach().abs().max()) <= (6 / (8 + 24)) ** 0.5  # Xavier-uniform bound
    assert not torch.equal(hooked.in_proj_weight, torch.full_like(hooked.in_proj_weight, 0.5))
