"""Known-answer tests of interp.interventions.ablation: zero, mean and resample ablation, hooks, batched ablations."""
import json

import pytest
import torch
from factories import ablating

from interp.data import repeated_tokens
from interp.hooks import attention_sites, live_hooks
from interp.interventions import (
    HeadAblation,
    all_heads,
    parse_heads,
)
from interp.interventions.ablation import _batched_head_ablations
from interp.models import HookedGPT
from interp.models.constructed import redundant_pair


def test_spec_is_plain_data_and_heads_parse():
    ablation = HeadAblation(((1, 3),), "mean")
    assert ablation.spec() == {"heads": [[1, 3]], "kind": "mean", "site": "z"}
    assert json.loads(json.dumps(ablation.spec())) == ablation.spec()
    assert HeadAblation(["L0H1", (1, 2)], "zero", "result").heads == ((0, 1), (1, 2))
    assert parse_heads((1, 2)) == ((1, 2),)
    assert parse_heads("L3H4") == ((3, 4),)


@pytest.mark.parametrize("site", ["z", "result"])
def test_zero_ablation_equals_zeroing_W_O(tiny_gpt, prompts, site):
    with ablating(tiny_gpt, [(1, 2), (0, 0)], "zero", site=site):
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
    with ablating(tiny_gpt, all_heads(tiny_gpt), "mean", reference=one, site=site):
        ablated = tiny_gpt(one.tokens)
    torch.testing.assert_close(ablated, clean, atol=1e-5, rtol=1e-5)


def test_resample_takes_another_prompt(tiny_gpt, prompts):
    # with the prompts as their own reference, every prompt gets another prompt's z
    with ablating(tiny_gpt, (0, 1), "resample", reference=prompts, seed=3):
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
    batched = _batched_head_ablations(
        tiny_gpt, prompts, heads, kind, reference=reference, site=site, seed=5,
        chunk_size=3, return_type="loss", loss_per_token=True,
    )
    assert batched.shape == (len(heads), len(prompts), prompts.n_pos - 1)
    for i, head in enumerate(heads):
        with ablating(tiny_gpt, head, kind, reference=reference, site=site, seed=5):
            sequential = tiny_gpt(prompts.tokens, return_type="loss", loss_per_token=True)
        torch.testing.assert_close(batched[i], sequential, atol=1e-5, rtol=1e-5)


def test_batched_needs_a_batch_axis(tiny_gpt, prompts):
    with pytest.raises(ValueError, match="loss_per_token=True"):
        _batched_head_ablations(tiny_gpt, prompts, [(0, 0)], "zero", return_type="loss")
    assert live_hooks(tiny_gpt) == []


def test_errors(tiny_gpt, prompts, reference):
    with pytest.raises(ValueError, match="does not exist"):
        with ablating(tiny_gpt, (0, 4), "zero"):
            pass
    with pytest.raises(ValueError, match=r"kind='median'.*\['zero', 'mean', 'resample', 'auto'\]"):
        HeadAblation(((0, 0),), "median")
    with pytest.raises(ValueError, match=r"site='pattern'.*\['z', 'result'\]"):
        HeadAblation(((0, 0),), "zero", "pattern")
    with pytest.raises(ValueError, match="needs reference prompts"):
        HeadAblation(((0, 0),), "mean").hooks(tiny_gpt)
    with pytest.raises(ValueError, match="only 4"):
        with ablating(tiny_gpt, (0, 0), "mean", reference=reference.tokens[:, :4]):
            tiny_gpt(prompts.tokens)
    assert live_hooks(tiny_gpt) == []


def test_hooks_are_removed_after_an_exception(tiny_gpt, prompts, reference):
    with pytest.raises(RuntimeError, match="boom"):
        with ablating(tiny_gpt, [(0, 0), (1, 3)], "mean", reference=reference):
            assert len(live_hooks(tiny_gpt)) == 2
            raise RuntimeError("boom")
    assert live_hooks(tiny_gpt) == []


def test_hooks_work_with_run_with_hooks(tiny_gpt, prompts, reference):
    ablation = HeadAblation(((1, 0),), "mean")
    sites = attention_sites(tiny_gpt)
    hooks = ablation.hooks(tiny_gpt, reference)
    assert [name for name, _ in hooks] == [sites[1].hook("z")]
    out = tiny_gpt.run_with_hooks(prompts.tokens, fwd_hooks=hooks)
    with ablating(tiny_gpt, (1, 0), "mean", reference=reference):
        torch.testing.assert_close(out, tiny_gpt(prompts.tokens))
    assert live_hooks(tiny_gpt) == []


def test_redundant_pair_ablations():
    """The constructed pair: one head alone is cheap, both together cost ln(d_vocab - 1) per predictable position."""
    model = redundant_pair(d_vocab=16, n_ctx=32)
    prompts = repeated_tokens(8, 2, 15, bos=15, n_repeats=6, seed=0)
    loss = lambda: model(prompts.tokens, return_type="loss", loss_per_token=True)[:, 2:].mean().item()
    clean = loss()
    with ablating(model, (0, 0), "zero"):
        one = loss()
    with ablating(model, [(0, 0), (0, 1)], "zero"):
        both = loss()
    assert clean < 1e-6 and one < 1e-4
    assert both == pytest.approx(torch.log(torch.tensor(15.0)).item(), abs=1e-4)
