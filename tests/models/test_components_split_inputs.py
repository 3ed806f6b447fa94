"""Split q/k/v inputs (`blocks.{l}.attn.hook_q_input` ..., aliased `blocks.{l}.hook_q_input`): watched, they
leave the forward unchanged and let an edit reach one head's query, key or value alone; unwatched, the block
takes its usual path."""
import pytest
import torch

from interp.models import EncoderConfig, GPTConfig, HookedEncoder, HookedGPT

CONFIGS = {
    "pre-norm": dict(),
    "rotary": dict(positional_embedding_type="rotary"),
    "grouped": dict(n_key_value_heads=2, normalization_type="RMS", positional_embedding_type="rotary"),
    "parallel": dict(parallel_attn_mlp=True),
    "attn-only": dict(attn_only=True),
}


def make(kind: str):
    if kind == "post-norm":
        return HookedEncoder(EncoderConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=16, seed=0, post_norm=True)).eval()
    return HookedGPT(GPTConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=16, seed=0, **CONFIGS[kind])).eval()


TOKENS = torch.randint(0, 40, (3, 10), generator=torch.Generator().manual_seed(0))
KINDS = [*CONFIGS, "post-norm"]


@pytest.mark.parametrize("kind", KINDS)
def test_watched_split_inputs_leave_the_output_unchanged(kind):
    model = make(kind)
    plain = model(TOKENS)
    seen: dict[str, tuple[int, ...]] = {}

    def record(act, hook):
        seen[hook.name] = tuple(act.shape)

    hooks = [(f"blocks.1.hook_{b}_input", record) for b in "qkv"]  # the block-level aliases
    watched = model.run_with_hooks(TOKENS, fwd_hooks=hooks)
    torch.testing.assert_close(watched, plain, rtol=1e-5, atol=1e-5)
    n_kv = model.blocks[1].attn.n_kv_heads
    assert seen == {"blocks.1.attn.hook_q_input": (3, 10, 4, 32), "blocks.1.attn.hook_k_input": (3, 10, n_kv, 32),
                    "blocks.1.attn.hook_v_input": (3, 10, n_kv, 32)}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("branch", "qkv")
def test_an_edit_of_one_heads_input_reaches_that_head_alone(kind, branch):
    model = make(kind)
    _, clean = model.run_with_cache(TOKENS, names_filter=["blocks.1.attn.hook_q", "blocks.1.attn.hook_k",
                                                           "blocks.1.attn.hook_v"])
    noise = torch.randn(3, 10, 32, generator=torch.Generator().manual_seed(1))

    def edit(act, hook):  # (batch, pos, head, d_model)
        act[:, :, 1] += noise
        return act

    with model.hooks(fwd_hooks=[(f"blocks.1.hook_{branch}_input", edit)]):
        _, edited = model.run_with_cache(TOKENS, names_filter=["blocks.1.attn.hook_q", "blocks.1.attn.hook_k",
                                                                "blocks.1.attn.hook_v"])
    for other in "qkv":
        before, after = clean[f"blocks.1.attn.hook_{other}"], edited[f"blocks.1.attn.hook_{other}"]
        changed = [h for h in range(before.shape[2]) if not torch.allclose(before[:, :, h], after[:, :, h], atol=1e-6)]
        assert changed == ([1] if other == branch else [])


def test_split_inputs_are_cached_only_when_named(tiny_gpt):
    _, everything = tiny_gpt.run_with_cache(TOKENS)
    assert not any(name.endswith(("q_input", "k_input", "v_input")) for name in everything.keys())
    _, named = tiny_gpt.run_with_cache(TOKENS, names_filter=["blocks.0.hook_k_input"])
    assert named["blocks.0.hook_k_input"].shape == (3, 10, 4, 32)
    torch.testing.assert_close(named["blocks.0.hook_k_input"][:, :, 2], everything["blocks.0.hook_resid_pre"])


def test_mlp_in_is_what_the_mlp_reads(tiny_gpt):
    _, cache = tiny_gpt.run_with_cache(TOKENS, names_filter=["blocks.0.hook_mlp_in", "blocks.0.hook_resid_mid"])
    torch.testing.assert_close(cache["blocks.0.hook_mlp_in"], cache["blocks.0.hook_resid_mid"])


def test_attention_only_mlp_in_fires_when_watched_and_passes_a_zero_gradient():
    """No MLP reads it, but it fires (as hook_mlp_out does) and a gradient reaches it: zero."""
    model = make("attn-only")
    _, cache = model.run_with_cache(TOKENS, names_filter=["blocks.0.hook_mlp_in", "blocks.0.hook_resid_mid"])
    torch.testing.assert_close(cache["blocks.0.hook_mlp_in"], cache["blocks.0.hook_resid_mid"])
    grads = {}

    def keep(grad, hook):
        grads[hook.name] = grad

    with model.hooks(bwd_hooks=[("blocks.0.hook_mlp_in", keep), ("blocks.0.hook_mlp_out", keep)]):
        model(TOKENS)[:, -1, 3].sum().backward()
    assert torch.count_nonzero(grads["blocks.0.hook_mlp_in"]) == 0
    assert torch.count_nonzero(grads["blocks.0.hook_mlp_out"]) > 0  # d logit / d resid_post
    torch.testing.assert_close(model(TOKENS), make("attn-only")(TOKENS))
    with model.hooks(fwd_hooks=[("blocks.0.hook_mlp_in", lambda act, hook: torch.full_like(act, float("inf")))]):
        _, edited = model.run_with_cache(TOKENS, names_filter=["blocks.0.hook_mlp_out"])
    assert torch.count_nonzero(edited["blocks.0.hook_mlp_out"]) == 0  # zeros even from a non-finite stream


def test_block_level_names_are_aliases_of_the_attention_level_split_inputs(tiny_gpt):
    for branch in "qkv":
        own = f"blocks.1.attn.hook_{branch}_input"
        assert tiny_gpt.mod_dict[f"blocks.1.hook_{branch}_input"] is tiny_gpt.hook_dict[own]
        assert f"blocks.1.hook_{branch}_input" not in tiny_gpt.hook_dict  # each point once in hook_dict
        assert getattr(tiny_gpt.blocks[1], f"hook_{branch}_input") is tiny_gpt.hook_dict[own]  # the attribute too
    tiny_gpt.setup()  # set up again (as after swapping a hook point): the aliases stay
    assert tiny_gpt.mod_dict["blocks.0.hook_q_input"] is tiny_gpt.blocks[0].attn.hook_q_input


def test_transformer_lens_switches(tiny_gpt):
    """use_split_qkv_input adds the split inputs to an unfiltered cache; result and mlp_in are always on;
    post-norm models refuse the split switch (a head's write reaches later heads through a norm)."""
    model = make("pre-norm")
    assert model.cfg.use_attn_result and model.cfg.use_hook_mlp_in and not model.cfg.use_split_qkv_input
    model.set_use_split_qkv_input(True)
    _, cache = model.run_with_cache(TOKENS)
    assert set(cache.keys()) == set(model.hook_dict)
    model.set_use_split_qkv_input(False)
    _, cache = model.run_with_cache(TOKENS)
    assert not any(name.endswith("_input") for name in cache.keys())
    assert not tiny_gpt.cfg.use_split_qkv_input  # a runtime switch of one model's config, not a class default
    model.set_use_attn_result(True)
    model.set_use_hook_mlp_in(True)
    with pytest.raises(ValueError, match="nothing to switch off"):
        model.set_use_attn_result(False)
    with pytest.raises(ValueError, match="post-norm"):
        post_norm = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_vocab=10, post_norm=True))
        post_norm.set_use_split_qkv_input(True)
    assert "use_split_qkv_input" not in model.cfg.to_dict()  # runtime state is never saved
