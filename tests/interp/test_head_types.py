"""Head types (`interp.head_types`): targets, metric, argmax rate, ideal pattern, the registry, known answers.
How a registered type reaches the analyses (metric columns, claims, the report) is tested in
tests/analyses/test_head_types.py."""
import dataclasses

import pytest
import torch

import interp.head_types as ht
from interp.capture import BatchContext
from interp.data import PromptSet, Repeats, ngram_targets, random_tokens, repeated_tokens, shuffled
from interp.errors import BadInput
from interp.head_types import HeadType, TargetBatch, register, unregister
from interp.hooks import attention_sites
from interp.models.constructed import fixed_offset_copier


def two_back(batch: TargetBatch) -> torch.Tensor:
    """(batch, query, key): the key two positions before the query."""
    q = torch.arange(batch.n_pos)
    return (q[:, None] - q[None, :] == 2).expand_as(batch.allowed)


TWO_BACK = HeadType("two_back", "{label} attends two tokens back (> {threshold:g} of its attention)", two_back,
                    description="mean attention weight on the token two positions back; in [0, 1]")


# --------------------------------------------------------------------------- known answers


def _batch(n: int = 6, *, causal: bool = True, mask=None, repeats=None) -> TargetBatch:
    tokens = torch.arange(n)[None].repeat(2, 1)
    return TargetBatch.from_prompts(PromptSet(tokens, mask, repeats=repeats), causal=causal)


def _one_hot_pattern(n: int, offset: int) -> torch.Tensor:
    """(1, 1, query, key): all weight at query + offset where it exists, else on key 0."""
    q = torch.arange(n)
    key = (q + offset).clamp(min=0)
    return torch.nn.functional.one_hot(key, n).float()[None, None]


def _uniform(n: int) -> torch.Tensor:
    allowed = torch.ones(n, n).tril()
    return (allowed / allowed.sum(-1, keepdim=True))[None, None]


def test_previous_token_pattern_scores_one_and_uniform_its_fraction():
    prev = ht.get_head_type("previous_token")
    batch = _batch(6)
    pattern = _one_hot_pattern(6, -1).expand(2, 1, 6, 6)
    torch.testing.assert_close(prev.metric_values(pattern, batch), torch.ones(2, 1))
    torch.testing.assert_close(prev.argmax_rate(pattern, batch), torch.ones(2, 1))
    uniform = _uniform(6).expand(2, 1, 6, 6)
    expected = sum(1 / (q + 1) for q in range(1, 6)) / 5  # queries 1..5 have a previous token
    torch.testing.assert_close(prev.metric_values(uniform, batch), torch.full((2, 1), expected))
    # ties split evenly: a uniform row credits 1 / (q + 1) to its previous token
    torch.testing.assert_close(prev.argmax_rate(uniform, batch), torch.full((2, 1), expected))


def test_generic_mask_product_equals_every_fast_path():
    batch = _batch(7)
    pattern = torch.softmax(torch.randn(2, 3, 7, 7, generator=torch.Generator().manual_seed(0))
                            .masked_fill(~batch.allowed[:, None], float("-inf")), -1)
    for head_type in ht.head_types():
        generic = dataclasses.replace(head_type, target=lambda b, t=head_type.target: t(b))  # no fast path
        torch.testing.assert_close(generic.weight(pattern, batch), head_type.weight(pattern, batch))
        torch.testing.assert_close(generic.scored_queries(batch), head_type.scored_queries(batch))
        torch.testing.assert_close(generic.argmax_rate(pattern, batch), head_type.argmax_rate(pattern, batch),
                                   equal_nan=True)


def test_target_masks_known_answers():
    batch = _batch(4)
    assert ht.OffsetTarget(-1)(batch)[0].nonzero().tolist() == [[1, 0], [2, 1], [3, 2]]
    assert not ht.OffsetTarget(1)(batch).any()  # causal: no next token
    assert ht.OffsetTarget(1)(_batch(4, causal=False))[0].nonzero().tolist() == [[0, 1], [1, 2], [2, 3]]
    assert ht.offset_target(-2) == ht.OffsetTarget(-2)
    left = _batch(4, mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
    assert ht.FirstTarget()(left)[0].nonzero().tolist() == [[1, 1], [2, 1], [3, 1]]
    assert ht.WindowTarget(1)(batch)[0].sum(-1).tolist() == [1, 2, 2, 2]


def test_content_targets_and_repeat_queries():
    prompts = repeated_tokens(1, 3, 50, seed=0, n_repeats=2)  # distinct prefix a b c a b c
    batch = TargetBatch.from_prompts(prompts)
    assert batch.repeat_queries[0].tolist() == [False] * 3 + [True] * 3
    assert ht.duplicate_target(batch)[0].nonzero().tolist() == [[3, 0], [4, 1], [5, 2]]
    assert ht.induction_target(batch)[0].nonzero().tolist() == [[3, 1], [4, 2], [5, 3]]
    tokens = torch.tensor([[1, 2, 1, 2]])
    assert Repeats().query_mask(tokens)[0].tolist() == [False, False, True, True]
    assert Repeats(match_len=2).query_mask(tokens)[0].tolist() == [False, False, False, True]
    assert TargetBatch.from_prompts(PromptSet(tokens)).repeat_queries[0].tolist() == [False, False, True, True]
    assert ngram_targets(tokens, torch.ones_like(tokens, dtype=torch.bool), 2)[0].nonzero().tolist() == [[3, 1]]
    induction = ht.get_head_type("induction")
    assert induction.scored_queries(batch)[0].tolist() == [False] * 3 + [True] * 3
    assert ht.repeat_queries_of(batch) is batch.repeat_queries


def test_target_batch_from_context_matches_from_prompts():
    prompts = PromptSet(torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4]]), torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]),
                        repeats=Repeats(match_len=1))
    site = attention_sites(fixed_offset_copier(period=3, d_vocab=16, n_ctx=32))[0]
    ctx = BatchContext(site, prompts.tokens, prompts.attention_mask.bool(), True, {}, prompts.repeats)
    a, b = TargetBatch.from_context(ctx), TargetBatch.from_prompts(prompts)
    for name in ("tokens", "real", "allowed", "first_real"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.repeats == b.repeats == Repeats(match_len=1)
    assert a.scored[0].tolist() == [False, False, True, True] and a.n_pos == 4
    assert a.occurrences.shape == (2, 4, 4)


def test_ideal_pattern_rows_are_distributions_with_fallbacks():
    batch = _batch(5, mask=torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]))
    prev = ht.get_head_type("previous_token").ideal_pattern(batch)
    assert prev[0, 0].sum() == 0  # a padded query: zero row
    assert prev[0, 1].argmax() == 1  # the first real query has no previous token: the first real key
    assert prev[1, 3].argmax() == 2
    nxt = ht.get_head_type("next_token").ideal_pattern(_batch(4, causal=False))
    assert nxt[0, 3].argmax() == 3  # fallback "self": the last query on itself
    window = ht.get_head_type("local_window").ideal_pattern(_batch(6))
    torch.testing.assert_close(window[0, 5], torch.tensor([0, 0, 0.25, 0.25, 0.25, 0.25]))
    sums = window.sum(-1)
    torch.testing.assert_close(sums, torch.ones_like(sums))


def test_reduce_head_types_and_argmax_ties():
    pattern = _uniform(4).expand(2, 2, 4, 4).contiguous()
    threshold, n_max = ht.argmax_ties(pattern)
    assert n_max[0, 0].tolist() == [1, 2, 3, 4]
    torch.testing.assert_close(threshold[0, 0], torch.tensor([1.0, 0.5, 1 / 3, 0.25]) - ht.TIE_TOLERANCE)
    prompts = PromptSet(torch.zeros(2, 4, dtype=torch.long))
    site = attention_sites(fixed_offset_copier(period=3, d_vocab=16, n_ctx=32))[0]
    ctx = BatchContext(site, prompts.tokens, None, True, {})
    types = (ht.get_head_type("self_token"), TWO_BACK)
    out = ht.reduce_head_types(pattern, ctx, types)
    assert list(out) == ["self_token", "two_back", "self_token_argmax", "two_back_argmax"]
    torch.testing.assert_close(out["two_back"], torch.full((2, 2), (1 / 3 + 1 / 4) / 2))
    reducer = ht.head_type_reducer(types, argmax=False)
    assert list(reducer(pattern, ctx)) == ["self_token", "two_back"]


def test_head_type_validation_and_describe():
    with pytest.raises(BadInput, match="identifier"):
        HeadType("two back", "{label}", two_back)
    with pytest.raises(BadInput, match="needs="):
        HeadType("x", "{label}", two_back, needs="sometimes")
    with pytest.raises(BadInput, match="shuffle="):
        HeadType("x", "{label}", two_back, shuffle="maybe")
    with pytest.raises(BadInput, match="fallback="):
        HeadType("x", "{label}", two_back, fallback="last")
    with pytest.raises(BadInput, match="callable"):
        HeadType("x", "{label}", "two back")
    bad = HeadType("bad", "{label}", lambda batch: torch.zeros(3))
    with pytest.raises(BadInput, match="bool mask"):
        bad.mask(_batch(4))
    assert TWO_BACK.describe("L0H1", 0.7) == "L0H1 attends two tokens back (> 0.7 of its attention)"
    window = ht.get_head_type("local_window")
    assert window.describe("L2H0") == "L2H0 attends within 3 positions of the query (> 0.5 of its attention)"
    assert ht.get_head_type("previous_token").column == "prev_token" and TWO_BACK.column == "two_back"
    assert ht.get_head_type("self_token").ideal_name == "self" and TWO_BACK.ideal_name == "two_back"


def test_available_says_what_the_prompts_or_model_lack():
    random = random_tokens(4, 8, 50, seed=0)
    assert ht.get_head_type("previous_token").available(random, causal=True) is None
    assert "bidirectional" in ht.get_head_type("next_token").available(random, causal=True)
    assert ht.get_head_type("next_token").available(random, causal=False) is None
    distinct = PromptSet(torch.arange(8)[None])
    assert "repeats" in ht.get_head_type("induction").available(distinct, causal=True)
    assert ht.get_head_type("induction").available(repeated_tokens(4, 4, 50), causal=True) is None


def test_positional_ideal_patterns_known_answers():
    """The patterns `interp.substitute_pattern` substitutes by name, on n unpadded positions: previous_token all
    on query - 1 (query 0 on itself), first_token all on key 0, self all on the query; causal or not."""
    for n in (1, 2, 7):
        query = torch.arange(n)
        expected = {"previous_token": (query - 1).clamp(min=0), "first_token": torch.zeros(n, dtype=torch.long),
                    "self": query}
        for causal in (True, False):
            batch = TargetBatch.from_prompts(PromptSet(query[None]), causal=causal)
            for name, key in expected.items():
                pattern = ht.ideal_head_type(name).ideal_pattern(batch)[0]  # (query, key)
                assert torch.equal(pattern, torch.nn.functional.one_hot(key, n).float()), (name, n, causal)


def test_ideal_pattern_names_follow_the_registry():
    assert ht.ideal_pattern_names() == ["previous_token", "next_token", "self_token", "self", "first_token",
                                        "local_window", "induction", "duplicate_token"]
    assert ht.ideal_head_type("self") is ht.get_head_type("self_token") is ht.ideal_head_type("self_token")
    with pytest.raises(BadInput, match="no head type's ideal pattern is called 'prev_token'"):
        ht.ideal_head_type("prev_token")  # a column, not a pattern's name
    register(dataclasses.replace(TWO_BACK, ideal="back2"))
    try:
        assert ht.ideal_pattern_names()[-2:] == ["two_back", "back2"] and ht.ideal_head_type("back2").name == "two_back"
    finally:
        unregister("two_back")
    assert "back2" not in ht.ideal_pattern_names()


def test_registry():
    assert ht.BUILTIN_HEAD_TYPES == ("previous_token", "next_token", "self_token", "first_token", "local_window",
                                     "induction", "duplicate_token")
    assert ht.get_head_type("prev_token") is ht.get_head_type("previous_token")  # by column too
    with pytest.raises(BadInput, match="unknown head type 'two_back'"):
        ht.get_head_type("two_back")
    register(TWO_BACK)
    try:
        assert ht.head_types()[-1] is TWO_BACK and TWO_BACK in ht.head_types(needs=("any",))
        with pytest.raises(BadInput, match="exists already"):
            register(TWO_BACK)
        register(TWO_BACK, replace=True)
    finally:
        unregister("two_back")
    assert "two_back" not in ht.HEAD_TYPES
    with pytest.raises(BadInput, match="built-in"):
        unregister("induction")
    with pytest.raises(BadInput, match="built-in"):
        register(ht.get_head_type("induction"), replace=True)
    with pytest.raises(BadInput, match="'positional' is a claim kind"):
        register(dataclasses.replace(TWO_BACK, name="positional"))
    with pytest.raises(BadInput, match="writes"):
        register(dataclasses.replace(TWO_BACK, metric="prev_token"))
    with pytest.raises(BadInput, match="no head type"):
        unregister("two_back")
    with pytest.raises(BadInput, match="takes a HeadType"):
        register("two_back")
    assert ht.head_types(needs=("repeats",)) == (ht.get_head_type("induction"), ht.get_head_type("duplicate_token"))


def test_offset_type_is_the_positional_family():
    back = ht.offset_type(-2)
    assert back.name == "offset_m2" and back.threshold == 0.9 and back.citation == ht.VOITA and back.sufficiency is None
    assert ht.offset_type("first").target == ht.FirstTarget()
    pattern = _one_hot_pattern(6, -2).expand(2, 1, 6, 6)
    rate = back.argmax_rate(pattern, _batch(6))
    torch.testing.assert_close(rate, torch.ones(2, 1))


def test_repeats_is_typed_and_derived_from_legacy_meta():
    prompts = repeated_tokens(2, 4, 20, bos=20, n_repeats=3)
    assert prompts.repeats == Repeats(period=4, offset=1, n_repeats=3) and prompts.repeats.start == 5
    legacy = PromptSet(prompts.tokens, meta={"prefix_len": 4, "offset": 1, "match_len": 2})
    assert legacy.repeats == Repeats(period=4, offset=1, match_len=2)
    assert Repeats.from_meta({"kind": "text"}) is None and PromptSet(prompts.tokens).repeats is None
    control = shuffled(legacy, seed=0)
    assert control.repeats == Repeats(match_len=2) and "prefix_len" not in control.meta
    assert shuffled(prompts, seed=0).repeats is None
    assert prompts[0].repeats == prompts.repeats  # kept by indexing and splits
    with pytest.raises(Exception, match="Repeats"):
        PromptSet(prompts.tokens, repeats={"period": 4})
