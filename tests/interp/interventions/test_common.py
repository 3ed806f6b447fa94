"""Tests of interp.interventions.common: heads parsed and checked, prompts, forwards stopped early, digests."""

import pytest
import torch

from interp.data import PromptSet
from interp.errors import BadType
from interp.hooks import hooked
from interp.interventions import (
    HeadAblation,
    all_heads,
    as_prompts,
    check_heads,
    parse_heads,
    run_stopping_after,
    tensor_digest,
)


@pytest.mark.parametrize("heads", [0, None, 2.5, b"L0H1"])
def test_heads_of_the_wrong_type_are_a_bad_type(heads):
    """r006 r009: not a raw "'int' object is not iterable" but the toolkit's BadType naming the argument."""
    from interp.errors import BadType

    with pytest.raises(BadType, match=rf"heads={heads!r} .* is not a head or a list of heads; pass an 'L{{layer}}H{{head}}' label"):
        HeadAblation(heads)


def test_errors(tiny_gpt):
    with pytest.raises(ValueError, match=r"L2H0 = \(2, 0\) does not exist.*heads 0..3"):
        check_heads(tiny_gpt, [(2, 0)])
    with pytest.raises(ValueError, match="not of the form"):
        parse_heads("head3")
    with pytest.raises(ValueError, match="no heads given"):
        parse_heads([])


def test_all_heads_lists_every_head_in_forward_order(tiny_gpt):
    assert all_heads(tiny_gpt) == tuple((layer, head) for layer in range(2) for head in range(4))
    assert check_heads(tiny_gpt, ["L1H3", (0, 2), "L1H3"]) == ((1, 3), (0, 2))  # duplicates removed, order kept


def test_as_prompts_takes_a_prompt_set_or_tokens():
    tokens = torch.arange(12).view(2, 6)
    assert torch.equal(as_prompts(tokens).tokens, tokens)
    assert as_prompts(tokens[0]).tokens.shape == (1, 6)  # one prompt
    prompts = PromptSet(tokens)
    assert as_prompts(prompts) is prompts
    with pytest.raises(ValueError, match="the prompt set is empty"):
        as_prompts(PromptSet(tokens[:0]))
    with pytest.raises(BadType, match="prompts must be an interp.data.PromptSet"):
        as_prompts([[1, 2, 3]])


def test_run_stopping_after_never_reaches_later_blocks(tiny_gpt, prompts):
    seen = []
    hooks = [(f"blocks.{layer}.hook_resid_post", lambda act, hook, layer=layer: seen.append(layer)) for layer in range(2)]
    with hooked(tiny_gpt, hooks):
        run_stopping_after(tiny_gpt, prompts, 0)
    assert seen == [0]


def test_tensor_digest_follows_content_shape_and_dtype():
    values = torch.arange(6.0)
    assert tensor_digest(values) == tensor_digest(values.clone())
    assert tensor_digest(values) != tensor_digest(values.view(2, 3))
    assert tensor_digest(values) != tensor_digest(values.double())
    changed = values.clone()
    changed[5] = 5.5
    assert tensor_digest(values) != tensor_digest(changed)
