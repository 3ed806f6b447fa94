"""Composition scores (`interp.analyses.circuits.composition`): known answers on the constructed circuits,
invariances, a brute-force computation, the baseline."""
from __future__ import annotations

import math

import pytest
import torch
from factories import CONSTRUCTED_VOCAB, random_gpt
from torch import nn

from interp.analyses.circuits import baseline, composition_scores
from interp.analyses.circuits import composition as composition_module
from interp.errors import BadInput
from interp.models import constructed
from interp.models.gpt import HookedGPT

N_DRAWS = 50  # baseline draws in the tests (the default 200 only narrows the baseline)



def _nonzero(frame, tol: float = 1e-12):
    return sorted(f"{row.sender} -> {row.receiver} via {row.via}" for row in frame.itertuples() if row.score > tol)


def test_composition_on_the_induction_circuit_finds_only_the_k_edge(induction):
    frame = composition_scores(induction, n_draws=N_DRAWS)
    assert len(frame) == 4 * 4 * 3
    assert _nonzero(frame) == ["L0H0 -> L1H0 via k"]
    above = frame[frame["score"] > frame["baseline_p95"]]
    assert above[["sender", "receiver", "via"]].values.tolist() == [["L0H0", "L1H0", "k"]]
    assert (frame.loc[frame["score"] <= frame["baseline_p95"], "score"] == 0).all()
    # L0H0 maps tok to prev one-hot, L1H0's key reads prev against its query's tok: 63 aligned dimensions
    assert float(above["score"].iloc[0]) == pytest.approx(1 / math.sqrt(CONSTRUCTED_VOCAB - 1))


def test_composition_on_the_v_circuit_finds_only_the_v_edge(v_circuit):
    frame = composition_scores(v_circuit, n_draws=N_DRAWS)
    assert _nonzero(frame) == ["L0H0 -> L1H0 via v"]
    edge = frame[frame["score"] > 0].iloc[0]
    assert edge["score"] > edge["baseline_p95"] and edge["ratio"] > 2


def test_composition_the_unread_head_composes_with_nothing(unread):
    frame = composition_scores(unread, n_draws=N_DRAWS)
    assert (frame.loc[frame["sender"] == "L0H1", "score"] == 0).all() and (frame["sender"] == "L0H1").sum() == 2 * 3
    assert _nonzero(frame) == ["L0H0 -> L1H0 via k"]


def test_composition_is_invariant_to_rescaling_a_heads_weights():
    model = random_gpt()
    before = composition_scores(model, n_draws=N_DRAWS)
    with torch.no_grad():
        model.blocks[0].attn.W_O[1] *= 8.0  # powers of two: the float32 weights scale exactly
        model.blocks[1].attn.W_V[0] *= 0.25
        model.blocks[2].attn.W_Q[1] *= 4.0
    after = composition_scores(model, n_draws=N_DRAWS)
    assert before["score"].tolist() == pytest.approx(after["score"].tolist(), rel=1e-9)
    assert before["score"].min() > 0  # random weights: every pair composes a little


def _brute_force(model: HookedGPT, sender, receiver, via: str) -> float:
    """The score from the d_model x d_model products themselves, the receiver's ln1 gain and centring folded in."""
    W_Q, W_K, W_V, W_O = (getattr(model, name).detach().double() for name in ("W_Q", "W_K", "W_V", "W_O"))
    d_model = W_Q.shape[2]
    ln1 = model.blocks[receiver[0]].ln1
    centre = torch.eye(d_model, dtype=torch.float64) - 1.0 / d_model
    norm = centre @ torch.diag(ln1.w.detach().double()) if hasattr(ln1, "b") else torch.diag(ln1.w.detach().double())
    ov_s = W_V[sender] @ W_O[sender]
    r = receiver
    reads = {"q": norm @ W_Q[r] @ (norm @ W_K[r]).T, "k": norm @ W_K[r] @ (norm @ W_Q[r]).T, "v": norm @ W_V[r] @ W_O[r]}
    return float((ov_s @ reads[via]).norm() / (ov_s.norm() * reads[via].norm()))


@pytest.mark.parametrize("normalization_type", ["LN", "RMS"])
def test_composition_matches_a_brute_force_computation(normalization_type):
    model = random_gpt(normalization_type, seed=2)
    frame = composition_scores(model, n_draws=N_DRAWS)
    assert len(frame) == (2 * 2 + 4 * 2) * 3  # receivers in layers 1 and 2, senders in every earlier layer
    for row in frame.itertuples():
        expected = _brute_force(model, (row.sender_layer, row.sender_head), (row.receiver_layer, row.receiver_head), row.via)
        assert row.score == pytest.approx(expected, rel=1e-9), (row.sender, row.receiver, row.via)


def test_composition_folds_the_layernorm_centring():
    """A sender that writes only along the all-ones direction: a LayerNorm receiver removes it (score 0); an
    RMSNorm receiver, which does not centre, reads it."""
    for normalization_type, composes in (("LN", False), ("RMS", True)):
        model = random_gpt(normalization_type, seed=3)
        with torch.no_grad():
            model.blocks[0].attn.W_O[0] = torch.randn(4, 1, generator=torch.Generator().manual_seed(0)).expand(4, 12)
        frame = composition_scores(model, n_draws=N_DRAWS)
        scores = frame.loc[frame["sender"] == "L0H0", "score"]
        assert (scores.max() > 1e-3) == composes, normalization_type
        if not composes:
            assert scores.max() < 1e-7


def test_baseline_is_about_one_over_sqrt_d_model_whatever_d_head():
    """The random baseline's order: 1 / sqrt(d_model), not sqrt(d_head / d_model) (see the module)."""
    for d_model, d_head in ((64, 8), (64, 32), (256, 16)):
        for via in ("q", "k", "v"):
            draws = baseline(d_model, d_head, via, n_draws=40)
            assert float(draws.mean()) == pytest.approx(1 / math.sqrt(d_model), rel=0.05), (d_model, d_head, via)
            assert float(draws.std()) < 0.25 * float(draws.mean())  # narrower as d_head grows
            assert float(draws.quantile(0.95)) < 0.5 * math.sqrt(d_head / d_model)
    first = baseline(32, 8, "k", n_draws=20)
    first[0] = 99.0  # a copy: the memo is not the caller's
    torch.testing.assert_close(baseline(32, 8, "k", n_draws=20), baseline(32, 8, "k", n_draws=20, seed=0))
    assert float(baseline(32, 8, "k", n_draws=20)[0]) != 99.0
    assert not torch.equal(baseline(32, 8, "k", n_draws=20), baseline(32, 8, "k", n_draws=20, seed=1))


def test_composition_refuses_bad_input(induction):
    with pytest.raises(BadInput, match="at least two layers"):
        composition_scores(constructed.single_head("previous_token", d_vocab=8, n_ctx=8))
    with pytest.raises(BadInput, match=r"via 'x'; expected some of \['q', 'k', 'v'\]"):
        composition_scores(induction, vias=("q", "x"))
    with pytest.raises(BadInput, match="has no W_Q"):
        composition_scores(nn.Linear(3, 3))
    with pytest.raises(BadInput, match="n_draws=1"):
        composition_scores(induction, n_draws=1)
    with pytest.raises(BadInput, match="via 'o'"):
        baseline(16, 4, "o")
    assert composition_module.N_DRAWS == 200
