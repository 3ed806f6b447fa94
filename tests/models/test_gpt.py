"""HookedGPT and HookedEncoder: hook names and shapes, fast vs explicit path, masks, interop, bad input."""
import dataclasses

import pytest
import torch
from transformer_lens import ActivationCache, head_detector, patching

from interp.hooks import hooked, live_hooks
from interp.models import EncoderConfig, GPTConfig, HookedEncoder, HookedGPT

BATCH, POS = 3, 10


def tokens_for(model, batch=BATCH, pos=POS, seed=0):
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def layer_hooks(layer: int) -> list[str]:
    return [
        f"blocks.{layer}.ln1.hook_scale", f"blocks.{layer}.ln1.hook_normalized",
        f"blocks.{layer}.attn.hook_q", f"blocks.{layer}.attn.hook_k", f"blocks.{layer}.attn.hook_v",
        f"blocks.{layer}.attn.hook_attn_scores", f"blocks.{layer}.attn.hook_pattern",
        f"blocks.{layer}.attn.hook_z", f"blocks.{layer}.attn.hook_result",
        f"blocks.{layer}.attn.hook_q_input", f"blocks.{layer}.attn.hook_k_input", f"blocks.{layer}.attn.hook_v_input",
        f"blocks.{layer}.ln2.hook_scale", f"blocks.{layer}.ln2.hook_normalized",
        f"blocks.{layer}.mlp.hook_pre", f"blocks.{layer}.mlp.hook_post",
        f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.hook_attn_out", f"blocks.{layer}.hook_resid_mid",
        f"blocks.{layer}.hook_mlp_out", f"blocks.{layer}.hook_resid_post", f"blocks.{layer}.hook_mlp_in",
    ]


def test_ordered_hook_names_are_pinned(tiny_gpt):
    expected = ["hook_embed", "hook_pos_embed", *layer_hooks(0), *layer_hooks(1), "ln_final.hook_scale", "ln_final.hook_normalized"]
    assert list(tiny_gpt.hook_dict) == expected


@pytest.mark.parametrize("which", ["gpt", "encoder"])
def test_every_design_hook_exists_at_every_layer_with_its_shape(which, tiny_gpt, tiny_encoder):
    model = tiny_gpt if which == "gpt" else tiny_encoder
    cfg = model.cfg
    tokens = tokens_for(model)
    logits, cache = model.run_with_cache(tokens)
    assert isinstance(cache, ActivationCache)
    assert logits.shape == (BATCH, POS, cfg.d_vocab)
    resid = (BATCH, POS, cfg.d_model)
    assert cache["hook_embed"].shape == resid and cache["hook_pos_embed"].shape == resid
    shapes = {
        "hook_resid_pre": resid, "attn.hook_q": (BATCH, POS, cfg.n_heads, cfg.d_head),
        "attn.hook_k": (BATCH, POS, cfg.n_heads, cfg.d_head), "attn.hook_v": (BATCH, POS, cfg.n_heads, cfg.d_head),
        "attn.hook_attn_scores": (BATCH, cfg.n_heads, POS, POS), "attn.hook_pattern": (BATCH, cfg.n_heads, POS, POS),
        "attn.hook_z": (BATCH, POS, cfg.n_heads, cfg.d_head), "attn.hook_result": (BATCH, POS, cfg.n_heads, cfg.d_model),
        "hook_attn_out": resid, "hook_resid_post": resid,
    }
    for layer in range(cfg.n_layers):
        for name, shape in shapes.items():
            assert cache[f"blocks.{layer}.{name}"].shape == shape, name
        scores = cache[f"blocks.{layer}.attn.hook_attn_scores"]
        above = torch.ones(POS, POS, dtype=torch.bool).triu(1)
        # causal: -inf above the diagonal (never a finite minimum); bidirectional: nothing masked
        assert torch.isneginf(scores[..., above]).all() == cfg.causal
        assert torch.isfinite(scores[..., ~above]).all()
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_pattern"], torch.softmax(scores, -1))
        torch.testing.assert_close(
            cache[f"blocks.{layer}.attn.hook_result"].sum(2) + model.blocks[layer].attn.b_O,
            cache[f"blocks.{layer}.hook_attn_out"], atol=1e-6, rtol=1e-5,
        )


def _noop(tensor, hook):
    return tensor


CONFIGS = {
    "standard": dict(),
    "rotary": dict(positional_embedding_type="rotary"),
    "attn_only_no_ln": dict(attn_only=True, normalization_type=None),
    "relu_d_head_6": dict(act_fn="relu", d_head=6),
}


@pytest.mark.parametrize("kind", ["gpt", "encoder"])
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("padded", [False, True])
def test_fast_path_and_explicit_path_agree(kind, name, padded):
    config_class, model_class = (GPTConfig, HookedGPT) if kind == "gpt" else (EncoderConfig, HookedEncoder)
    model = model_class(config_class(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=32, seed=1, init_range=0.2,
                                     **CONFIGS[name])).eval()
    tokens = tokens_for(model)
    kwargs = {}
    if padded:
        mask = torch.ones(BATCH, POS, dtype=torch.long)
        mask[0, 7:] = 0  # right padding
        mask[1, :3] = 0  # left padding
        kwargs["attention_mask"] = mask
    with torch.no_grad():
        fast = model(tokens, **kwargs)
        assert not model.blocks[0].attn.explicit_needed()
        # a live hook on the pattern forces the explicit attention path, one on hook_normalized
        # the hand-written LayerNorm
        explicit = model.run_with_hooks(
            tokens, fwd_hooks=[(lambda n: n.endswith(("hook_pattern", "hook_normalized")), _noop)], **kwargs
        )
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("explicit", [False, True])
def test_encoder_padding_does_not_influence_real_positions(tiny_encoder, explicit):
    model = tiny_encoder
    real = tokens_for(model, batch=1, pos=6)
    hooks = [(lambda n: n.endswith("hook_pattern"), _noop)] if explicit else []
    with torch.no_grad():
        alone = model.run_with_hooks(real, fwd_hooks=hooks)
        for pad_tokens in ([0, 0, 0], [5, 17, 39]):
            right = torch.cat([real, torch.tensor([pad_tokens])], dim=1)
            left = torch.cat([torch.tensor([pad_tokens]), real], dim=1)
            mask_right = torch.tensor([[1] * 6 + [0] * 3])
            mask_left = torch.tensor([[0] * 3 + [1] * 6])
            out_right = model.run_with_hooks(right, attention_mask=mask_right, fwd_hooks=hooks)
            out_left = model.run_with_hooks(left, attention_mask=mask_left, fwd_hooks=hooks)
            torch.testing.assert_close(out_right[:, :6], alone, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out_left[:, 3:], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("which", ["gpt", "encoder"])
@pytest.mark.parametrize("explicit", [False, True])
def test_fully_masked_row_gives_no_nan(which, explicit, tiny_gpt, tiny_encoder):
    model = tiny_gpt if which == "gpt" else tiny_encoder
    tokens = tokens_for(model, batch=2, pos=5)
    mask = torch.tensor([[0, 0, 0, 0, 0], [1, 1, 1, 0, 0]])
    hooks = [(lambda n: n.endswith("hook_pattern"), _noop)] if explicit else []
    with torch.no_grad():
        out = model.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=hooks)
        _, cache = model.run_with_cache(tokens, attention_mask=mask)
    assert torch.isfinite(out).all()
    assert (cache["blocks.0.attn.hook_pattern"][0] == 0).all()  # a query with no key attends to nothing


def previous_token_model() -> HookedGPT:
    """L0H0 is constructed to attend to the previous token; the other heads are near uniform."""
    n_ctx, d_model = 8, 16
    model = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=d_model, n_ctx=n_ctx, d_vocab=20, attn_only=True,
                                normalization_type=None, seed=0)).eval()
    with torch.no_grad():
        model.embed.W_E.zero_()
        model.pos_embed.W_pos.copy_(torch.eye(n_ctx, d_model))  # position p -> e_p
        attn = model.blocks[0].attn
        attn.W_Q[0] = torch.eye(d_model, 8)  # q_p = e_p
        shift = torch.zeros(d_model, 8)
        for p in range(n_ctx - 1):
            shift[p, p + 1] = 30.0  # k_j = 30 e_{j+1}: q_p . k_j is large only for j = p - 1
        attn.W_K[0] = shift
    return model


def test_transformer_lens_detect_head_runs_and_finds_the_constructed_head():
    model = previous_token_model()
    tokens = torch.randint(0, 20, (1, 7), generator=torch.Generator().manual_seed(0))
    scores = head_detector.detect_head(model, tokens, "previous_token_head")
    assert scores.shape == (1, 2)
    # "mul" score: the share of attention on (query, query - 1); query 0 has no previous token,
    # so a perfect head scores 6/7 on 7 positions, and a uniform causal head sum_{p=1..6} 1/(p+1) / 7
    assert abs(scores[0, 0].item() - 6 / 7) < 0.01
    uniform = sum(1 / (p + 1) for p in range(1, 7)) / 7
    assert abs(scores[0, 1].item() - uniform) < 0.02


def test_transformer_lens_patching_runs_on_hooked_gpt(tiny_gpt):
    clean = tokens_for(tiny_gpt, batch=2, pos=6, seed=1)
    corrupted = tokens_for(tiny_gpt, batch=2, pos=6, seed=2)
    _, clean_cache = tiny_gpt.run_with_cache(clean)
    answer = clean[:, -1]

    def metric(logits):
        return logits[torch.arange(len(answer)), -2, answer].mean()

    with torch.no_grad():
        result = patching.get_act_patch_attn_head_out_all_pos(tiny_gpt, corrupted, clean_cache, metric)
        same = patching.get_act_patch_attn_head_out_all_pos(tiny_gpt, clean, clean_cache, metric)
        clean_metric = metric(tiny_gpt(clean))
    values = result if isinstance(result, torch.Tensor) else result.values  # a PatchingResult in some modes
    same_values = same if isinstance(same, torch.Tensor) else same.values
    assert values.shape == (2, 4)
    torch.testing.assert_close(same_values, torch.full((2, 4), clean_metric.item()), atol=1e-5, rtol=1e-5)
    assert (values - metric(tiny_gpt(corrupted))).abs().max() > 1e-6  # patching a head changes something


@pytest.mark.parametrize("overrides", [{}, {"positional_embedding_type": "rotary", "attn_only": True}, {"normalization_type": None, "act_fn": "relu"}])
def test_config_bridge_round_trip(overrides):
    cfg = GPTConfig(n_layers=3, n_heads=4, d_model=48, d_vocab=70, n_ctx=40, **overrides)
    bridge_cfg = cfg.to_bridge_config()
    assert (bridge_cfg.n_layers, bridge_cfg.n_heads, bridge_cfg.d_head, bridge_cfg.d_mlp) == (3, 4, 12, 192)
    back = GPTConfig.from_bridge_config(bridge_cfg)
    assert back == cfg


@pytest.mark.parametrize(
    "tokens,error,match",
    [
        (torch.tensor([[1, 2, 40]]), ValueError, "token id 40 is outside the vocabulary"),
        (torch.tensor([[-1, 2]]), ValueError, "token id -1 is outside the vocabulary"),
        (torch.zeros(1, 65, dtype=torch.long), ValueError, "exceeds the model's context n_ctx=64"),
        (torch.zeros(1, 0, dtype=torch.long), ValueError, "empty"),
        (torch.zeros(0, 4, dtype=torch.long), ValueError, "empty"),
        (torch.tensor([[1.0, 2.0]]), TypeError, "integer ids"),
        (torch.zeros(2, 3, 4, dtype=torch.long), ValueError, "rank 3"),
        ([[1, 2]], TypeError, "torch.LongTensor"),
    ],
)
def test_bad_tokens_get_clear_errors(tiny_gpt, tokens, error, match):
    with pytest.raises(error, match=match):
        tiny_gpt(tokens)


def test_unknown_hook_name_suggests_close_ones(tiny_gpt):
    with pytest.raises(KeyError, match=r"blocks\.0\.attn\.hook_pattern"):
        with hooked(tiny_gpt, [("blocks.0.attn.hook_patern", _noop)]):
            pass
    assert live_hooks(tiny_gpt) == []


def _boom(tensor, hook):
    raise RuntimeError("boom in hook")


def test_hook_that_raises_leaves_no_hook_attached_via_hooked(tiny_gpt):
    tokens = tokens_for(tiny_gpt)
    with pytest.raises(RuntimeError, match="boom in hook"):
        with hooked(tiny_gpt, [("blocks.1.attn.hook_pattern", _boom), ("blocks.0.hook_resid_post", _noop)]):
            tiny_gpt(tokens)
    assert live_hooks(tiny_gpt) == []
    assert not tiny_gpt.blocks[1].attn.explicit_needed()  # the fast path is back


def test_hook_that_raises_leaves_no_hook_attached_via_run_with_hooks(tiny_gpt):
    tokens = tokens_for(tiny_gpt)
    with pytest.raises(RuntimeError, match="boom in hook"):
        tiny_gpt.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_q", _boom)])
    assert live_hooks(tiny_gpt) == []
    with torch.no_grad():
        torch.testing.assert_close(tiny_gpt(tokens), tiny_gpt(tokens))


def test_config_is_frozen_and_validates():
    cfg = GPTConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.n_layers = 3
    with pytest.raises(ValueError, match="act_fn='tanh'"):
        GPTConfig(act_fn="tanh")


def test_constructor_overrides_build_the_layers_they_describe():
    model = HookedGPT(GPTConfig(n_layers=1, n_heads=2, d_model=16, d_vocab=30, n_ctx=8, seed=0), n_layers=3, n_ctx=32)
    assert model.cfg.n_layers == len(model.blocks) == 3
    assert model.pos_embed.W_pos.shape[0] == 32
    assert model(torch.zeros(1, 20, dtype=torch.long)).shape == (1, 20, 30)


def test_additive_float_masks_are_refused_not_reversed(tiny_gpt):
    tokens = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"\(mask == 0\)\.long\(\)"):
        tiny_gpt(tokens, attention_mask=torch.tensor([[float("-inf"), 0.0, 0.0, 0.0]]))


def test_forward_edge_inputs_are_refused(tiny_gpt, tiny_encoder):
    tokens = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        tiny_gpt(tokens[:, :1], return_type="loss")
    for bad in (-1, 7):
        with pytest.raises(ValueError, match=r"stop_at_layer"):
            tiny_gpt(tokens, stop_at_layer=bad)
    with pytest.raises(TypeError):
        tiny_encoder(tokens, bogus=1)


def test_fully_padded_rows_are_zero_but_nan_weights_still_show_on_the_padded_fast_path(tiny_encoder):
    tokens = torch.zeros(2, 5, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    assert torch.isfinite(tiny_encoder(tokens, attention_mask=mask)).all()
    broken = HookedEncoder(tiny_encoder.cfg).eval()
    broken.load_state_dict(tiny_encoder.state_dict())
    with torch.no_grad():
        broken.blocks[0].attn.W_V[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite weights .*blocks\.0\.attn\.W_V"):  # never silently zeroed
        broken(tokens, attention_mask=mask)
    broken.allow_non_finite_weights = True  # what verify_hooks sets to look at NaN hook by hook
    assert broken(tokens, attention_mask=mask)[0].isnan().any()


def test_nan_weights_never_give_finite_logits_on_the_fused_path(tiny_gpt):
    """Issue 11 #4: forward() ran the fused kernel, which skips masked keys, over NaN weights. Now every
    forward refuses them (cached by parameter versions, so the check costs one scan per edit)."""
    broken = HookedGPT(tiny_gpt.cfg).eval()
    broken.load_state_dict(tiny_gpt.state_dict())
    tokens = torch.randint(0, tiny_gpt.cfg.d_vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(broken(tokens)).all()
    with torch.no_grad():
        broken.embed.W_E[int(tokens[0, -1]), 0] = float("nan")  # reaches only the last position's value
    for run in (lambda: broken(tokens), lambda: broken.run_with_cache(tokens)):
        with pytest.raises(ValueError, match=r"non-finite weights .*embed\.W_E"):
            run()
    with torch.no_grad():
        broken.embed.W_E.nan_to_num_(0.0)
    assert torch.isfinite(broken(tokens)).all()  # the edit bumped the version: checked again, and passes
