"""QK attribution's scope and bad input: each refusal is a BadInput (CLI exit 2) that says what to do."""
import pytest
import torch
from factories import random_gpt

import interp
from interp.analyses import qk
from interp.analyses.qk.items import MAX_ROWS, check_cost
from interp.data import PromptSet
from interp.errors import BadInput
from interp.models import EncoderConfig, HookedEncoder


@pytest.fixture(scope="module")
def gpt():
    return random_gpt("LN")


@pytest.fixture(scope="module")
def prompts():
    return interp.data.random_tokens(2, 8, 20, seed=0)


@pytest.mark.parametrize("kwargs, message", [
    ({"head": "L3H0"}, r"head L3H0 does not exist: .* 3 layers of 2 heads \(L0H0 \.\. L2H1\)"),
    ({"head": (0, 2)}, r"head L0H2 does not exist"),
    ({"head": "layer1"}, r"not a head label"),
    ({"query": 8}, r"query=8 is outside the prompts' 8 positions \(0\.\.7; negative"),
    ({"query": -9}, r"query=-9 is outside"),
    ({"query": []}, r"non-empty list"),
    ({"query": 2.0}, r"query=2\.0; expected a position"),
    ({"key": 8}, r"key=8 is outside"),
    ({"key": "every"}, r"key='every'; expected a position, 'all'"),
    ({"query": 3, "key": 5}, r"key=5 comes after query 3: a causal model's query sees only keys at or before it"),
    ({"query": 3, "key": 2, "against": 2}, r"against=2 is the key itself"),
    ({"query": 3, "against": 6}, r"against=6 comes after query 3"),
    ({"key": True}, r"key=True; expected a position"),
])
def test_bad_requests_are_refused_with_what_to_do(gpt, prompts, kwargs, message):
    kwargs = {"head": "L1H0", **kwargs}
    with pytest.raises(BadInput, match=message):
        qk.attribute(gpt, prompts, kwargs.pop("head"), **kwargs)


def test_padding_is_refused_as_query_and_as_key(gpt):
    tokens = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    padded = PromptSet(tokens, mask)
    with pytest.raises(BadInput, match=r"key=1 is padding in prompt 1 \(attention_mask 0\).*real position \(2\.\.5"):
        qk.attribute(gpt, padded, "L1H0", query=4, key=1)
    with pytest.raises(BadInput, match=r"query=0 is padding in prompt 1"):
        qk.attribute(gpt, padded, "L1H0", query=0)
    with pytest.raises(BadInput, match=r"against=0 is padding in prompt 1"):
        qk.attribute(gpt, padded, "L1H0", query=5, against=0)


def test_a_key_outside_the_sliding_window_is_refused():
    model = random_gpt("RMS", positional_embedding_type="rotary", window_size=3)
    prompts = interp.data.random_tokens(1, 8, 20, seed=0)
    with pytest.raises(BadInput, match=r"outside its sliding window of 3 keys"):
        qk.attribute(model, prompts, "L1H0", query=6, key=2)
    att = qk.attribute(model, prompts, "L1H0", query=6, key="all")
    assert sorted(att.pairs["key"]) == [4, 5, 6]


def test_positions_may_be_numpy_or_torch_integers(gpt, prompts):
    import numpy as np

    att = qk.attribute(gpt, prompts, "L1H0", query=torch.tensor([6, 7]), key=np.int64(2), against=torch.tensor(1))
    assert sorted(set(att.pairs["query"])) == [6, 7] and set(att.pairs["key"]) == {2} and set(att.pairs["against"]) == {1}


def test_an_explicit_key_without_queries_takes_those_that_see_it(gpt, prompts):
    att = qk.attribute(gpt, prompts, "L1H0", key=5)
    assert sorted(set(att.pairs["query"])) == [5, 6, 7] and (att.pairs["key"] == 5).all()


def test_the_top_key_as_contrast_is_refused_but_skipped_under_all(gpt, prompts):
    att = qk.attribute(gpt, prompts, "L1H0", query=3)
    top = int(att.pairs["key"][0])
    with pytest.raises(BadInput, match=rf"against={top} is query 3's highest-attention key itself"):
        qk.attribute(gpt, prompts[0], "L1H0", query=3, against=top)
    every = qk.attribute(gpt, prompts, "L1H0", query=3, key="all", against=top)
    assert top not in set(every.pairs.loc[every.pairs["prompt"] == 0, "key"]) and (every.pairs["against"] == top).all()


def test_cost_is_stated_and_refused_above_the_limit():
    check_cost(MAX_ROWS // 100, 10, 10)  # exactly at the limit: allowed
    with pytest.raises(BadInput, match=r"would have 1\.7e\+08 rows \(8256 \(prompt, query, key\) pairs x 144 query "
                                       r"sources x 144 key sources; about 1\.3 GiB.*limit of 5e\+07"):
        check_cost(8256, 144, 144)


def test_key_all_on_many_prompts_is_refused_before_any_forward(gpt, monkeypatch):
    prompts = interp.data.random_tokens(3000, 16, 20, seed=0)  # 136 (q, k) each x 12 x 12 sources: 5.9e7 rows
    monkeypatch.setattr(gpt, "forward", lambda *args, **kwargs: pytest.fail("a forward ran before the refusal"))
    with pytest.raises(BadInput, match=r"would have 5\.9e\+07 rows \(408000 .* above the limit"):
        qk.attribute(gpt, prompts, "L2H0", key="all")


def test_post_norm_models_are_refused_with_the_reason():
    encoder = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=8, d_vocab=20, n_ctx=16, post_norm=True, seed=0))
    with pytest.raises(BadInput, match=r"pre-norm model: .* post-norm blocks normalise the residual stream"):
        qk.attribute(encoder, interp.data.random_tokens(2, 6, 20), "L1H0")


def test_a_pre_norm_encoder_is_attributed_at_keys_after_the_query():
    encoder = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=8, d_vocab=20, n_ctx=16, seed=0)).eval()
    att = qk.attribute(encoder, interp.data.random_tokens(2, 6, 20), "L1H0", query=1, key=4)
    assert len(att.pairs) == 2 and "pos_embed" in att.key_sources


@pytest.mark.parametrize("switch, value, what", [("use_qk_norm", True, "QK-norm"),
                                                 ("attn_scores_soft_cap", 50.0, "soft-capping"),
                                                 ("positional_embedding_type", "alibi", "ALiBi")])
def test_score_variants_are_refused(switch, value, what):
    model = random_gpt("RMS")
    object.__setattr__(model.cfg, switch, value)  # no converter sets these today; a future one would
    with pytest.raises(BadInput, match=what):
        qk.attribute(model, interp.data.random_tokens(1, 6, 20), "L1H0")


def test_models_without_our_attention_are_refused(tiny_gpt):
    from transformer_lens import HookedRootModule

    class Plain(HookedRootModule):
        pass

    with pytest.raises(BadInput, match=r"QK attribution needs a model .*split q/k/v inputs"):
        qk.attribute(Plain(), interp.data.random_tokens(1, 6, 20), "L0H0")


def test_views_and_arguments_of_the_result_are_checked(gpt, prompts):
    att = qk.attribute(gpt, prompts, "L1H0", query=0)
    with pytest.raises(BadInput, match=r"no attributed query sees a second key.*view='score'"):
        att.frame()
    assert len(att.frame("score")) == 2 * len(att.query_sources) * len(att.key_sources)
    with pytest.raises(BadInput, match=r"view='both'; expected one of \['difference', 'score'\]"):
        att.frame("both")
    with pytest.raises(BadInput, match=r"top\(n=0\)"):
        att.top(0, "score")
    with pytest.raises(BadInput, match=r"no attributed pair has prompt=5"):
        att.matrix("score", prompt=5)
    with pytest.raises(BadInput, match=r"a Run carries its prompts"):
        qk.attribute(interp.Run(gpt, prompts), prompts, "L1H0")
    with pytest.raises(BadInput, match=r"which head\?"):
        qk.attribute(gpt, prompts)
