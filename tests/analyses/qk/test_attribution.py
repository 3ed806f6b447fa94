"""QK attribution (`interp.analyses.qk.attribute`): exact on every architecture the converter supports, the
constructed circuits' known answers, toy-induction's previous-token head, and the result's views."""
import json
import math

import numpy as np
import pytest
import torch
from factories import induction_prompts, period3_prompts, random_gpt, randomise
from hf_families import FAMILIES, VOCAB, converted

import interp
from interp.analyses import qk
from interp.data import PromptSet
from interp.models import constructed

EPS32 = torch.finfo(torch.float32).eps


def model_scores(model, prompts: PromptSet, layer: int, head: int) -> torch.Tensor:
    """(prompt, query, key) the head's scores from a plain cached forward, nothing else hooked."""
    name = f"blocks.{layer}.attn.hook_attn_scores"
    _, cache = model.run_with_cache(prompts.tokens, attention_mask=prompts.attention_mask, names_filter=[name])
    return cache[name][:, head].double()


def assert_exact(att: qk.QKAttribution, scores: torch.Tensor) -> None:
    """Every pair's rows, summed in float64, equal the model's float32 score within 1e-5 x sum |rows| plus
    the score's float32 rounding."""
    terms, _ = att.terms("score")
    pairs = att.pairs
    expected = scores[tuple(torch.as_tensor(pairs[c].to_numpy().copy()) for c in ("prompt", "query", "key"))]
    error = (terms.sum((1, 2)) - expected).abs()
    bound = 1e-5 * terms.abs().sum((1, 2)) + 4 * EPS32 * expected.abs()
    assert (error <= bound).all(), float((error / bound).max())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_rows_sum_to_the_score_on_every_converted_family(family):
    model = converted(family)
    prompts = interp.data.random_tokens(3, 12, VOCAB, seed=1)
    last = model.cfg.n_layers - 1
    for head in {0, model.cfg.n_heads - 1}:  # the first and the last query head (another kv group under GQA)
        att = qk.attribute(model, prompts, (last, head), key="all")
        assert_exact(att, model_scores(model, prompts, last, head))


@pytest.mark.parametrize("norm", ["LN", "RMS", None])
@pytest.mark.parametrize("variant", [{}, {"positional_embedding_type": "rotary", "rotary_dim": 2},
                                     {"parallel_attn_mlp": True}, {"attn_only": True}])
def test_rows_sum_to_the_score_on_hooked_gpt(norm, variant):
    if variant.get("parallel_attn_mlp") and norm is None:
        variant = {**variant}
    model = random_gpt(norm, **variant)
    prompts = interp.data.random_tokens(2, 10, 20, seed=2)
    att = qk.attribute(model, prompts, "L2H1", key="all")
    assert_exact(att, model_scores(model, prompts, 2, 1))
    names = set(att.query_sources)
    assert ("ln_bias" in names) == (norm == "LN")
    assert ("pos_embed" in names) == (variant.get("positional_embedding_type") != "rotary")
    assert ("MLP1" in names) != bool(variant.get("attn_only"))


@pytest.mark.parametrize("extras", [{"n_token_types": 2}, {"n_token_types": 2, "embed_norm": True}])
def test_pre_norm_encoders_with_token_types_and_an_embedding_norm_are_exact(extras):
    from interp.models import EncoderConfig, HookedEncoder

    encoder = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=8, d_vocab=20, n_ctx=16, seed=0, **extras))
    encoder = randomise(encoder.eval(), seed=1)
    prompts = interp.data.random_tokens(2, 7, 20, seed=3)
    att = qk.attribute(encoder, prompts, "L1H1", key="all")
    assert len(att.pairs) == 2 * 7 * 7  # bidirectional: every key
    assert_exact(att, model_scores(encoder, prompts, 1, 1))
    expected = ["embed"] if extras.get("embed_norm") else ["tok_embed", "pos_embed", "type_embed"]
    assert list(att.key_sources[: len(expected)]) == expected


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("family", ["gpt2", "llama-gqa-biases"])
def test_padded_prompts_are_exact_and_padding_is_never_a_key(family, side):
    model = converted(family)
    tokens = torch.randint(1, VOCAB, (3, 10), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(3, 10, dtype=torch.long)
    for row, n_pad in enumerate((0, 3, 5)):
        if n_pad:
            mask[row, :n_pad] = 0 if side == "left" else 1
            if side == "right":
                mask[row, 10 - n_pad:] = 0
    prompts = PromptSet(tokens, mask)
    att = qk.attribute(model, prompts, "L2H0", key="all")
    assert_exact(att, model_scores(model, prompts, 2, 0))
    pairs = att.pairs
    real = mask.bool()
    assert real[pairs["prompt"], pairs["query"]].all() and real[pairs["prompt"], pairs["key"]].all()
    assert len(pairs) == int(sum(torch.tril(real[p, :, None] & real[p, None, :]).sum() for p in range(3)))


def test_the_difference_view_is_the_log_ratio_of_the_pattern(toy):
    prompts = interp.data.repeated_tokens(4, 12, 255, bos=255, seed=1)
    att = qk.attribute(toy, prompts, "L1H1", query=list(range(14, 25)))
    pairs = att.pairs
    terms, keep = att.terms("difference")
    assert keep.all()  # every query of the second copy sees another key
    np.testing.assert_allclose(terms.sum((1, 2)).numpy(), pairs["difference"], rtol=1e-5, atol=1e-4)
    shown = pairs[(pairs["weight"] > 1e-30) & (pairs["against_weight"] > 1e-30)]
    log_ratio = np.log(shown["weight"]) - np.log(shown["against_weight"])
    np.testing.assert_allclose(log_ratio, shown["difference"], rtol=1e-4, atol=1e-4)
    # the default contrast is the highest-scoring other key: no allowed key but the top one scores more
    scores = model_scores(toy, prompts, 1, 1)
    for row in pairs.itertuples():
        others = scores[row.prompt, row.query, : row.query + 1].clone()
        others[row.key] = -math.inf
        assert row.against == int(others.argmax())


def test_key_none_is_each_querys_highest_attention_key(toy):
    prompts = interp.data.repeated_tokens(3, 8, 255, bos=255, seed=2)
    att = qk.attribute(toy, prompts, "L1H0")
    pairs = att.pairs
    assert len(pairs) == 3 * 17 and pairs.groupby("prompt")["query"].apply(list).map(lambda q: q == list(range(17))).all()
    scores = model_scores(toy, prompts, 1, 0)
    top = scores.masked_fill(~torch.ones(17, 17, dtype=torch.bool).tril(), -math.inf).argmax(-1)
    assert (top[pairs["prompt"], pairs["query"]].numpy() == pairs["key"].to_numpy()).all()
    assert (pairs.loc[pairs["query"] == 0, "against"] == -1).all()  # query 0 sees only itself: no contrast


# -- known answers: the constructed circuits


def _only(att: qk.QKAttribution, terms: torch.Tensor, pair_index: int, expected: dict[tuple[str, str], float],
          scale: float) -> None:
    """The score view of one pair (`terms`: `att.terms("score")`): the expected terms, every other term 0, within
    1e-6 of `scale` (the circuit's score gap; the layer-0 heads' softmax leaves e^-40 of their weight elsewhere, so
    their writes are not exactly one-hot)."""
    matrix = terms[pair_index].clone()
    for (a, b), value in expected.items():
        i, j = att.query_sources.index(a), att.key_sources.index(b)
        assert abs(float(matrix[i, j]) - value) <= 1e-6 * abs(value), (a, b, float(matrix[i, j]))
        matrix[i, j] = 0.0
    assert float(matrix.abs().max()) <= 1e-6 * scale


def test_induction_circuit_target_key_is_token_embedding_times_previous_token_head(induction):
    prompts = induction_prompts(6)
    att = qk.attribute(induction, prompts, "L1H0", query=list(range(11, 21)), key="all")
    gap = induction.metadata["score_gap"]
    tokens = prompts.tokens
    terms, _ = att.terms("score")
    seen = {"target": 0, "bos": 0, "other": 0}
    for i, row in enumerate(att.pairs.itertuples()):
        if row.key == 0:
            _only(att, terms, i, {("b_Q", "pos_embed"): gap}, gap)
            seen["bos"] += 1
        elif int(tokens[row.prompt, row.key - 1]) == row.query_token:  # the key's previous token is the query's
            _only(att, terms, i, {("tok_embed", "L0H0"): 2 * gap}, gap)
            seen["target"] += 1
        else:
            _only(att, terms, i, {}, gap)
            seen["other"] += 1
    assert min(seen.values()) > 0


def test_v_composition_circuit_scores_read_positions_only():
    model = constructed.v_composition_circuit()
    prompts = period3_prompts(4)
    att = qk.attribute(model, prompts, "L1H0", query=list(range(1, 19)))  # key None: each query's previous token
    assert (att.pairs["key"] == att.pairs["query"] - 1).all()
    terms, _ = att.terms("score")
    for i in range(len(att.pairs)):
        _only(att, terms, i, {("pos_embed", "pos_embed"): model.metadata["score_gap"]}, model.metadata["score_gap"])
    # L0H0 reaches L1H0 only through its value: it adds nothing to any score, at any key
    frame = qk.attribute(model, prompts, "L1H0", query=[5, 9], key="all").frame("score")
    assert (frame.loc[(frame.query_source == "L0H0") | (frame.key_source == "L0H0"), "contribution"] == 0).all()


def test_unread_head_circuit_the_decoy_adds_nothing():
    model = constructed.unread_head_circuit()
    prompts = induction_prompts(4)
    att = qk.attribute(model, prompts, "L1H0", query=list(range(12, 21)))
    frame = att.frame("score")
    decoy = (frame.query_source == "L0H1") | (frame.key_source == "L0H1")
    assert (frame.loc[decoy, "contribution"] == 0).all()
    by_key = att.by_source().query("side == 'key'").set_index("source")["mean"]
    assert by_key.abs().idxmax() == "L0H0" and by_key["L0H1"] == 0


def test_toy_induction_heads_key_side_is_the_previous_token_head(toy):
    """At the induction target, the key-side source that makes every induction head prefer it is L0H2, the
    previous-token head path patching identifies."""
    L = 20
    prompts = interp.data.repeated_tokens(16, L, 255, bos=255, seed=5)
    for head in range(4):  # L1H0..L1H3 are the card's induction heads
        att = qk.attribute(toy, prompts, (1, head), query=-1, key=L + 1)  # the last token; its earlier occurrence + 1
        key_side = att.by_source().query("side == 'key'").set_index("source")
        assert key_side["mean"].abs().idxmax() == "L0H2", key_side
        assert key_side.loc["L0H2", "ci_low"] > 0


# -- the result's views


@pytest.fixture(scope="module")
def small(toy):
    prompts = interp.data.repeated_tokens(3, 6, 255, bos=255, seed=7)
    return qk.attribute(toy, prompts, "L1H2", query=[8, 12]), prompts


def test_frame_is_tidy_and_sums_per_pair(small):
    att, _ = small
    n_q, n_k = len(att.query_sources), len(att.key_sources)
    for view in qk.VIEWS:
        frame = att.frame(view)
        assert len(frame) == len(att.pairs) * n_q * n_k
        assert list(frame.columns[:6]) == ["layer", "head", "prompt", "query", "key", "against"]
        assert (frame["layer"] == 1).all() and (frame["head"] == 2).all()
        sums = frame.groupby(["prompt", "query"], sort=True)["contribution"].sum().to_numpy()
        column = "score" if view == "score" else "difference"
        np.testing.assert_allclose(sums, att.pairs.sort_values(["prompt", "query"])[column], rtol=1e-5, atol=1e-4)
        assert frame.attrs["view"] == view and frame.attrs["unit"] == "score"
    assert "constant_across_keys" in att.frame("score") and "constant_across_keys" not in att.frame()


def test_constant_rows_are_marked_and_cancel_in_the_difference():
    model = random_gpt("LN")  # learned positions: b_K and ln_bias on the key side add the same to every key
    prompts = interp.data.random_tokens(2, 8, 20, seed=3)
    att = qk.attribute(model, prompts, "L1H0", query=[6, 7])
    score, difference = att.frame("score"), att.frame()
    marked = set(score.loc[score.constant_across_keys, "key_source"])
    assert marked == {"b_K", "ln_bias"}
    assert (difference.loc[difference.key_source.isin(marked), "contribution"] == 0).all()
    assert score.loc[score.constant_across_keys, "contribution"].abs().max() > 0  # in the score, not zero


def test_top_matrix_aggregate_and_to_dict(small):
    att, _ = small
    top = att.top(3)
    assert len(top) == 3 * len(att.pairs) and list(top["rank"][:3]) == [1, 2, 3]
    first = top[top["rank"] == 1]
    assert (first.contribution.abs() >= top[top["rank"] == 2].contribution.abs().to_numpy()).all()
    np.testing.assert_allclose(first["total"], att.pairs["difference"], rtol=1e-5, atol=1e-4)
    matrix = att.matrix(prompt=0, query=8)
    assert matrix.shape == (len(att.query_sources), len(att.key_sources)) and matrix.attrs["n_pairs"] == 1
    aggregate = att.aggregate()
    assert {"mean", "ci_low", "ci_high", "n_prompts"} <= set(aggregate) and (aggregate["n_prompts"] == 3).all()
    assert (aggregate["ci_low"] <= aggregate["mean"] + 1e-12).all()
    values, prompts = att.per_prompt()
    assert values.shape == (3, len(att.query_sources), len(att.key_sources)) and prompts == [0, 1, 2]
    np.testing.assert_allclose(aggregate["mean"], values.mean(0).reshape(-1), rtol=1e-12)
    document = json.loads(att.to_json(top=2))
    assert document["head"] == "L1H2" and len(document["pairs"]) == len(att.pairs)
    assert len(document["pairs"][0]["top_difference"]) == 2 and document["pairs"][0]["top_score"][0]["key_source"]


def test_to_json_with_a_query_that_has_no_contrast(toy):
    att = qk.attribute(toy, interp.data.random_tokens(2, 6, 255, seed=0), "L1H0", query=[0, 5])
    pairs = {(p["prompt"], p["query"]): p for p in json.loads(att.to_json(top=1))["pairs"]}
    first, later = pairs[(0, 0)], pairs[(0, 5)]
    assert first["against"] == -1 and first["against_score"] is None and first["top_difference"] == []
    assert len(first["top_score"]) == 1 and len(later["top_difference"]) == 1


def test_a_run_gives_its_prompts_and_batch_size(toy):
    prompts = interp.data.repeated_tokens(5, 6, 255, bos=255, seed=8)
    run = interp.Run(toy, prompts, batch_size=2)
    by_run = qk.attribute(run, "L1H0", query=-1)
    direct = qk.attribute(toy, prompts, "L1H0", query=-1, batch_size=5)
    assert by_run.pairs.equals(direct.pairs)
    torch.testing.assert_close(by_run.query_terms, direct.query_terms, rtol=0, atol=1e-12)
