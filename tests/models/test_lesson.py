"""The seed lesson's worked examples, reproduced through the toolkit's hooks.

The lesson writes attention by hand (q, k, v projections; scores = q k^T / sqrt(d); causal
mask with -inf; softmax; weights @ values). Here the same numbers come out of the hooks of
HookedGPT / HookedEncoder (one head, width 6, d_head 3) and of a hooked nn.MultiheadAttention.
"""
import math

import pytest
import torch
from torch import nn

from interp.mha import hook_attention
from interp.models import EncoderConfig, GPTConfig, HookedEncoder, HookedGPT


def lesson_model(causal: bool, n_ctx: int = 8) -> nn.Module:
    """One attention-only layer, one head, d_model 6, d_head 3, no norm, no position embedding."""
    common = dict(n_layers=1, n_heads=1, d_model=6, d_head=3, d_vocab=10, n_ctx=n_ctx, attn_only=True,
                  normalization_type=None, seed=0)
    model = HookedGPT(GPTConfig(**common)) if causal else HookedEncoder(EncoderConfig(**common))
    with torch.no_grad():
        model.pos_embed.W_pos.zero_()
    return model.eval()


def run_on_embeddings(model, x: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    """Feed x (batch, pos, d_model) as the residual stream by replacing the token embedding."""
    cache = {}

    def put_x(embed, hook):
        return x

    def keep(tensor, hook):
        cache[hook.name] = tensor.detach().clone()

    tokens = torch.zeros(x.shape[:2], dtype=torch.long)
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[("hook_embed", put_x)] + [(n, keep) for n in names])
    return cache


def test_weights_075_025_over_values_4_0_and_0_8_give_3_2():
    """Weights [0.75, 0.25] over values [4, 0] and [0, 8] give the context [3, 2]."""
    mha = nn.MultiheadAttention(embed_dim=2, num_heads=1, bias=False, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([torch.eye(2)] * 3))  # q = k = v = x
        mha.out_proj.weight.copy_(torch.eye(2))
    hooked = hook_attention(mha)
    values = torch.tensor([[[4.0, 0.0], [0.0, 8.0]]])  # (batch, key, feature)

    def set_weights(pattern, hook):
        return torch.tensor([[[[0.75, 0.25], [0.75, 0.25]]]])  # (batch, head, query, key)

    with torch.no_grad():
        out, cache = hooked.run_with_cache(values, values, values, need_weights=False)
        out_set = hooked.run_with_hooks(values, values, values, need_weights=False,
                                        fwd_hooks=[("hook_pattern", set_weights)])[0]
    assert cache["hook_v"][0, :, 0].tolist() == [[4.0, 0.0], [0.0, 8.0]]
    assert out_set[0, 0].tolist() == [3.0, 2.0]


@pytest.fixture(scope="module")
def lesson_x():
    torch.manual_seed(10)
    x = torch.randn(1, 4, 6)
    # the lesson's three 3-feature projections
    w_q, w_k, w_v = (nn.Linear(6, 3, bias=False) for _ in range(3))
    return x, w_q, w_k, w_v


def set_lesson_weights(model, w_q, w_k, w_v):
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.W_Q[0] = w_q.weight.T
        attn.W_K[0] = w_k.weight.T
        attn.W_V[0] = w_v.weight.T


NAMES = ["blocks.0.attn.hook_attn_scores", "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z"]


def test_seed_10_scores_context_and_rows(lesson_x):
    x, w_q, w_k, w_v = lesson_x
    model = lesson_model(causal=False)
    set_lesson_weights(model, w_q, w_k, w_v)
    cache = run_on_embeddings(model, x, NAMES)
    scores = cache["blocks.0.attn.hook_attn_scores"][:, 0]  # (1, 4, 4): the one head
    weights = cache["blocks.0.attn.hook_pattern"][:, 0]
    context = cache["blocks.0.attn.hook_z"][:, :, 0]  # (1, 4, 3)
    assert scores.shape == (1, 4, 4) and context.shape == (1, 4, 3)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4))
    # the lesson's own arithmetic, written out
    with torch.no_grad():
        q, k, v = w_q(x), w_k(x), w_v(x)
        lesson_scores = q @ k.transpose(-2, -1) / math.sqrt(3)
        lesson_weights = torch.softmax(lesson_scores, dim=-1)
        lesson_context = lesson_weights @ v
    torch.testing.assert_close(scores, lesson_scores, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(weights, lesson_weights, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(context, lesson_context, atol=1e-6, rtol=1e-6)


def test_seed_10_causal_mask(lesson_x):
    x, w_q, w_k, w_v = lesson_x
    model = lesson_model(causal=True)
    set_lesson_weights(model, w_q, w_k, w_v)
    cache = run_on_embeddings(model, x, NAMES)
    weights = cache["blocks.0.attn.hook_pattern"][:, 0]  # (1, 4, 4)
    scores = cache["blocks.0.attn.hook_attn_scores"][:, 0]
    assert weights[0, 0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert weights[0, 2, 3].item() == 0.0
    assert torch.isneginf(scores[0, 2, 3])  # masked with -inf, not a finite minimum
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4))


def test_torch_multihead_attention_per_head_weights_average_to_torchs():
    torch.manual_seed(10)
    x = torch.randn(1, 4, 6)
    mha = nn.MultiheadAttention(embed_dim=6, num_heads=2, batch_first=True)
    with torch.no_grad():
        out, averaged = mha(x, x, x)
    assert out.shape == (1, 4, 6) and averaged.shape == (1, 4, 4)
    hooked = hook_attention(mha)
    with torch.no_grad():
        (out_h, averaged_h), cache = hooked.run_with_cache(x, x, x)
    per_head = cache["hook_pattern"]
    assert per_head.shape == (1, 2, 4, 4)
    torch.testing.assert_close(per_head.mean(dim=1), averaged, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out_h, out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(averaged_h, averaged, atol=1e-6, rtol=1e-6)


def test_try_it_two_sequences_of_five_and_causal_row_3():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6)
    model = lesson_model(causal=True)
    cache = run_on_embeddings(model, x, NAMES)
    scores = cache["blocks.0.attn.hook_attn_scores"][:, 0]
    assert scores.shape == (2, 5, 5)
    usable = torch.isfinite(scores[:, 3]).sum(-1)  # keys query position 3 may use
    assert usable.tolist() == [4, 4]
    assert (cache["blocks.0.attn.hook_pattern"][:, 0, 3, 4] == 0).all()
