"""Path patching (`interp.analyses.circuits.patching`): known answers on the hand-set induction circuit,
and `edge_effects` (resumed from the receiver's layer, edge sets stacked) equal to `run.effect(EdgePatch)`."""
import pytest
import torch
from factories import INDUCTION_EDGES

import interp
from interp.analyses.circuits import edge_effects, path_patch, path_patches
from interp.data import random_tokens, repeated_tokens
from interp.errors import BadInput
from interp.models import GPTConfig, HookedGPT
from interp.models.constructed import induction_circuit
from interp.paths import EdgePatch, graph, parse_edge


@pytest.fixture(scope="module")
def induction_run():
    return interp.Run(induction_circuit(), repeated_tokens(32, 10, 63, bos=63), batch_size=12)


def test_path_patch_of_the_key_edge_has_the_known_effect(induction_run):
    result = path_patch(induction_run, sender="L0H0", receiver="L1H0", via="k")
    row = result.frame().iloc[0]
    assert (row.sender, row.receiver, row.via, row.unit, row.n_prompts) == ("L0H0", "L1H0", "k", "nats", 32)
    assert row.effect == pytest.approx(6.19, abs=0.01) and row.ci_low > 4 and row.ci_high < 8.5
    assert result.values.shape == (32,)
    for via in "qv":  # L1H0's query and value do not read L0H0
        assert path_patch(induction_run, sender="L0H0", receiver="L1H0", via=via).effect.mean == pytest.approx(0, abs=1e-6)
    direct = path_patch(induction_run, sender="L1H0", receiver="logits")
    assert direct.edge.via == "direct" and direct.effect.mean > 20


def test_edge_effects_find_exactly_the_hand_set_edges(induction_run):
    edges = graph(induction_run.model)
    effects = edge_effects(induction_run, edges, stack=5)
    found = {edge.label for edge, effect in zip(edges, effects) if abs(effect.mean) > 1e-3}
    assert found == INDUCTION_EDGES
    assert all(abs(e.mean) < 1e-5 for edge, e in zip(edges, effects) if edge.label not in INDUCTION_EDGES)
    assert set(induction_run.model.metadata["edges"]) == INDUCTION_EDGES  # the builder's own list agrees


def test_path_patch_from_a_given_corrupted_set(induction_run):
    prompts = induction_run.prompts
    same = path_patch(induction_run, sender="L0H0", receiver="L1H0", via="k", source=prompts)
    assert same.effect.mean == pytest.approx(0, abs=1e-6) and same.source == "corrupted prompts"
    other = repeated_tokens(32, 10, 63, bos=63, seed=5)
    frame = path_patches(induction_run, edges=["L0H0 -> L1H0 via k"], source=other)
    exact = induction_run.effect(EdgePatch(("L0H0 -> L1H0 via k",), source=other))
    assert frame.effect.iloc[0] == pytest.approx(exact.mean, abs=1e-4) and exact.mean > 3


KINDS = {
    "mlp": dict(),
    "grouped-rotary": dict(n_key_value_heads=2, normalization_type="RMS", positional_embedding_type="rotary"),
    "parallel": dict(parallel_attn_mlp=True),
    "attn-only": dict(attn_only=True),
}


@pytest.mark.parametrize("kind", KINDS)
def test_edge_effects_equal_hooked_edge_patches(kind):
    model = HookedGPT(GPTConfig(n_layers=3, n_heads=4, d_model=32, d_vocab=40, n_ctx=16, seed=1, **KINDS[kind])).eval()
    run = interp.Run(model, random_tokens(10, 8, 40, seed=2), batch_size=4)
    edges = graph(model)
    picked = edges[:: max(1, len(edges) // 23)] + edges[-3:]
    sets = [*picked, picked[::4], edges]  # single edges, a mixed set, every edge
    fast = edge_effects(run, sets, stack=3)
    for item, effect in zip(sets, fast):
        exact = run.effect(EdgePatch(tuple([item] if not isinstance(item, list) else item)))
        assert effect.intervention == exact.intervention
        torch.testing.assert_close(effect.values, exact.values, rtol=1e-4, atol=2e-5)
    assert any(abs(e.mean) > 1e-3 for e in fast)  # random weights: edges matter


def test_bad_input_names_the_value(induction_run):
    with pytest.raises(BadInput, match="via 'x'"):
        path_patch(induction_run, sender="L0H0", receiver="L1H0", via="x")
    with pytest.raises(BadInput, match="does not read"):
        path_patch(induction_run, sender="L1H0", receiver="L0H1", via="q")
    with pytest.raises(BadInput, match="interp.Run"):
        edge_effects(induction_run.model, ["L0H0 -> L1H0 via k"])
    with pytest.raises(BadInput, match="stack"):
        edge_effects(induction_run, [parse_edge("L0H0 -> L1H0 via k")], stack=0)
    with pytest.raises(BadInput, match="pre-norm"):
        post = HookedGPT(GPTConfig(n_layers=2, n_heads=2, d_model=16, d_vocab=40, n_ctx=16, post_norm=True)).eval()
        path_patch(post, random_tokens(4, 6, 40), sender="L0H0", receiver="L1H0", via="k")


@pytest.mark.parametrize("item", [None, 5, 2.5])
def test_an_item_that_is_not_an_edge_is_named(induction_run, item):
    """a034 a035: not a raw "'NoneType' object is not iterable" but BadInput naming the item."""
    with pytest.raises(BadInput, match=rf"edge_effects: edges={item!r} \({type(item).__name__}\); expected an edge label"):
        edge_effects(induction_run, [item])
    with pytest.raises(BadInput, match=rf"edge_effects: {item!r} \({type(item).__name__}\) is not an edge"):
        edge_effects(induction_run, [["L0H0 -> L1H0 via k", item]])


def test_one_edge_string_is_one_edge(induction_run):
    """a024: edge_effects(run, 'L0H0 -> L1H0 via k') measures that edge, not its characters."""
    (one,) = edge_effects(induction_run, "L0H0 -> L1H0 via k")
    assert one.intervention["edges"] == ["L0H0 -> L1H0 via k"]
    assert one.mean == pytest.approx(path_patch(induction_run, sender="L0H0", receiver="L1H0", via="k").effect.mean)


GQA = dict(n_layers=2, n_heads=4, n_key_value_heads=2, d_model=32, n_ctx=32, d_vocab=20, attn_only=True, seed=1,
           init_range=0.3)
ALIAS = r"'L0H0 -> L1H1 via {via}' is not an edge of this model's graph: .*heads L1H0..L1H1 share one {which} head \(L1KV0\).*use 'L0H0 -> L1KV0 via {via}'"


@pytest.mark.parametrize("via, which", [("k", "key"), ("v", "value")])
def test_a_shared_key_value_input_named_by_the_wrong_head_is_refused(via, which):
    """g001 g003 g006 g005 g007: with grouped-query attention L1H1's key and value are L1H0's (key/value head L1KV0);
    the graph names them by L1KV0, and every entry point refuses a query head's name for them naming the graph's
    edge, instead of measuring the key/value head's number under one query head's label."""
    from interp.analyses.circuits import attribution_patching, test_circuit

    model = HookedGPT(GPTConfig(**GQA)).eval()
    prompts = repeated_tokens(8, 4, d_vocab=20, seed=0)
    run = interp.Run(model, prompts)
    alias, match = f"L0H0 -> L1H1 via {via}", ALIAS.format(via=via, which=which)
    with pytest.raises(BadInput, match=match):
        path_patch(run, sender="L0H0", receiver="L1H1", via=via)
    with pytest.raises(BadInput, match=match):
        edge_effects(run, [alias])
    with pytest.raises(BadInput, match=match):
        run.effect(EdgePatch([alias]))
    with pytest.raises(BadInput, match=match):
        test_circuit(run, [alias, f"L0H0 -> L1KV0 via {via}"], threshold=0.0)
    attribution = attribution_patching(run)
    with pytest.raises(BadInput, match=match):
        attribution.score(alias)
    assert isinstance(attribution.score(f"L0H0 -> L1KV0 via {via}"), float)
    kv = path_patch(run, sender="L0H0", receiver="L1KV0", via=via)
    assert kv.edge.label == f"L0H0 -> L1KV0 via {via}"
    assert edge_effects(run, [kv.edge])[0].mean == pytest.approx(kv.effect.mean)  # the sweep engine: the same number
    assert path_patch(run, sender="L0H0", receiver="L1H1", via="q").edge.label == "L0H0 -> L1H1 via q"  # its own
