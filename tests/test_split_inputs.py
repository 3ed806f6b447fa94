"""Split q/k/v inputs (`blocks.{l}.hook_q_input` ...): watched, they leave the forward unchanged and
let an edit reach one head's query, key or value alone; unwatched, the block takes its usual path."""
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
        return HookedEncoder(EncoderConfig(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=16, seed=0)).eval()
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

    hooks = [(f"blocks.1.hook_{b}_input", record) for b in "qkv"]
    watched = model.run_with_hooks(TOKENS, fwd_hooks=hooks)
    torch.testing.assert_close(watched, plain, rtol=1e-5, atol=1e-5)
    n_kv = model.blocks[1].attn.n_kv_heads
    assert seen == {"blocks.1.hook_q_input": (3, 10, 4, 32), "blocks.1.hook_k_input": (3, 10, n_kv, 32),
                    "blocks.1.hook_v_input": (3, 10, n_kv, 32)}


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
    assert "blocks.0.hook_mlp_in" not in make("attn-only").hook_dict  # no MLP, no hook that never fires
