"""Head types: one object per kind of head, from which metric, argmax rate, ideal pattern, claims,
scan and the report follow; a new type defined here, outside the package, gets all of them."""
import dataclasses

import pytest
import torch

from interp.analyses import claims as hc
from interp.analyses import head_types as ht
from interp.analyses import positional, report
from interp.analyses.head_types import HeadType, TargetBatch, register, unregister
from interp.capture import BatchContext
from interp.claims import Context
from interp.claims import test_claims as run_test_claims
from interp.data import PromptSet, Repeats, random_tokens, repeated_tokens, shuffled
from interp.errors import BadInput
from interp.hooks import attention_sites
from interp.models.constructed import fixed_offset_copier

# --------------------------------------------------------------------------- a new head type, outside the package

def two_back(batch: TargetBatch) -> torch.Tensor:
    """(batch, query, key): the key two positions before the query."""
    q = torch.arange(batch.n_pos)
    return (q[:, None] - q[None, :] == 2).expand_as(batch.allowed)


TWO_BACK = HeadType("two_back", "{label} attends two tokens back (> {threshold:g} of its attention)", two_back,
                    description="mean attention weight on the token two positions back; in [0, 1]")


@pytest.fixture()
def registered():
    register(TWO_BACK)
    yield TWO_BACK
    unregister("two_back")


@pytest.fixture(scope="module")
def copier():
    """L0H0 attends exactly two back (and copies: right on period-3 repeats); L0H1 is uniform."""
    return fixed_offset_copier(period=3, d_vocab=16, n_ctx=32)


@pytest.fixture(scope="module")
def period3(copier):
    return repeated_tokens(64, 3, 15, bos=15, n_repeats=5, seed=1)  # 16 positions; 64 prompts: report.compute tests scanned claims on half, 32


def test_new_head_type_metric_per_head(registered, copier, period3):
    frame = positional.focus(copier, period3)
    assert "two_back" in frame.columns and "two_back_argmax" in frame.columns
    values = frame.set_index("head")["two_back"]
    assert values[0] == pytest.approx(1.0, abs=1e-6)  # the hand-set head
    # the uniform head: weight 1 / (q + 1) on q - 2, averaged over the queries q = 2..15 that have a target
    expected = sum(1 / (q + 1) for q in range(2, 16)) / 14
    assert values[1] == pytest.approx(expected, rel=1e-5)
    ctx = Context(copier, period3)
    torch.testing.assert_close(hc.head_metric(ctx, TWO_BACK)[:, 0, 1], torch.full((64,), expected), rtol=1e-5, atol=1e-6)


def test_new_head_type_claim_gets_every_evidence_kind(registered, copier, period3):
    claim = hc.make_claim("two_back", 0, 0)
    assert claim.statement == "L0H0 attends two tokens back (> 0.5 of its attention)"
    assert claim.spec()["params"] == {"metric": "two_back", "ideal": "two_back"}
    table = run_test_claims(copier, [claim], period3)
    row = table.iloc[0]
    for kind in ("observational", "control_shuffled", "control_random_init", "necessity"):
        assert row[f"{kind}_passed"] == True, (kind, row["reasons"])  # noqa: E712 (numpy bool)
    assert row["verdict"] == "supported"
    assert row["sufficiency"] > 0.99  # the ideal two-back pattern is what the head does: "not informative"
    assert all(table.attrs["verdicts"][0].get(kind).extra["informative"] == "no" for kind in ("sufficiency", "faithfulness"))


def test_new_head_type_unregistered_still_measures_and_claims(copier, period3):
    ctx = Context(copier, period3)
    values = hc.head_metric(ctx, TWO_BACK)  # measured in a pass of its own
    assert float(values[:, 0, 0].mean()) == pytest.approx(1.0, abs=1e-6)
    claim = hc.head_type_claim(TWO_BACK, 0, 0, threshold=0.9)
    assert "two_back" not in ht.HEAD_TYPES and claim.thresholds["observational"].value == 0.9


def test_new_head_type_in_the_report(registered, copier, period3, tmp_path):
    data = report.compute(copier, prompts=period3, seed=0)
    assert "two_back" in data.heads.columns
    supported = data.claims[(data.claims["claim"] == "two_back") & (data.claims["verdict"] == "supported")]
    assert list(supported["label"]) == ["L0H0"]
    assert "two_back" in data.heads.set_index("label").loc["L0H0", "claims_supported"].split(";")
    folder = tmp_path / "report"
    report.render(data, folder)
    assert "L0H0 attends two tokens back" in (folder / "report.html").read_text(encoding="utf-8")  # its card
    assert "two positions back" in (folder / "columns.md").read_text(encoding="utf-8")


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
    assert ht.ngram_targets(tokens, torch.ones_like(tokens, dtype=torch.bool), 2)[0].nonzero().tolist() == [[3, 1]]
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


def test_registry():
    assert ht.BUILTIN_HEAD_TYPES == ("previous_token", "next_token", "self_token", "first_token", "local_window",
                                     "induction", "duplicate_token")
    assert ht.get_head_type("prev_token") is ht.get_head_type("previous_token")  # by column too
    with pytest.raises(BadInput, match="unknown head type 'two_back'"):
        ht.get_head_type("two_back")
    register(TWO_BACK)
    try:
        assert ht.head_types()[-1] is TWO_BACK and TWO_BACK in ht.head_types(needs=("any",))
        assert "two_back" in hc.PRESETS and "two_back_argmax" in positional.positional_metrics()
        with pytest.raises(BadInput, match="exists already"):
            register(TWO_BACK)
        register(TWO_BACK, replace=True)
    finally:
        unregister("two_back")
    assert "two_back" not in hc.PRESETS and positional.positional_metrics() == positional.POSITIONAL_METRICS
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
    assert hc.positional_head(0, 0, offset=-2).params.head_type == back


def test_typed_params_read_as_the_legacy_mapping():
    claim = hc.local_window_head(0, 1)
    assert isinstance(claim.params, ht.HeadTypeParams) and claim.params.head_type is ht.get_head_type("local_window")
    assert dict(claim.params) == {"metric": "local_window", "ideal": "local_window", "window": 3}
    assert dict(hc.induction_head(1, 0).params) == {"metric": "induction", "ideal": "induction",
                                                     "position_metric": "induction_position"}
    assert dict(hc.positional_head(0, 0).params) == {"metric": "argmax_at:auto", "offset": None}
    assert len(claim.params) == 3 and claim.params["window"] == 3
    with pytest.raises(TypeError, match="no parameter 'width'"):
        hc.head_type_claim("local_window", 0, 0, width=2)


def test_typed_params_are_a_full_mapping():
    # regression: a dataclass field named `values` shadowed Mapping.values(), so .values() raised TypeError
    params = hc.local_window_head(0, 1).params
    assert list(params.values()) == ["local_window", "local_window", 3]
    assert list(params.keys()) == ["metric", "ideal", "window"] and dict(params.items()) == dict(params)
    assert params.param_values == (("window", 3),) and params.get("window") == 3 and "window" in params
    assert list(ht.HeadTypeParams(ht.get_head_type("previous_token")).values()) == ["prev_token", "previous_token"]


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
