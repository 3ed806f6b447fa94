"""Circuit discovery and circuit tests (`interp.analyses.circuits.discovery`, `.evaluation`): ACDC recovers
exactly the hand-set edges of the constructed induction circuit; EAP misses the query edge there (saturated
softmax: no gradient through the pattern); faithfulness, completeness and minimality have known answers."""
import json

import pytest

import interp
from interp.analyses.circuits import ACDC_THRESHOLD, Circuit, discover, test_circuit
from interp.analyses.circuits.discovery import prune
from interp.data import repeated_tokens
from interp.errors import BadInput
from interp.models.constructed import induction_circuit
from interp.paths import parse_edge

from tests.test_circuit_patching import INDUCTION_EDGES


@pytest.fixture(scope="module")
def model():
    return induction_circuit()


@pytest.fixture(scope="module")
def prompts():
    return repeated_tokens(32, 10, 63, bos=63)


@pytest.fixture(scope="module")
def acdc_circuit(model, prompts):
    return discover(model, prompts, method="acdc")


def test_acdc_recovers_exactly_the_hand_set_edges(acdc_circuit):
    assert set(acdc_circuit.edges) == INDUCTION_EDGES
    assert acdc_circuit.nodes == ("embed", "L0H0", "L1H0", "logits")
    assert acdc_circuit.method == "acdc" and acdc_circuit.threshold == ACDC_THRESHOLD and acdc_circuit.n_prompts == 16
    frame = acdc_circuit.frame()
    assert len(frame) == 81 and frame.in_circuit.sum() == 5  # every edge of the model scored
    others = frame[~frame.in_circuit]
    assert others.score.abs().max() < 1e-4  # nothing else carries anything
    assert frame[frame.in_circuit].score.abs().min() > 5 * acdc_circuit.tau


def test_the_held_out_test_of_the_true_circuit(acdc_circuit):
    result = acdc_circuit.test
    assert result.n_prompts == 16 and result.n_edges == 5
    assert result.faithfulness.mean == pytest.approx(1.0, abs=1e-4)
    assert result.faithfulness.ci_low == pytest.approx(1.0, abs=1e-3)
    assert result.completeness.mean == pytest.approx(0.0, abs=1e-4)
    assert len(result.completeness_frame) >= 3  # every single node (embed, L0H0, L1H0), then random subsets
    assert result.minimal and result.minimality.mean > 5  # the cheapest kept edge still costs > 5 nats
    frame = result.frame()
    assert list(frame.test) == ["faithfulness", "completeness", "minimality"]
    assert {"value", "ci_low", "ci_high", "n_prompts", "unit"} <= set(frame.columns)


def test_eap_misses_the_query_edge_of_a_saturated_circuit(model, prompts):
    circuit = discover(model, prompts, method="eap")
    # the induction head's pattern is saturated (score gap 40): no gradient reaches its query, so EAP sees
    # nothing there although patching it costs ~6.5 nats; every edge it keeps is a true edge
    assert set(circuit.edges) == INDUCTION_EDGES - {"embed -> L1H0 via q"}
    assert circuit.test.faithfulness.ci_high < 0.9  # so the held-out test says the circuit is incomplete


def test_circuit_tests_flag_missing_and_useless_edges(model, prompts):
    run = interp.Run(model, prompts)
    missing = test_circuit(run, sorted(INDUCTION_EDGES - {"L0H0 -> L1H0 via k"}), threshold=0.01)
    assert missing.faithfulness.ci_high < 0.9
    padded = test_circuit(run, sorted(INDUCTION_EDGES | {"L0H1 -> L1H0 via q"}), threshold=0.01)
    assert padded.faithfulness.mean == pytest.approx(1.0, abs=1e-4) and not padded.minimal
    useless = padded.minimality_frame.set_index(["sender", "receiver", "via"]).loc[("L0H1", "L1H0", "q")]
    assert useless.cost == pytest.approx(0, abs=1e-5) and not useless.minimal
    assert padded.minimality.mean == pytest.approx(0, abs=1e-5)  # the smallest removal cost is the useless edge's


def test_circuit_json_round_trip(acdc_circuit):
    text = acdc_circuit.to_json()
    data = json.loads(text)
    assert data["schema"] == "interp.circuit/1" and data["method"] == "acdc" and len(data["scores"]) == 81
    again = Circuit.from_json(text)
    assert again.edges == acdc_circuit.edges and again.nodes == acdc_circuit.nodes
    assert again.scores == pytest.approx(acdc_circuit.scores) and again.gap == pytest.approx(acdc_circuit.gap)
    assert again.test is None
    with pytest.raises(BadInput, match="missing"):
        Circuit.from_json('{"edges": []}')
    with pytest.raises(BadInput, match="not JSON"):
        Circuit.from_json("{")


def test_prune_drops_edges_that_carry_nothing():
    edges = {parse_edge(e) for e in ["embed -> L0H0 via v", "L0H0 -> L1H0 via k", "L1H0 -> logits",
                                     "L0H1 -> L1H0 via q", "embed -> L0H2 via q"]}
    # L0H1 has no kept input (it computes its corrupted output); L0H2 has no kept output
    assert {e.label for e in prune(edges)} == {"embed -> L0H0 via v", "L0H0 -> L1H0 via k", "L1H0 -> logits"}


def test_bad_input(model, prompts):
    with pytest.raises(BadInput, match="method='nope'"):
        discover(model, prompts, method="nope")
    with pytest.raises(BadInput, match="threshold=2"):
        discover(model, prompts, threshold=2)
    with pytest.raises(BadInput, match="threshold"):
        test_circuit(model, ["L1H0 -> logits"], prompts)  # a bare edge list has no threshold of its own
    with pytest.raises(BadInput, match="Circuit or a list"):
        test_circuit(model, 3, prompts, threshold=0.01)
    with pytest.raises(BadInput, match="does not read"):
        test_circuit(model, ["L1H0 -> L0H0 via q"], prompts, threshold=0.01)
    assert test_circuit.__test__ is False


from interp.models.constructed import unread_head_circuit, v_composition_circuit  # noqa: E402

BUILDERS = {  # each hand-set circuit, its prompts (equal lengths: resampling needs donors of the same length)
    "v-composition": (v_composition_circuit, lambda: repeated_tokens(16, 3, 63, bos=63, n_repeats=4)),
    "unread-head": (unread_head_circuit, lambda: repeated_tokens(16, 10, 63, bos=63)),
}  # the induction circuit's: the tests above


@pytest.mark.parametrize("name", BUILDERS)
def test_path_patching_and_acdc_recover_the_metadata_edges(name):
    builder, make_prompts = BUILDERS[name]
    model, prompts = builder(), make_prompts()
    truth = set(model.metadata["edges"])
    run = interp.Run(model, prompts)
    from interp.analyses.circuits import edge_effects
    from interp.paths import graph

    edges = graph(model)
    effects = edge_effects(run, edges)
    assert {e.label for e, effect in zip(edges, effects) if abs(effect.mean) > 1e-3} == truth
    assert min(abs(effect.mean) for e, effect in zip(edges, effects) if e.label in truth) > 1.0  # nats
    circuit = discover(run, method="acdc")
    assert set(circuit.edges) == truth
    assert circuit.test.faithfulness.mean == pytest.approx(1.0, abs=1e-3) and circuit.test.minimal


# ---- head-level discovery (heads and MLPs as nodes) and ACDC's budget


def test_patching_a_node_equals_patching_all_its_outgoing_edges(model, prompts):
    """PatchSweep.node_values at the node's output against PatchSweep.values of every edge it sends."""
    import torch

    from interp.analyses.circuits.patching import PatchSweep
    from interp.paths import graph, parse_node

    sweep = PatchSweep(interp.Run(model, prompts))
    every = graph(model)
    for sets in (["L0H0"], ["L1H0"], ["L0H0", "L1H2"], ["embed"]):
        nodes_ = [parse_node(n) for n in sets]
        outgoing = [e for e in every if e.sender in nodes_]
        torch.testing.assert_close(sweep.node_values([nodes_])[0], sweep.values([outgoing])[0], atol=1e-5, rtol=1e-5)


def test_nodes_discovery_keeps_the_circuits_heads(model, prompts):
    circuit = discover(model, prompts, method="nodes")
    assert circuit.nodes == ("embed", "L0H0", "L1H0", "logits") and circuit.method == "nodes"
    assert INDUCTION_EDGES <= set(circuit.edges)  # every edge between the kept nodes
    assert circuit.test.faithfulness.mean == pytest.approx(1.0, abs=1e-3)
    frame = circuit.frame()  # each edge scored with its sender's removal effect
    assert frame[frame.sender == "L1H0"].score.abs().min() > 5 * circuit.tau


def test_discovery_with_a_corrupted_source_splits_it_row_for_row(model, prompts):
    source = repeated_tokens(32, 10, 63, bos=63, seed=9)
    circuit = discover(model, prompts, method="nodes", source=source)
    assert circuit.nodes == ("embed", "L0H0", "L1H0", "logits") and circuit.test.n_prompts == 16
    with pytest.raises(BadInput, match=r"source has shape \(8, 21\); expected the prompts' \(32, 21\)"):
        discover(model, prompts, method="nodes", source=source[:8])


def test_acdc_above_its_edge_budget_is_refused_with_an_estimate(model, prompts):
    with pytest.raises(BadInput, match=r"ACDC patches each of the model's 81 edges once, about [\d.]+ h here .*above its "
                                       r"budget of 10 edges. Use method='nodes'.*--max-edges"):
        discover(model, prompts, method="acdc", max_edges=10)


def test_node_level_test_equals_the_edge_level_test_of_a_node_circuit(model, prompts):
    """For a circuit of every edge between some nodes, patching the nodes outside it is patching its outside edges
    (an edge into a patched node changes nothing any reader sees): the same faithfulness, node by node minimality."""
    from interp.analyses.circuits import test_node_circuit

    circuit = discover(model, prompts, method="nodes", split=False)
    by_edges, by_nodes = test_circuit(model, circuit, prompts), test_node_circuit(model, circuit, prompts)
    assert by_nodes.faithfulness.mean == pytest.approx(by_edges.faithfulness.mean, abs=1e-4)
    assert by_nodes.circuit_only == pytest.approx(by_edges.circuit_only, abs=1e-4)
    assert by_nodes.all_patched == pytest.approx(by_edges.all_patched, abs=1e-4)
    assert set(by_nodes.minimality_frame.sender) == {"L0H0", "L1H0"} and by_nodes.minimal
    assert circuit.method == "nodes"
