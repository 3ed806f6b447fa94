"""Known-answer tests for interp.interventions: ablations, pattern substitution, batched ablations."""
import json

import pytest
import torch

from interp.data import PromptSet, random_tokens, repeated_tokens
from interp.hooks import attention_sites, live_hooks
from interp.interventions import (
    AUTO_RESAMPLE_BELOW,
    HeadAblation,
    ablate,
    all_heads,
    batched_head_ablations,
    check_heads,
    ideal_pattern,
    parse_heads,
    permute_among_allowed,
    permuted_pattern,
    reference_activations,
    substitute_pattern,
    uniform_pattern,
)
from interp.models import HookedGPT
from interp.models.constructed import pattern_heads, redundant_pair, single_head


@pytest.fixture(scope="module")
def prompts(tiny_gpt):
    return random_tokens(6, 12, tiny_gpt.cfg.d_vocab, seed=1)


@pytest.fixture(scope="module")
def reference(tiny_gpt):
    return random_tokens(10, 12, tiny_gpt.cfg.d_vocab, seed=2)


def test_spec_is_plain_data_and_heads_parse():
    ablation = HeadAblation(((1, 3),), "mean")
    assert ablation.spec() == {"heads": [[1, 3]], "kind": "mean", "site": "z"}
    assert json.loads(json.dumps(ablation.spec())) == ablation.spec()
    assert HeadAblation(["L0H1", (1, 2)], "zero", "result").heads == ((0, 1), (1, 2))
    assert parse_heads((1, 2)) == ((1, 2),)
    assert parse_heads("L3H4") == ((3, 4),)


@pytest.mark.parametrize("heads", [0, None, 2.5, b"L0H1"])
def test_heads_of_the_wrong_type_are_a_bad_type(heads):
    """r006 r009: not a raw "'int' object is not iterable" but the toolkit's BadType naming the argument."""
    from interp.errors import BadType

    with pytest.raises(BadType, match=rf"heads={heads!r} .* is not a head or a list of heads; pass an 'L{{layer}}H{{head}}' label"):
        HeadAblation(heads)


@pytest.mark.parametrize("site", ["z", "result"])
def test_zero_ablation_equals_zeroing_W_O(tiny_gpt, prompts, site):
    with ablate(tiny_gpt, [(1, 2), (0, 0)], "zero", site=site):
        ablated = tiny_gpt(prompts.tokens)
    edited = HookedGPT(tiny_gpt.cfg).eval()
    edited.load_state_dict(tiny_gpt.state_dict())
    with torch.no_grad():
        edited.blocks[1].attn.W_O[2] = 0
        edited.blocks[0].attn.W_O[0] = 0
    torch.testing.assert_close(ablated, edited(prompts.tokens), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ablated, tiny_gpt(prompts.tokens), atol=1e-4)


@pytest.mark.parametrize("site", ["z", "result"])
def test_mean_ablation_with_the_prompt_itself_changes_nothing(tiny_gpt, prompts, site):
    one = prompts[0]
    clean = tiny_gpt(one.tokens)
    with ablate(tiny_gpt, all_heads(tiny_gpt), "mean", reference=one, site=site):
        ablated = tiny_gpt(one.tokens)
    torch.testing.assert_close(ablated, clean, atol=1e-5, rtol=1e-5)


def test_mean_ablation_uses_the_reference_mean(tiny_gpt, prompts, reference):
    means = reference_activations(tiny_gpt, reference, site="z").means[1]  # (pos, head, d)
    _, cache = tiny_gpt.run_with_cache(reference.tokens, names_filter="blocks.1.attn.hook_z")
    torch.testing.assert_close(means, cache["blocks.1.attn.hook_z"].mean(0), atol=1e-6, rtol=1e-5)
    with ablate(tiny_gpt, (1, 1), "mean", reference=reference):
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


def test_resample_takes_another_prompt(tiny_gpt, prompts):
    # with the prompts as their own reference, every prompt gets another prompt's z
    with ablate(tiny_gpt, (0, 1), "resample", reference=prompts, seed=3):
        _, cache = tiny_gpt.run_with_cache(prompts.tokens, names_filter="blocks.0.attn.hook_z")
    _, clean = tiny_gpt.run_with_cache(prompts.tokens, names_filter="blocks.0.attn.hook_z")
    new, old = cache["blocks.0.attn.hook_z"][:, :, 1], clean["blocks.0.attn.hook_z"][:, :, 1]
    for row in range(len(prompts)):
        matches = [torch.equal(new[row], old[other]) for other in range(len(prompts))]
        assert sum(matches) == 1 and not matches[row]


@pytest.mark.parametrize("kind", ["zero", "mean", "resample", "auto"])
@pytest.mark.parametrize("site", ["z", "result"])
def test_batched_equals_sequential(tiny_gpt, prompts, reference, kind, site):
    heads = [(0, 0), (0, 3), (1, 1), (1, 2)]
    batched = batched_head_ablations(
        tiny_gpt, prompts, heads, kind, reference=reference, site=site, seed=5,
        chunk_size=3, return_type="loss", loss_per_token=True,
    )
    assert batched.shape == (len(heads), len(prompts), prompts.n_pos - 1)
    for i, head in enumerate(heads):
        with ablate(tiny_gpt, head, kind, reference=reference, site=site, seed=5):
            sequential = tiny_gpt(prompts.tokens, return_type="loss", loss_per_token=True)
        torch.testing.assert_close(batched[i], sequential, atol=1e-5, rtol=1e-5)


def test_batched_needs_a_batch_axis(tiny_gpt, prompts):
    with pytest.raises(ValueError, match="loss_per_token=True"):
        batched_head_ablations(tiny_gpt, prompts, [(0, 0)], "zero", return_type="loss")
    assert live_hooks(tiny_gpt) == []


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


def test_errors(tiny_gpt, prompts, reference):
    with pytest.raises(ValueError, match=r"L2H0 = \(2, 0\) does not exist.*heads 0..3"):
        check_heads(tiny_gpt, [(2, 0)])
    with pytest.raises(ValueError, match="does not exist"):
        with ablate(tiny_gpt, (0, 4), "zero"):
            pass
    with pytest.raises(ValueError, match=r"kind='median'.*\['zero', 'mean', 'resample', 'auto'\]"):
        HeadAblation(((0, 0),), "median")
    with pytest.raises(ValueError, match=r"site='pattern'.*\['z', 'result'\]"):
        HeadAblation(((0, 0),), "zero", "pattern")
    with pytest.raises(ValueError, match="needs reference prompts"):
        HeadAblation(((0, 0),), "mean").hooks(tiny_gpt)
    with pytest.raises(ValueError, match="not of the form"):
        parse_heads("head3")
    with pytest.raises(ValueError, match="no heads given"):
        parse_heads([])
    with pytest.raises(ValueError, match="only 4"):
        with ablate(tiny_gpt, (0, 0), "mean", reference=reference.tokens[:, :4]):
            tiny_gpt(prompts.tokens)
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


def test_hooks_are_removed_after_an_exception(tiny_gpt, prompts, reference):
    with pytest.raises(RuntimeError, match="boom"):
        with ablate(tiny_gpt, [(0, 0), (1, 3)], "mean", reference=reference):
            assert len(live_hooks(tiny_gpt)) == 2
            raise RuntimeError("boom")
    assert live_hooks(tiny_gpt) == []
    with pytest.raises(ValueError):
        with substitute_pattern(tiny_gpt, 1, 0, lambda n: torch.full((n, n), 2.0)):
            tiny_gpt(prompts.tokens)  # raises inside the hook
    assert live_hooks(tiny_gpt) == []
    with pytest.raises(RuntimeError, match="boom"):
        with permuted_pattern(tiny_gpt, 0, 0):
            raise RuntimeError("boom")
    assert live_hooks(tiny_gpt) == []


def test_hooks_work_with_run_with_hooks(tiny_gpt, prompts, reference):
    ablation = HeadAblation(((1, 0),), "mean")
    sites = attention_sites(tiny_gpt)
    hooks = ablation.hooks(tiny_gpt, reference)
    assert [name for name, _ in hooks] == [sites[1].hook("z")]
    out = tiny_gpt.run_with_hooks(prompts.tokens, fwd_hooks=hooks)
    with ablate(tiny_gpt, (1, 0), "mean", reference=reference):
        torch.testing.assert_close(out, tiny_gpt(prompts.tokens))
    assert live_hooks(tiny_gpt) == []


def test_redundant_pair_ablations():
    """The constructed pair: one head alone is cheap, both together cost ln(d_vocab - 1) per predictable position."""
    model = redundant_pair(d_vocab=16, n_ctx=32)
    prompts = repeated_tokens(8, 2, 15, bos=15, n_repeats=6, seed=0)
    loss = lambda: model(prompts.tokens, return_type="loss", loss_per_token=True)[:, 2:].mean().item()
    clean = loss()
    with ablate(model, (0, 0), "zero"):
        one = loss()
    with ablate(model, [(0, 0), (0, 1)], "zero"):
        both = loss()
    assert clean < 1e-6 and one < 1e-4
    assert both == pytest.approx(torch.log(torch.tensor(15.0)).item(), abs=1e-4)


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


# --- token roles and kind="auto" -------------------------------------------------------------

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
    with ablate(tiny_gpt, (0, 2), "mean", reference=ref, prompts=prompts):
        ablated = _z(tiny_gpt, prompts)
    torch.testing.assert_close(ablated[1, 4, 2], sep[2], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ablated[1, 5:, 2], z[1, 5:, 2])
    # resampling by role: a prompt's [SEP] gets another prompt's [SEP] value
    with ablate(tiny_gpt, (0, 2), "resample", reference=ref, prompts=prompts, seed=1):
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
    with ablate(model, [(0, 0)], "auto", reference=ref):
        auto = model(prompts.tokens)
    with ablate(model, [(0, 0)], "mean", reference=ref):
        mean = model(prompts.tokens)
    assert torch.equal(auto, mean)
    with torch.no_grad():  # a head whose z is exactly zero: both ablations are no-ops, the rule says "mean"
        model.blocks[0].attn.W_V[3] = 0.0
        if getattr(model.blocks[0].attn, "b_V", None) is not None:
            model.blocks[0].attn.b_V[3] = 0.0
    zero = reference_activations(model, prompts)
    assert float(zero.variance_fraction[0][3]) == 1.0 and zero.resolved_kind(0, 3) == "mean"
