"""Composition claims' supporting evidence `qk_attribution` (`interp.analyses.claims.qk_attribution`): the known
answers on the constructed induction circuit and toy-induction, which queries it reads, and that it never changes a
verdict."""
import math

import pytest
import torch
from factories import induction_prompts, random_gpt

import interp
from interp.analyses.claims import qk_attribution as qka
from interp.analyses.claims.composition import composition_claim
from interp.claims import DEFAULT_EVIDENCE, SUPPORTING_KINDS, Context, Inconclusive
from interp.claims import test_claims as run_test_claims
from interp.data import random_tokens, repeated_tokens
from interp.models import constructed
from interp.models.encoder import EncoderConfig, HookedEncoder
from interp.paths import parse_edge

WITHOUT = tuple(k for k in DEFAULT_EVIDENCE if k not in SUPPORTING_KINDS)


@pytest.fixture(scope="module")
def circuit():
    return constructed.induction_circuit()


@pytest.fixture(scope="module")
def toy():
    return interp.load("toy-induction")


def _evidence(model, prompts, edges):
    ctx = Context(model, prompts, seed=0)
    return [qka.EdgeAttribution(parse_edge(edge))(composition_claim(edge), ctx) for edge in edges]


def test_constructed_circuit_known_answers(circuit):
    """At each repeated query L1H0 attends to an induction target, whose score is the (token embedding x L0H0)
    pair, 2 x score_gap. The contrast is BOS, whose score is (b_Q x position) = score_gap and owes L0H0 nothing (L0H0's
    terms: 2 x score_gap, twice the difference), or, where the prefix repeats the query's token, another target of
    the same score (L0H0's terms and the difference: 0). Nothing reaches L1H0's query from L0H0, and L0H1 writes to a
    subspace no key reads."""
    gap = circuit.metadata["score_gap"]
    prompts = induction_prompts(32)
    key, query, other = _evidence(circuit, prompts, ["L0H0 -> L1H0 via k", "L0H0 -> L1H0 via q", "L0H1 -> L1H0 via k"])
    pairs = qka.receiver_attribution(Context(circuit, prompts), parse_edge("L0H0 -> L1H0 via k").receiver)[0].pairs
    scored = pairs[pairs["query"] >= 11]  # the second copy
    against_bos = (scored["against"] == 0).groupby(scored["prompt"]).mean()  # per prompt: the share with BOS as contrast
    assert 0.5 < against_bos.mean() < 1  # both cases occur
    assert key.effect == pytest.approx(2 * gap * against_bos.mean(), rel=1e-6) and key.ci_low > 0 and key.passed is True
    assert key.extra["share"] == pytest.approx(2.0, rel=1e-6)
    assert key.extra["difference"] == pytest.approx(gap * against_bos.mean(), rel=1e-6)
    assert key.extra["rank"] == 1 and key.extra["strongest_source"] == "L0H0" and key.extra["queries_left_out"] == 0
    assert key.extra["n_queries"] == 32 * 10  # the second copy's ten positions of each prompt
    assert not key.decisive and key.rule == qka.RULE and "supporting only" in key.detail and "raises" in key.detail
    for ev in (query, other):
        assert ev.effect == 0 and ev.ci_low == ev.ci_high == 0 and ev.passed is None
        assert "neither clearly raises nor lowers" in ev.detail


def test_toy_induction_previous_token_head_carries_every_induction_heads_key(toy):
    """L0H2, the previous-token head path patching names, is the strongest key-side source of every layer-1 head's
    preference at the repeated queries, with a CI above 0."""
    prompts = repeated_tokens(32, 20, 255, bos=255, seed=1)
    for ev in _evidence(toy, prompts, [f"L0H2 -> L1H{r} via k" for r in range(4)]):
        assert ev.passed is True and ev.ci_low > 1 and ev.extra["rank"] == 1, ev.detail
        assert ev.extra["strongest_source"] == "L0H2" and 0.5 < ev.extra["share"] < 2


def _verdicts(frame):
    return [(v.claim.label, v.verdict, v.reasons, v.p_value, v.p_adjusted) for v in frame.attrs["verdicts"]]


@pytest.mark.parametrize("which", ["toy", "circuit"])
def test_verdicts_are_identical_with_and_without_it(which, toy, circuit):
    """The kind is supporting only: every verdict, reason and p-value (raw and BH-adjusted over all claims) is the
    same whether it is gathered or not, including where it disagrees with the verdict."""
    if which == "toy":
        model, prompts = toy, repeated_tokens(32, 20, 255, bos=255, seed=1)
        edges = [f"L0H{s} -> L1H2 via {via}" for s in (0, 1, 2) for via in ("q", "k")]
        edges += ["L0H1 -> L1H0 via q", "L0H1 -> L1H1 via k"]  # path patching and the attribution disagree on these
    else:
        model, prompts = circuit, induction_prompts(32)
        edges = ["L0H0 -> L1H0 via k", "L0H0 -> L1H0 via q", "L0H1 -> L1H0 via k"]
    claims = [composition_claim(edge) for edge in edges] + [composition_claim(edges[1], composes=False)]
    with_it, without = (run_test_claims(model, claims, prompts, evidence=kinds) for kinds in (DEFAULT_EVIDENCE, WITHOUT))
    assert _verdicts(with_it) == _verdicts(without)
    gathered = [v.get("qk_attribution") for v in with_it.attrs["verdicts"]]
    assert all(e is not None and math.isfinite(e.effect) for e in gathered[:-1]) and gathered[-1] is None
    assert "qk_attribution" in with_it.columns and "qk_attribution" not in without.columns
    if which == "toy":  # it disagrees with a verdict somewhere: proof that the verdict did not read it
        assert any(e.passed is not True and v.verdict == "supported" or e.passed is True and v.verdict != "supported"
                   for e, v in zip(gathered[:-1], with_it.attrs["verdicts"]))


def test_only_query_and_key_edges_of_composes_claims_carry_it():
    assert "qk_attribution" in composition_claim("L0H0 -> L1H0 via k").evidence
    assert "qk_attribution" in composition_claim("L0H0 -> L1H0 via q").evidence
    assert "qk_attribution" not in composition_claim("L0H0 -> L1H0 via v").evidence  # where, not what
    assert "qk_attribution" not in composition_claim("L0H0 -> L1H0 via k", composes=False).evidence


def test_scored_queries_are_the_repeated_copies_else_every_real_token():
    repeated = repeated_tokens(4, 5, 20, bos=20)
    mask = qka.scored_queries(repeated)
    assert mask.shape == repeated.tokens.shape and mask[:, 6:].all() and not mask[:, :6].any()
    plain = random_tokens(3, 7, 20, seed=0)
    assert qka.scored_queries(plain).all()


def test_the_row_limit_keeps_the_last_scored_queries_and_says_so(circuit, monkeypatch):
    prompts = induction_prompts(32)
    n_sources = len(interp.analyses.qk.sources(circuit, 1, "q")) * len(interp.analyses.qk.sources(circuit, 1, "k"))
    monkeypatch.setattr(qka, "MAX_ROWS", 32 * n_sources * 4)  # room for four queries a prompt
    (ev,) = _evidence(circuit, prompts, ["L0H0 -> L1H0 via k"])
    assert ev.extra["n_queries"] == 32 * 4 and ev.extra["queries_left_out"] == 6
    assert "6 earlier scored positions left out" in ev.detail
    assert ev.extra["share"] == pytest.approx(2.0, rel=1e-6)


def test_padded_prompts_read_each_prompts_own_scored_queries(circuit):
    """Prompts of different lengths (right padding): each prompt's repeated queries are read, none of its padding."""
    full = induction_prompts(32)
    mask = torch.ones_like(full.tokens)
    mask[::2, 17:] = 0  # every other prompt ends after 6 tokens of its second copy
    padded = interp.data.PromptSet(full.tokens, attention_mask=mask, meta=full.meta, repeats=full.repeats)
    assert (qka.scored_queries(padded).sum(1) == torch.tensor([6, 10] * 16)).all()
    (ev,) = _evidence(circuit, padded, ["L0H0 -> L1H0 via k"])
    assert ev.extra["n_queries"] == 16 * 6 + 16 * 10 and ev.extra["share"] == pytest.approx(2.0, rel=1e-6)


def test_models_it_cannot_attribute_leave_it_undecided_saying_why():
    encoder = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=8, d_vocab=20, n_ctx=16, post_norm=True, seed=0))
    ctx = Context(encoder, random_tokens(4, 6, 20, seed=0))
    with pytest.raises(Inconclusive, match="no QK attribution of L1H0: .*post-norm"):
        qka.EdgeAttribution(parse_edge("L0H0 -> L1H0 via k"))(composition_claim("L0H0 -> L1H0 via k"), ctx)
    att = interp.analyses.qk.attribute(random_gpt(), random_tokens(2, 6, 20, seed=0), "L1H0")
    with pytest.raises(Inconclusive, match="L9H9 is no source of L1H0's k input"):
        qka.edge_amounts(att, "L9H9", "k", torch.ones(2, 6, dtype=torch.bool))
