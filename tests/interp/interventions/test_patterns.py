"""Known-answer tests of interp.interventions.patterns: substituted, ideal (the head types') and permuted patterns."""
import dataclasses

import pytest
import torch

from interp.data import PromptSet, pad, random_tokens, repeated_tokens
from interp.errors import BadInput
from interp.head_types import HeadType, TargetBatch, ideal_head_type, offset_target, register, unregister
from interp.hooks import attention_sites, hooked, live_hooks
from interp.interventions import (
    PatternSubstitution,
    pattern_names,
    permute_among_allowed,
    permuted_pattern,
    substitute_pattern,
    uniform_pattern,
)
from interp.models.constructed import single_head
from interp.run import Run


def _ideal(name: str, prompts: PromptSet, *, causal: bool = True) -> torch.Tensor:
    """(batch, query, key): the head type's ideal pattern on `prompts`."""
    return ideal_head_type(name).ideal_pattern(TargetBatch.from_prompts(prompts, causal=causal))


def _substituted(model, layer: int, head: int, pattern, tokens, mask=None, **options) -> torch.Tensor:
    """(batch, query, key): the pattern the head uses under `substitute_pattern`."""
    caught = {}

    def catch(x: torch.Tensor, hook) -> None:  # (batch, head, query, key)
        caught["pattern"] = x[:, head].clone()

    site = attention_sites(model)[layer]
    with substitute_pattern(model, layer, head, pattern, **options), torch.no_grad():
        with hooked(model, [(site.hook("pattern"), catch)]):
            model(tokens) if mask is None else model(tokens, attention_mask=mask)
    return caught["pattern"]


def test_own_pattern_changes_nothing(tiny_gpt, prompts):
    clean = tiny_gpt(prompts.tokens)
    with substitute_pattern(tiny_gpt, 1, 2, None):
        out = tiny_gpt(prompts.tokens)
    torch.testing.assert_close(out, clean, atol=1e-5, rtol=1e-5)


def test_ideal_previous_token_pattern_into_exact_head_changes_nothing():
    model = single_head("previous_token", d_vocab=16, n_ctx=32)
    tokens = repeated_tokens(4, 2, 15, bos=15, n_repeats=8, seed=0).tokens
    clean = model(tokens)
    for pattern in ("previous_token", _ideal("previous_token", PromptSet(tokens)),
                    lambda n: _ideal("previous_token", PromptSet(torch.arange(n)[None]))[0]):
        with substitute_pattern(model, 0, 0, pattern):
            torch.testing.assert_close(model(tokens), clean, atol=1e-4, rtol=1e-5)
    with substitute_pattern(model, 0, 0, "first_token"):
        assert (model(tokens) - clean).abs().max() > 1.0


def test_substituted_pattern_is_what_the_head_uses(tiny_gpt, prompts):
    with uniform_pattern(tiny_gpt, 0, 1):
        _, cache = tiny_gpt.run_with_cache(prompts.tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    pattern = cache["blocks.0.attn.hook_pattern"]
    n = prompts.n_pos
    torch.testing.assert_close(pattern[0, 1], torch.ones(n, n).tril() / torch.arange(1, n + 1)[:, None])
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


def test_the_names_are_uniform_and_the_head_types_ideal_patterns():
    names = pattern_names()
    assert names[0] == "uniform" and {"previous_token", "first_token", "self", "self_token", "induction"} <= set(names)
    assert ideal_head_type("self") is ideal_head_type("self_token")


@pytest.mark.parametrize("name,expected_row3", [("previous_token", 2), ("first_token", 0), ("self", 3)])
@pytest.mark.parametrize("model", ["tiny_gpt", "tiny_encoder"])
def test_named_patterns_are_the_head_types_laid_on_real_positions(name, expected_row3, model, request):
    """Unpadded: the head type's ideal pattern (rows summing to one; causal). Left-padded: the same pattern counted
    from each prompt's first real token (the first real query has no previous token: on itself), padded queries
    keeping the head's own rows, as before the head types were the one ideal-pattern system."""
    m = request.getfixturevalue(model)
    causal = model == "tiny_gpt"
    tokens = random_tokens(2, 7, 40, seed=0).tokens
    pattern = _substituted(m, 1, 2, name, tokens)
    torch.testing.assert_close(pattern, _ideal(name, PromptSet(tokens), causal=causal))
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 7))
    assert (pattern[:, 3, expected_row3] == 1.0).all() and (pattern.triu(1) == 0).all()
    padded = pad([[1, 2, 3, 4, 5], [6, 7, 8]], padding_side="left")  # (2, 5): the second starts at position 2
    own = _substituted(m, 1, 2, None, padded.tokens, padded.attention_mask)
    laid = _substituted(m, 1, 2, name, padded.tokens, padded.attention_mask)
    unpadded = _ideal(name, PromptSet(torch.tensor([[6, 7, 8]])), causal=causal)[0]  # (3, 3)
    torch.testing.assert_close(laid[1, 2:, 2:], unpadded)
    torch.testing.assert_close(laid[1, :2], own[1, :2])  # padded queries: their own rows
    torch.testing.assert_close(laid[0], _ideal(name, PromptSet(padded.tokens[:1]), causal=causal)[0])


def test_a_content_type_needs_the_prompts_and_a_bidirectional_type_a_bidirectional_model(tiny_gpt, tiny_encoder):
    prompts = repeated_tokens(2, 4, 40, seed=0)
    with pytest.raises(BadInput, match="depends on the tokens.*prompts="):
        with substitute_pattern(tiny_gpt, 0, 0, "induction"):
            pass
    pattern = _substituted(tiny_gpt, 0, 0, "induction", prompts.tokens, prompts=prompts)
    torch.testing.assert_close(pattern, _ideal("induction", prompts))
    assert pattern[0, 5].argmax() == 2  # the token after the earlier occurrence of the query's token
    with pytest.raises(BadInput, match="the PromptSet the model reads"):
        _substituted(tiny_gpt, 0, 0, "induction", prompts.tokens[:, 1:], prompts=prompts)
    with pytest.raises(BadInput, match="needs a bidirectional model"):
        with substitute_pattern(tiny_gpt, 0, 0, "next_token"):
            pass
    pattern = _substituted(tiny_encoder, 0, 0, "next_token", prompts.tokens)
    assert pattern[0, 3].argmax() == 4 and pattern[0, 7].argmax() == 7  # the last query: on itself
    assert live_hooks(tiny_gpt) == [] and live_hooks(tiny_encoder) == []


def test_a_registered_head_type_is_a_pattern_name_in_a_run(tiny_gpt):
    two_back = HeadType("two_back_pattern", "{label} attends two back (> {threshold:g})", offset_target(-2))
    prompts = repeated_tokens(4, 4, 40, seed=0)
    with pytest.raises(ValueError, match="two_back_pattern"):
        PatternSubstitution("L0H1", "two_back_pattern")
    register(two_back)
    try:
        assert "two_back_pattern" in pattern_names()
        pattern = _substituted(tiny_gpt, 0, 1, "two_back_pattern", prompts.tokens)
        assert pattern[0, 5].argmax() == 3 and pattern[0, 1].argmax() == 0  # no key two back: the first token
        run = Run(tiny_gpt, prompts)
        substitution = PatternSubstitution("L0H1", "two_back_pattern")
        first = run.effect(substitution)
        assert first.mean != 0 and substitution.fingerprint(run) is not None
        register(dataclasses.replace(two_back, target=offset_target(-3)), replace=True)  # another pattern, same name
        assert run.effect(substitution).mean != first.mean
    finally:
        unregister("two_back_pattern")
    assert PatternSubstitution("L0H1", "previous_token").fingerprint(Run(tiny_gpt, prompts)) is None


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
    n = prompts.n_pos
    bad = torch.ones(n, n).tril() / torch.arange(1, n + 1)[:, None] * 1.5
    with pytest.raises(ValueError, match="sums to 1.5"):
        with substitute_pattern(tiny_gpt, 0, 0, bad):
            pass
    with pytest.raises(ValueError, match="future"):
        with substitute_pattern(tiny_gpt, 0, 0, torch.full((n, n), 1 / n)):
            tiny_gpt(prompts.tokens)
    with pytest.raises(ValueError, match="for this sequence length"):
        with substitute_pattern(tiny_gpt, 0, 0, torch.eye(5)):
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
