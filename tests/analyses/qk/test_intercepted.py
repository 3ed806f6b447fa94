"""QK attribution on users' own models hooked by interception (`interp.analyses.qk.intercepted`): the same terms as
on the converted HookedGPT of the same weights, rows that sum to the model's score, refusals saying what works."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from own_models import hf_gpt2, nanogpt_flash, nanogpt_manual, rotary_gpt_trained

import interp
from interp.analyses import qk
from interp.analyses.circuits import attention_input_patch
from interp.errors import BadInput
from interp.intercepted import projections
from interp.models.nanogpt import from_nanogpt


def _by_name(attribution):
    terms, _ = attribution.terms()
    q = {name: i for i, name in enumerate(attribution.query_sources)}
    k = {name: i for i, name in enumerate(attribution.key_sources)}
    return terms, q, k


@pytest.mark.parametrize("factory", [nanogpt_flash, nanogpt_manual])
def test_qk_terms_of_a_users_nanogpt_equal_the_converted_models(factory):
    """NanoStyleGPT (kernel or hand-written attention) intercepted vs from_nanogpt of its weights: every pair of
    sources both have agrees to 1e-6, and `rest` is the converted model's tok_embed + pos_embed + MLP0."""
    user = factory()
    own = interp.load(user)
    ref = from_nanogpt(dataclasses.asdict(user.config), user.state_dict())
    prompts = interp.data.repeated_tokens(6, 6, 61, bos=0, seed=1)
    a, b = qk.attribute(own, prompts, "L1H2"), qk.attribute(ref, prompts, "L1H2")
    assert a.query_sources == ("rest", "L0H0", "L0H1", "L0H2", "L0H3", "b_O0", "ln_bias", "b_Q")
    pd_scores = torch.tensor(a.pairs["score"].to_numpy())
    torch.testing.assert_close(pd_scores, torch.tensor(b.pairs["score"].to_numpy()), atol=1e-5, rtol=0)
    (ta, qa, ka), (tb, qb, kb) = _by_name(a), _by_name(b)
    for x, y in itertools.product([n for n in qa if n in qb], [n for n in ka if n in kb]):
        torch.testing.assert_close(ta[:, qa[x], ka[y]], tb[:, qb[x], kb[y]], atol=1e-6, rtol=0)
    rest = ["tok_embed", "pos_embed", "MLP0"]
    for y in [n for n in ka if n in kb]:
        torch.testing.assert_close(ta[:, qa["rest"], ka[y]], sum(tb[:, qb[x], kb[y]] for x in rest), atol=1e-6, rtol=0)
    diff = a.pairs[a.pairs["against"] >= 0]["difference"].to_numpy()
    torch.testing.assert_close(ta.sum((1, 2)), torch.tensor(diff), atol=1e-5, rtol=0)  # exact: rows sum to s - s'


def test_hugging_face_gpt2_under_sdpa_interception():
    """Conv1D projections (c_attn holding q, k, v as column blocks) are read as well: scores and head terms equal
    the converted model's."""
    own, converted = interp.load(hf_gpt2(), backend="sdpa"), interp.load(hf_gpt2())
    prompts = interp.data.repeated_tokens(4, 5, 100, bos=0, seed=2)
    a, b = qk.attribute(own, prompts, "L1H1", key="all"), qk.attribute(converted, prompts, "L1H1", key="all")
    (ta, qa, ka), (tb, qb, kb) = _by_name(a), _by_name(b)
    torch.testing.assert_close(ta[:, qa["L0H3"], ka["L0H1"]], tb[:, qb["L0H3"], kb["L0H1"]], atol=1e-6, rtol=0)


def test_projections_are_found_where_visible_and_missing_where_the_model_rotates_q_and_k():
    found = projections(interp.load(nanogpt_flash()))
    assert set(found) == {0, 1} and set(found[0]) == {"q", "k"} and found[0]["q"][0].shape == (4, 32, 8)
    assert projections(interp.load(rotary_gpt_trained())) == {}


def test_a_rotary_fork_is_refused_and_what_the_advice_names_runs():
    model = interp.load(rotary_gpt_trained())
    prompts = interp.data.repeated_tokens(4, 6, 256, bos=0)
    with pytest.raises(BadInput, match="q and k are no column block of any Linear.s output") as info:
        qk.attribute(model, prompts, "L1H0")
    assert "attention_input_patch" in str(info.value)
    assert len(attention_input_patch(model, prompts, sender="L0H0", layer=1)) == 1


def test_check_is_refused_on_an_intercepted_model_with_what_tests_a_source_instead():
    model = interp.load(nanogpt_flash())
    prompts = interp.data.repeated_tokens(8, 6, 61, bos=0, seed=1)
    run = interp.Run(model, prompts)
    attribution = qk.attribute(run, "L1H0")
    with pytest.raises(BadInput, match="split q/k inputs") as info:
        attribution.check(run)
    assert "attention_input_patch" in str(info.value)
    assert len(attention_input_patch(run, sender="L0H1", layer=1)) == 1
