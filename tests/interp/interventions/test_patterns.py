"""Known-answer tests of interp.interventions.patterns: substituted, ideal and permuted patterns."""

import pytest
import torch

from interp.data import repeated_tokens
from interp.hooks import live_hooks
from interp.interventions import (
    ideal_pattern,
    permute_among_allowed,
    permuted_pattern,
    substitute_pattern,
    uniform_pattern,
)
from interp.models.constructed import single_head


def test_own_pattern_changes_nothing(tiny_gpt, prompts):
    clean = tiny_gpt(prompts.tokens)
    with substitute_pattern(tiny_gpt, 1, 2, None):
        out = tiny_gpt(prompts.tokens)
    torch.testing.assert_close(out, clean, atol=1e-5, rtol=1e-5)


def test_ideal_previous_token_pattern_into_exact_head_changes_nothing():
    model = single_head("previous_token", d_vocab=16, n_ctx=32)
    tokens = repeated_tokens(4, 2, 15, bos=15, n_repeats=8, seed=0).tokens
    clean = model(tokens)
    for pattern in ("previous_token", ideal_pattern("previous_token", tokens.shape[1]),
                    lambda n: ideal_pattern("previous_token", n)):
        with substitute_pattern(model, 0, 0, pattern):
            torch.testing.assert_close(model(tokens), clean, atol=1e-4, rtol=1e-5)
    with substitute_pattern(model, 0, 0, "first_token"):
        assert (model(tokens) - clean).abs().max() > 1.0


def test_substituted_pattern_is_what_the_head_uses(tiny_gpt, prompts):
    with uniform_pattern(tiny_gpt, 0, 1):
        _, cache = tiny_gpt.run_with_cache(prompts.tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    pattern = cache["blocks.0.attn.hook_pattern"]
    torch.testing.assert_close(pattern[0, 1], ideal_pattern("uniform", prompts.n_pos))
    _, clean = tiny_gpt.run_with_cache(prompts.tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    torch.testing.assert_close(pattern[:, 0], clean["blocks.0.attn.hook_pattern"][:, 0])


def test_permuted_pattern_keeps_each_rows_weights(tiny_gpt, prompts):
    _, clean = tiny_gpt.run_with_cache(prompts.tokens, names_filter="blocks.1.attn.hook_pattern")
    with permuted_pattern(tiny_gpt, 1, 3, seed=0):
        _, cache = tiny_gpt.run_with_cache(prompts.tokens, names_filter="blocks.1.attn.hook_pattern")
    old, new = clean["blocks.1.attn.hook_pattern"][:, 3], cache["blocks.1.attn.hook_pattern"][:, 3]
    assert torch.equal(new.sort(-1).values, old.sort(-1).values)  # same weights in each row
    assert (new.triu(1) == 0).all()  # still causal
    assert not torch.allclose(new, old)


def test_permute_among_allowed_respects_the_mask():
    pattern = torch.tensor([[[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4]]])
    allowed = torch.tensor([[[True, True, True, False], [True, False, True, True]]])
    pattern[0, 1, 1] = 0.0
    pattern[0, 1] = pattern[0, 1] / pattern[0, 1].sum()
    out = permute_among_allowed(pattern, allowed, torch.Generator().manual_seed(0))
    assert (out[~allowed] == 0).all()
    torch.testing.assert_close(out.sort(-1).values, pattern.sort(-1).values)


@pytest.mark.parametrize("kind", ["previous_token", "first_token", "self", "uniform"])
@pytest.mark.parametrize("causal", [True, False])
def test_ideal_patterns_are_distributions(kind, causal):
    pattern = ideal_pattern(kind, 7, causal=causal)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(7))
    if causal:
        assert (pattern.triu(1) == 0).all()
    expected_row3 = {"previous_token": 2, "first_token": 0, "self": 3}
    if kind in expected_row3:
        assert pattern[3, expected_row3[kind]] == 1.0


def test_encoder_uniform_pattern_skips_padding(tiny_encoder):
    tokens = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens)
    mask[0, 4:] = 0
    with uniform_pattern(tiny_encoder, 0, 0):
        _, cache = tiny_encoder.run_with_cache(tokens, attention_mask=mask, names_filter="blocks.0.attn.hook_pattern")
    pattern = cache["blocks.0.attn.hook_pattern"][:, 0]
    torch.testing.assert_close(pattern[0, 0], torch.tensor([0.25] * 4 + [0.0] * 2))
    torch.testing.assert_close(pattern[1, 0], torch.full((6,), 1 / 6))


def test_errors(tiny_gpt, prompts):
    bad = ideal_pattern("uniform", prompts.n_pos) * 1.5
    with pytest.raises(ValueError, match="sums to 1.5"):
        with substitute_pattern(tiny_gpt, 0, 0, bad):
            pass
    with pytest.raises(ValueError, match="future"):
        with substitute_pattern(tiny_gpt, 0, 0, ideal_pattern("uniform", prompts.n_pos, causal=False)):
            tiny_gpt(prompts.tokens)
    with pytest.raises(ValueError, match="for this sequence length"):
        with substitute_pattern(tiny_gpt, 0, 0, ideal_pattern("self", 5)):
            tiny_gpt(prompts.tokens)
    with pytest.raises(ValueError, match=r"pattern='diagonal'"):
        with substitute_pattern(tiny_gpt, 0, 0, "diagonal"):
            pass
    assert live_hooks(tiny_gpt) == []


def test_hooks_are_removed_after_an_exception(tiny_gpt, prompts):
    with pytest.raises(ValueError):
        with substitute_pattern(tiny_gpt, 1, 0, lambda n: torch.full((n, n), 2.0)):
            tiny_gpt(prompts.tokens)  # raises inside the hook
    assert live_hooks(tiny_gpt) == []
    with pytest.raises(RuntimeError, match="boom"):
        with permuted_pattern(tiny_gpt, 0, 0):
            raise RuntimeError("boom")
    assert live_hooks(tiny_gpt) == []


def test_substitution_reads_masked_keys_from_scores_even_for_a_one_hot_head():
    from interp.models.constructed import single_head

    model = single_head("previous_token")
    with torch.no_grad():
        model.blocks[0].attn.W_Q *= 10  # softmax underflows to exact zeros on real keys
    tokens = repeated_tokens(2, 5, model.cfg.d_vocab - 1, bos=model.cfg.d_vocab - 1).tokens
    with substitute_pattern(model, 0, 0, "uniform"):
        _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_pattern")
    row = cache["pattern", 0][0, 0, 3]
    torch.testing.assert_close(row[:4], torch.full((4,), 0.25))
    assert row[4:].abs().max() == 0
    with substitute_pattern(model, 0, 0, "self"):  # a valid causal pattern is accepted
        model(tokens)
