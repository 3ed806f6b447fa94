"""The causal check of a QK attribution: removing a pair's sources from only that side of the head's input,
with the norm's scale frozen, changes the score by exactly the attributed term; live, by what the norm makes
of it."""
import copy
import json

import numpy as np
import pytest
import torch
from factories import induction_prompts, random_gpt
from hf_families import VOCAB, converted

import interp
from interp.analyses import qk
from interp.errors import BadInput
from interp.hooks import live_hooks

EPS32 = torch.finfo(torch.float32).eps


def rounding(att: qk.QKAttribution) -> float:
    """What float32 rounding of four scores can add up to, for this attribution's scores."""
    scores = np.abs(att.pairs[["score", "against_score"]].to_numpy())
    return 32 * EPS32 * float(np.nanmax(scores))


def test_frozen_measurement_is_the_prediction_and_live_differs_on_a_layernorm_model(toy):
    prompts = interp.data.repeated_tokens(8, 12, 255, bos=255, seed=4)
    att = qk.attribute(toy, prompts, "L1H3", query=-1, key=13)
    result = att.check(interp.Run(toy, prompts), n=4)
    assert len(result.pairs) == 4 and result.pairs[0][1] == "L0H2"
    assert result.frozen_error <= rounding(att)
    assert result.measured_frozen == pytest.approx(result.predicted, abs=4 * rounding(att))
    assert not torch.allclose(result.live_values, result.frozen_values, atol=1e-3)  # the norm's scale matters
    assert 0 < result.explained <= 1.5
    frame = result.frame()
    assert list(frame["query_source"])[-1] == "top 4" and frame["n_prompts"].eq(8).all()
    assert frame.attrs["explained"] == pytest.approx(result.explained)
    assert live_hooks(toy) == []


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa-biases", "neox-partial-rotary-parallel"])
def test_frozen_measurement_holds_on_converted_families(family):
    model = converted(family)
    prompts = interp.data.random_tokens(3, 9, VOCAB, seed=6)
    att = qk.attribute(model, prompts, "L2H1", query=[7, 8])
    result = att.check(interp.Run(model, prompts), n=6)
    assert result.frozen_error <= rounding(att), (result.pairs, result.frozen_error)


def test_no_norm_means_frozen_and_live_agree(induction):
    prompts = induction_prompts(4)
    att = qk.attribute(induction, prompts, "L1H0", query=list(range(12, 21)))
    result = att.check(interp.Run(induction, prompts), n=2)
    assert result.pairs == (("tok_embed", "L0H0"), ("b_Q", "pos_embed"))
    torch.testing.assert_close(result.live_values, result.frozen_values)
    assert result.measured_frozen == pytest.approx(result.predicted, abs=1e-4)


@pytest.mark.parametrize("norm, variant", [("LN", {}), ("RMS", {"positional_embedding_type": "rotary",
                                                                  "n_key_value_heads": 1})])
def test_removing_each_kind_of_source_changes_the_score_by_its_row(norm, variant):
    """Every kind of source (embedding, head, b_O, MLP, norm bias, projection bias), removed from one side with the
    scale frozen, takes exactly its row (query) or column (key) of the score's terms: with learned positions, and
    with rotary positions and a key head shared by both query heads."""
    model = random_gpt(norm, **variant)
    prompts = interp.data.random_tokens(3, 8, 20, seed=9)
    att = qk.attribute(model, prompts, "L2H1", query=6, key=3)
    values, _ = att.per_prompt("score")  # (prompt, query_source, key_source)
    run = interp.Run(model, prompts).with_behaviour(qk.score_behaviour(att, prompts, "score"))
    for side, names in (("q", att.query_sources), ("k", att.key_sources)):
        for index, name in enumerate(names):
            removal = qk.SourceRemoval(2, 1, (name,) if side == "q" else (), (name,) if side == "k" else ())
            expected = -(values[:, index].sum(1) if side == "q" else values[:, :, index].sum(1))
            measured = run.effect(removal).values
            torch.testing.assert_close(measured, expected, rtol=0, atol=rounding(att), msg=f"{side} {name}")


def test_source_removal_is_plain_data_and_checks_its_sources(toy):
    removal = qk.SourceRemoval(1, 0, ("embed", "L0H2"), ("L0H2",), frozen=False)
    spec = removal.spec()
    assert json.loads(json.dumps(spec)) == {"intervention": "qk_source_removal", "head": "L1H0", "norm_scale": "live",
                                            "query_sources": ["L0H2", "embed"], "key_sources": ["L0H2"]}
    with pytest.raises(BadInput, match=r"at least one side"):
        qk.SourceRemoval(1, 0)
    prompts = interp.data.random_tokens(2, 6, 255, seed=0)
    run = interp.Run(toy, prompts)
    with pytest.raises(BadInput, match=r"L1H0's key has no source 'MLP0'; its sources: embed, L0H0"):
        run.effect(qk.SourceRemoval(1, 0, (), ("MLP0",)))
    assert live_hooks(toy) == [] and live_hooks(run.model) == []


def test_check_refuses_a_run_that_was_not_attributed(toy):
    prompts = interp.data.repeated_tokens(4, 6, 255, bos=255, seed=1)
    att = qk.attribute(toy, prompts, "L1H0", query=-1)
    with pytest.raises(BadInput, match=r"Run's prompts are not the ones attributed"):
        att.check(interp.Run(toy, interp.data.repeated_tokens(4, 6, 255, bos=255, seed=2)))
    other = copy.deepcopy(toy)
    with torch.no_grad():
        other.blocks[1].attn.W_Q[0] *= 1.5
    with pytest.raises(BadInput, match=r"Run's model gives scores .* away from the attributed ones"):
        att.check(interp.Run(other, prompts))
    with pytest.raises(BadInput, match=r"check\(n=0\)"):
        att.check(interp.Run(toy, prompts), n=0)
    with pytest.raises(BadInput, match=r"expected an interp.Run"):
        att.check(toy)
    with pytest.raises(BadInput, match=r"at least 2 prompts"):
        qk.attribute(toy, prompts[0], "L1H0", query=-1).check(interp.Run(toy, prompts[0]))


def test_the_score_view_checks_the_raw_score(toy):
    prompts = interp.data.repeated_tokens(4, 6, 255, bos=255, seed=3)
    att = qk.attribute(toy, prompts, "L1H1", query=-1)
    result = att.check(interp.Run(toy, prompts), n=3, view="score")
    assert result.view == "score" and result.frozen_error <= rounding(att)
    torch.testing.assert_close(result.total_values, torch.tensor(att.pairs["score"].to_numpy()), atol=1e-4, rtol=0)
