"""Known-answer tests of interp.interventions.references: reference means per position and per token role, kind="auto"."""

import pytest
import torch
from factories import ablating

from interp.data import PromptSet, random_tokens
from interp.interventions import (
    AUTO_RESAMPLE_BELOW,
    HeadAblation,
    reference_activations,
)
from interp.models.constructed import pattern_heads


def test_mean_ablation_uses_the_reference_mean(tiny_gpt, prompts, reference):
    means = reference_activations(tiny_gpt, reference, site="z").means[1]  # (pos, head, d)
    _, cache = tiny_gpt.run_with_cache(reference.tokens, names_filter="blocks.1.attn.hook_z")
    torch.testing.assert_close(means, cache["blocks.1.attn.hook_z"].mean(0), atol=1e-6, rtol=1e-5)
    with ablating(tiny_gpt, (1, 1), "mean", reference=reference):
        _, cache = tiny_gpt.run_with_cache(prompts.tokens, names_filter="blocks.1.attn.hook_z")
    z = cache["blocks.1.attn.hook_z"]
    torch.testing.assert_close(z[:, :, 1], means[:, 1].expand(len(prompts), -1, -1))


def test_reference_mean_ignores_padding(tiny_gpt):
    tokens = torch.randint(0, tiny_gpt.cfg.d_vocab, (3, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens)
    mask[0, 5:] = 0
    padded = PromptSet(tokens, mask)
    means = reference_activations(tiny_gpt, padded, site="z").means[0]
    _, cache = tiny_gpt.run_with_cache(tokens, attention_mask=mask, names_filter="blocks.0.attn.hook_z")
    z = cache["blocks.0.attn.hook_z"]
    torch.testing.assert_close(means[6], z[1:, 6].mean(0), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(means[2], z[:, 2].mean(0), atol=1e-6, rtol=1e-5)


def _bert_like(d_vocab: int) -> PromptSet:
    """[CLS] content [SEP] with padding, lengths 7, 5, 6 (ids d_vocab-2 / d_vocab-1 are CLS / SEP)."""
    cls, sep = d_vocab - 2, d_vocab - 1
    rows = [[cls, 3, 4, 5, 6, 7, sep], [cls, 8, 9, 10, sep], [cls, 11, 12, 13, 14, sep]]
    tokens = torch.zeros(3, 7, dtype=torch.long)
    mask = torch.zeros(3, 7, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    return PromptSet(tokens, mask, special_mask=(tokens >= cls) & mask.bool())


def _z(model, prompts, layer=0):
    _, cache = model.run_with_cache(prompts.tokens, attention_mask=prompts.attention_mask,
                                    names_filter=f"blocks.{layer}.attn.hook_z")
    return cache[f"blocks.{layer}.attn.hook_z"]  # (prompt, pos, head, d)


def test_reference_means_match_token_roles(tiny_gpt):
    prompts = _bert_like(tiny_gpt.cfg.d_vocab)
    ref = reference_activations(tiny_gpt, prompts, layers=[0], keep_samples=True)
    z = _z(tiny_gpt, prompts)
    assert ref.by_role
    rows = ref.role_rows(prompts)  # (prompt, pos)
    sep = torch.stack([z[0, 6], z[1, 4], z[2, 5]]).mean(0)  # the [SEP] of every prompt, wherever it is
    torch.testing.assert_close(ref.role_means[0][rows[1, 4]], sep, atol=1e-6, rtol=1e-5)
    assert rows[0, 6] == rows[1, 4] == rows[2, 5] and rows[0, 0] == rows[1, 0]
    # content rank 4: prompts 0 and 2 only (prompt 1's position 4 is its [SEP])
    torch.testing.assert_close(ref.role_means[0][rows[0, 4]], (z[0, 4] + z[2, 4]) / 2, atol=1e-6, rtol=1e-5)
    # ablating with the prompts' roles: every [SEP] gets the [SEP] mean, padding keeps its value
    with ablating(tiny_gpt, (0, 2), "mean", reference=ref, prompts=prompts):
        ablated = _z(tiny_gpt, prompts)
    torch.testing.assert_close(ablated[1, 4, 2], sep[2], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ablated[1, 5:, 2], z[1, 5:, 2])
    # resampling by role: a prompt's [SEP] gets another prompt's [SEP] value
    with ablating(tiny_gpt, (0, 2), "resample", reference=ref, prompts=prompts, seed=1):
        resampled = _z(tiny_gpt, prompts)
    seps = [z[0, 6, 2], z[1, 4, 2], z[2, 5, 2]]
    got = [resampled[0, 6, 2], resampled[1, 4, 2], resampled[2, 5, 2]]
    for row, value in enumerate(got):
        matches = [torch.allclose(value, s) for s in seps]
        assert sum(matches) == 1 and not matches[row]


def test_reference_of_one_layout_is_per_position(tiny_gpt, reference):
    ref = reference_activations(tiny_gpt, reference, keep_samples=True)
    assert not ref.by_role and ref.role_means is None
    bos = random_tokens(10, 12, tiny_gpt.cfg.d_vocab - 1, seed=2, bos=tiny_gpt.cfg.d_vocab - 1)
    with_specials = reference_activations(tiny_gpt, bos)  # BOS in every first column: roles are positions
    without = reference_activations(tiny_gpt, PromptSet(bos.tokens))
    assert not with_specials.by_role
    for layer in without.means:
        assert torch.equal(with_specials.means[layer], without.means[layer])
        assert torch.equal(with_specials.variance_fraction[layer], without.variance_fraction[layer])


def test_role_reference_refuses_unseen_roles(tiny_gpt):
    short = _bert_like(tiny_gpt.cfg.d_vocab)[1:2]
    ref = reference_activations(tiny_gpt, _bert_like(tiny_gpt.cfg.d_vocab)[1:])
    with pytest.raises(ValueError, match="no reference prompt has"):
        ref.role_rows(_bert_like(tiny_gpt.cfg.d_vocab)[:1])
    assert ref.role_rows(short).shape == short.tokens.shape


def test_auto_resamples_near_constant_heads():
    model = pattern_heads(d_vocab=16, n_ctx=16)
    prompts = random_tokens(12, 8, 15, seed=0, bos=5)  # a BOS with a non-zero value: the sink head's z is constant
    ref = reference_activations(model, prompts, keep_samples=True)
    fraction = ref.variance_fraction[0]  # (head,)
    assert float(fraction[1]) < 1e-6  # first_token head: the same value everywhere
    assert float(fraction[0]) > AUTO_RESAMPLE_BELOW  # previous_token head: varies with the tokens
    assert ref.resolved_kind(0, 1) == "resample" and ref.resolved_kind(0, 0) == "mean"
    ablation = HeadAblation(((0, 0), (0, 1)), "auto")
    assert ablation.resolved_kinds(ref) == {(0, 0): "mean", (0, 1): "resample"}
    assert ablation.resolved_kind(ref) == "L0H0:mean+L0H1:resample"
    assert HeadAblation(((0, 0),), "mean").resolved_kind(ref) == "mean"
    with ablating(model, [(0, 0)], "auto", reference=ref):
        auto = model(prompts.tokens)
    with ablating(model, [(0, 0)], "mean", reference=ref):
        mean = model(prompts.tokens)
    assert torch.equal(auto, mean)
    with torch.no_grad():  # a head whose z is exactly zero: both ablations are no-ops, the rule says "mean"
        model.blocks[0].attn.W_V[3] = 0.0
        if getattr(model.blocks[0].attn, "b_V", None) is not None:
            model.blocks[0].attn.b_V[3] = 0.0
    zero = reference_activations(model, prompts)
    assert float(zero.variance_fraction[0][3]) == 1.0 and zero.resolved_kind(0, 3) == "mean"
