"""The constructed circuits whose edges are known (`interp.models.constructed`: induction, V-composition, an
unread head): their `metadata["edges"]` are exactly what path patching finds, and their heads do what they say."""
from __future__ import annotations

import math

import pytest
import torch
from factories import CONSTRUCTED_VOCAB, induction_prompts, period3_prompts

import interp
from interp.analyses.circuits import direct_logit_attribution
from interp.models import constructed
from interp.paths import EdgePatch, graph


@pytest.fixture(scope="module")
def induction():
    return constructed.induction_circuit()


@pytest.fixture(scope="module")
def v_circuit():
    return constructed.v_composition_circuit()


@pytest.fixture(scope="module")
def unread():
    return constructed.unread_head_circuit()



@pytest.mark.parametrize("name, prompts", [("induction", induction_prompts), ("v_circuit", period3_prompts),
                                           ("unread", induction_prompts)])
def test_constructed_circuit_edges_are_exactly_those_a_path_patch_finds(name, prompts, request):
    """metadata["edges"] is exact: patching any listed edge (resampled sender) changes the loss by nats, every
    other edge of the graph by nothing."""
    model = request.getfixturevalue(name)
    run = interp.Run(model, prompts(12))
    edges = graph(model)
    effects = run.effects([EdgePatch((edge,)) for edge in edges])
    found = sorted(edge.label for edge, effect in zip(edges, effects) if abs(effect.mean) > 1e-4)
    assert found == sorted(model.metadata["edges"])
    assert min(effect.mean for edge, effect in zip(edges, effects) if edge.label in found) > 1.0
    assert max(abs(effect.mean) for edge, effect in zip(edges, effects) if edge.label not in found) < 1e-6


def test_v_composition_circuit_predicts_the_token_two_back(v_circuit):
    """Period-3 prompts: the second and later copies cost nothing; each essential head ablated alone (zero)
    costs ln(d_vocab - 1) there, each dispensable head nothing. Truth and metadata as the other builders."""
    assert v_circuit.truth == {"L0H0": "previous_token", "L0H1": "first_token", "L0H2": "self_token",
                               "L0H3": "uniform", "L1H0": "previous_token", "L1H1": "first_token",
                               "L1H2": "self_token", "L1H3": "uniform"}
    assert v_circuit.metadata["edges"] == ["embed -> L0H0 via v", "L0H0 -> L1H0 via v", "L1H0 -> logits"]
    run = interp.Run(v_circuit, period3_prompts(8))
    assert float(run.clean().max()) < 1e-6
    for head in v_circuit.metadata["essential_heads"]:
        assert run.effect(interp.HeadAblation(head, "zero")).mean == pytest.approx(math.log(CONSTRUCTED_VOCAB - 1), rel=1e-4)
    for head in v_circuit.metadata["dispensable_heads"]:
        assert abs(run.effect(interp.HeadAblation(head, "zero")).mean) < 1e-6
    # a single previous-token head would predict the token one back: wrong on period 3, so the model needs both


def test_unread_head_circuit_has_a_previous_token_decoy_that_nothing_reads(unread, induction):
    assert unread.truth == {"L0H0": "previous_token", "L0H1": "previous_token", "L1H0": "induction", "L1H1": "uniform"}
    assert unread.metadata["unread_heads"] == ["L0H1"] and unread.metadata["edges"] == induction.metadata["edges"]
    prompts = induction_prompts(8)
    with torch.no_grad():
        _, cache = unread.run_with_cache(prompts.tokens, names_filter="blocks.0.attn.hook_pattern")
    pattern = cache["blocks.0.attn.hook_pattern"]  # (batch, head, query, key)
    torch.testing.assert_close(pattern[:, 1], pattern[:, 0])  # the decoy's pattern is L0H0's
    run = interp.Run(unread, prompts)
    assert run.clean().tolist() == pytest.approx(interp.Run(induction, prompts).clean().tolist(), abs=1e-6)
    assert run.effect(interp.HeadAblation("L0H1", "zero")).mean == 0.0
    assert run.effect(interp.HeadAblation("L0H0", "zero")).mean > 1.0
    frame = direct_logit_attribution(run).set_index("component")
    assert frame.loc["L0H1", "mean"] == 0.0 and frame.loc["L1H0", "mean"] > 20
