"""interp.paths: the graph of a pre-norm transformer and edge patching, with known answers (a hand-set
induction circuit) and identities (patching every edge is the corrupted forward; patching every edge
out of one head is patching that head's output)."""
import dataclasses

import pytest
import torch

import interp
from interp.data import PromptSet, random_tokens, repeated_tokens
from interp.errors import BadInput
from interp.models import EncoderConfig, GPTConfig, HookedEncoder, HookedGPT, constructed
from interp.paths import (
    Edge,
    EdgePatch,
    Node,
    check_edges,
    donors,
    graph,
    nodes,
    parse_edge,
    parse_node,
    patch_edges,
    reads,
    receivers,
    sender_writes,
    write_hook,
)


@pytest.fixture(scope="module")
def circuit():
    model = constructed.induction_circuit()
    return model, repeated_tokens(32, 10, model.cfg.d_vocab - 1, bos=model.cfg.d_vocab - 1)


def small(**overrides) -> HookedGPT:
    cfg = dict(n_layers=2, n_heads=4, d_model=32, d_vocab=40, n_ctx=16, seed=0)
    return HookedGPT(GPTConfig(**{**cfg, **overrides})).eval()


# -- names


def test_nodes_and_edges_parse_and_print_back():
    assert [parse_node(s).label for s in ("embed", "l1h2", " MLP0 ", "logits")] == ["embed", "L1H2", "MLP0", "logits"]
    assert parse_edge("L0H0 -> L1H1 via K") == Edge(Node(0, "head", 0), Node(1, "head", 1), "k")
    assert parse_edge("MLP0->logits").via == "direct" and parse_edge("L0H1 -> MLP1").via == "in"
    for text in ("L0H0 -> L1H1 via k", "embed -> MLP0 via in", "L1H3 -> logits"):
        assert parse_edge(text).label == text.replace(" via in", "")
    assert sorted([parse_node("logits"), parse_node("L3H0"), parse_node("embed"), parse_node("MLP3")]) == [
        parse_node("embed"), parse_node("L3H0"), parse_node("MLP3"), parse_node("logits")]


@pytest.mark.parametrize("bad, match", [
    ("L0H0 -> L1H1", "needs 'via q'"), ("L0H0 => L1H1 via k", "is not an edge"), ("L0 -> L1H1 via k", "is not a node"),
    ("L0H0 -> L1H1 via x", "via 'x'"),
])
def test_malformed_edges_are_refused(bad, match):
    with pytest.raises(BadInput, match=match):
        parse_edge(bad)


def test_nodes_read_head_labels_with_the_one_parser():
    """Heads are read by interp.heads.parse_label, so a label the toolkit accepts elsewhere is a node here too."""
    assert parse_node("l1 h2") == parse_node("L1H2") == Node(1, "head", 2)
    assert parse_edge("L0 H0 -> L1 H1 via k") == parse_edge("L0H0 -> L1H1 via k")
    assert parse_edge("L0H0->L1H1 via K").label == "L0H0 -> L1H1 via k"


def test_key_value_head_labels_are_receivers():
    """'L1KV0' is read by the one label parser into a key/value head node: it receives (k and v) and writes nothing."""
    assert parse_node("L1KV0") == parse_node("l1 kv0") == Node(1, "kv", 0) and str(Node(1, "kv", 0)) == "L1KV0"
    assert parse_edge("L0H0 -> L1KV1 via V").label == "L0H0 -> L1KV1 via v"
    with pytest.raises(BadInput, match=r"into a key/value head needs 'via k' or 'via v'"):
        parse_edge("L0H0 -> L1KV0")
    with pytest.raises(BadInput, match="writes nothing"):
        write_hook(Node(1, "kv", 0))
    grouped = small(n_key_value_heads=2)
    with pytest.raises(BadInput, match="L1KV0 is a key/value head, which writes nothing"):
        check_edges(grouped, [parse_edge("L1KV0 -> logits")])
    assert Node(1, "kv", 0) not in nodes(grouped)  # senders / components only
    assert [n.label for n in receivers(grouped) if n.layer == 1] == ["L1H0", "L1H1", "L1H2", "L1H3", "L1KV0", "L1KV1",
                                                                     "MLP1"]
    assert receivers(small()) == [n for n in nodes(small()) if n.kind != "embed"]  # ungrouped: as before


def test_edges_the_model_lacks_are_refused(circuit):
    model, _ = circuit
    for bad, match in [("L1H0 -> L0H0 via k", "does not read L1H0"), ("L0H0 -> L1H0 via in", "reached via q / k / v"),
                       ("L0H9 -> L1H0 via k", "L0H9 does not exist"), ("L0H0 -> MLP1", "MLP1 does not exist")]:
        with pytest.raises(BadInput, match=match):
            check_edges(model, [parse_edge(bad)])


# -- the graph


def test_graph_of_an_attention_only_model(circuit):
    model, _ = circuit
    edges = graph(model)
    # layer-0 heads read the embeddings (3 inputs x 4 heads); layer-1 heads read embed and 4 heads; logits read all 9
    assert len(edges) == 4 * 3 * 1 + 4 * 3 * 5 + 9
    assert len(set(edges)) == len(edges) and all(reads(model, e.sender, e.receiver) for e in edges)
    assert [n.label for n in nodes(model)][:2] == ["embed", "L0H0"] and nodes(model)[-1].label == "logits"


def test_an_mlp_reads_its_own_layers_heads_unless_the_block_is_parallel():
    sequential, parallel = small(), small(parallel_attn_mlp=True)
    head, mlp = parse_node("L0H1"), parse_node("MLP0")
    assert reads(sequential, head, mlp) and not reads(parallel, head, mlp)
    assert reads(parallel, parse_node("MLP0"), parse_node("L1H0")) and not reads(sequential, mlp, parse_node("L0H0"))
    assert len(graph(parallel)) == len(graph(sequential)) - 8  # MLP0 and MLP1 each lose their layer's 4 heads


def test_grouped_query_models_have_query_edges_per_head_and_key_value_edges_per_kv_head():
    grouped = small(n_key_value_heads=2)
    into = [e for e in graph(grouped) if e.receiver.layer == 1 and e.receiver.kind != "mlp" and e.sender.label == "L0H0"]
    assert [e.label for e in into] == ["L0H0 -> L1H0 via q", "L0H0 -> L1H1 via q", "L0H0 -> L1H2 via q",
                                       "L0H0 -> L1H3 via q", "L0H0 -> L1KV0 via k", "L0H0 -> L1KV0 via v",
                                       "L0H0 -> L1KV1 via k", "L0H0 -> L1KV1 via v"]
    # k and v reach 2 key/value heads instead of 4 heads, from each sender: layer 0's (embed), layer 1's (6)
    assert len(graph(grouped)) == len(graph(small())) - 2 * 2 * (1 + 6)
    assert len({e for e in graph(grouped)}) == len(graph(grouped))


def ungrouped_copy(grouped: HookedGPT) -> HookedGPT:
    """The same function with each key/value head repeated for each of its query heads (no grouping): an
    independent model whose head h reads its own copy of kv head h // group."""
    cfg = grouped.cfg
    plain = HookedGPT(dataclasses.replace(cfg, n_key_value_heads=None)).eval()
    state = {}
    for name, tensor in grouped.state_dict().items():
        if name.split(".")[-1] in ("_W_K", "_W_V", "_b_K", "_b_V"):
            layer = int(name.split(".")[1])
            tensor = tensor.repeat_interleave(grouped.blocks[layer].attn.group, dim=0)
            name = name.replace("._", ".")
        state[name] = tensor
    plain.load_state_dict(state)
    return plain


def test_a_key_value_edge_is_the_k_input_of_every_head_of_its_group_patched_by_hand():
    """Known answer: patching 'L0H0 -> L1KV0 via k' on a grouped model equals patching L0H0 into the key input of
    L1H0 and L1H1 on the ungrouped copy (each head its own key head); its value input likewise."""
    grouped = small(n_key_value_heads=2, attn_only=True, init_range=0.3, seed=3)
    plain = ungrouped_copy(grouped)
    prompts = random_tokens(12, 6, d_vocab=40, seed=0)
    corrupted = random_tokens(12, 6, d_vocab=40, seed=1)
    assert torch.allclose(grouped(prompts.tokens), plain(prompts.tokens), atol=1e-5)
    for via in ("k", "v"):
        with patch_edges(grouped, [f"L0H0 -> L1KV0 via {via}", f"L0H2 -> L1KV1 via {via}"], prompts, corrupted):
            got = grouped(prompts.tokens)
        by_hand = [f"L0H0 -> L1H{h} via {via}" for h in (0, 1)] + [f"L0H2 -> L1H{h} via {via}" for h in (2, 3)]
        with patch_edges(plain, by_hand, prompts, corrupted):
            want = plain(prompts.tokens)
        with patch_edges(plain, by_hand[:1], prompts, corrupted):
            one_head = plain(prompts.tokens)
        assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, one_head, atol=1e-3)


def post_norm_encoder() -> HookedEncoder:
    return HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_vocab=20, n_ctx=8, seed=0, post_norm=True)).eval()


def test_models_without_a_sum_of_writes_are_refused(tiny_encoder):
    assert len(graph(tiny_encoder)) > 0  # a pre-norm encoder is a sum of writes: bidirectional, but a graph
    with pytest.raises(BadInput, match="pre-norm model"):
        graph(post_norm_encoder())
    with pytest.raises(BadInput, match="split q/k/v inputs"):
        graph(torch.nn.Linear(2, 2))


# -- patching: known answers


def test_path_patching_finds_the_hand_set_key_composition(circuit):
    model, prompts = circuit
    run = interp.Run(model, prompts)
    effect = {label: run.effect(EdgePatch((label,))) for label in (
        "L0H0 -> L1H0 via k", "L0H0 -> L1H0 via q", "L0H0 -> L1H0 via v", "L0H1 -> L1H0 via k", "L0H0 -> logits")}
    assert effect["L0H0 -> L1H0 via k"].ci_low > 3  # nats: the induction head loses its key
    for label in ("L0H0 -> L1H0 via q", "L0H0 -> L1H0 via v", "L0H1 -> L1H0 via k", "L0H0 -> logits"):
        assert abs(effect[label].mean) < 1e-4, label  # nothing reads these paths


def test_patching_from_the_prompts_themselves_changes_nothing(circuit):
    model, prompts = circuit
    effect = interp.Run(model, prompts).effect(EdgePatch(("L0H0 -> L1H0 via k",), source=prompts))
    assert effect.values.abs().max() < 1e-5


def test_an_edge_patch_is_memoised_by_its_edges_and_source(circuit):
    model, prompts = circuit
    one, other = EdgePatch(("L0H0 -> L1H0 via k", "L1H0 -> logits")), EdgePatch(("L1H0 -> logits", "L0H0->L1H0 via K"))
    assert one == other and one.spec() == other.spec()
    assert EdgePatch(("L0H0 -> L1H0 via k",), source=prompts).spec()["source"] != "resample"
    with pytest.raises(BadInput, match="at least one edge"):
        EdgePatch(())


# -- patching: identities on models with norms, rotary and MLPs


MODELS = {
    "rotary-attn-only": lambda: small(attn_only=True, positional_embedding_type="rotary"),
    "mlp": lambda: small(),
    "parallel-grouped": lambda: small(parallel_attn_mlp=True, n_key_value_heads=2, normalization_type="RMS"),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_patching_every_edge_is_the_corrupted_forward(name):
    model = MODELS[name]()
    clean, corrupted = (PromptSet(random_tokens(3, 10, 40, seed=seed).tokens) for seed in (1, 2))
    with torch.no_grad(), patch_edges(model, graph(model), clean, corrupted):
        patched = model(clean.tokens)
    torch.testing.assert_close(patched, model(corrupted.tokens), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(MODELS))
def test_patching_every_edge_out_of_a_head_is_patching_its_output(name):
    model = MODELS[name]()
    clean, corrupted = (PromptSet(random_tokens(3, 10, 40, seed=seed).tokens) for seed in (1, 2))
    sender = parse_node("L0H2")
    out_of = [edge for edge in graph(model) if edge.sender == sender]
    _, cache = model.run_with_cache(corrupted.tokens, names_filter=["blocks.0.attn.hook_z"])

    def replace(z, hook):  # (batch, pos, head, d_head)
        z = z.clone()
        z[:, :, 2] = cache["blocks.0.attn.hook_z"][:, :, 2]
        return z

    with torch.no_grad():
        by_hand = model.run_with_hooks(clean.tokens, fwd_hooks=[("blocks.0.attn.hook_z", replace)])
        with patch_edges(model, out_of, clean, corrupted):
            patched = model(clean.tokens)
    torch.testing.assert_close(patched, by_hand, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(patched, model(clean.tokens), atol=1e-3)


def test_sender_writes_are_the_cached_results():
    model = small()
    prompts = PromptSet(random_tokens(2, 8, 40, seed=3).tokens)
    writes = sender_writes(model, prompts, [parse_node("L1H3"), parse_node("MLP0"), parse_node("embed")])
    _, cache = model.run_with_cache(prompts.tokens)
    torch.testing.assert_close(writes[parse_node("L1H3")], cache["blocks.1.attn.hook_result"][:, :, 3])
    torch.testing.assert_close(writes[parse_node("MLP0")], cache["blocks.0.hook_mlp_out"])
    torch.testing.assert_close(writes[parse_node("embed")], cache["blocks.0.hook_resid_pre"])


# -- donors


def test_donors_are_a_derangement_within_equal_lengths():
    tokens = torch.arange(60).reshape(6, 10) % 40
    mask = torch.ones(6, 10, dtype=torch.long)
    mask[3:, 7:] = 0  # prompts 3-5 have 7 real tokens
    prompts = PromptSet(tokens, attention_mask=mask)
    donor = donors(prompts, seed=0)
    assert all(int(donor[i]) != i for i in range(6))
    assert set(donor[:3].tolist()) == {0, 1, 2} and set(donor[3:].tolist()) == {3, 4, 5}
    assert torch.equal(donor, donors(prompts, seed=0)) and not torch.equal(donor, donors(prompts, seed=1))
    mask[5, 5:] = 0
    with pytest.raises(BadInput, match="prompt 5 is the only one of 5 real tokens"):
        donors(PromptSet(tokens, attention_mask=mask), seed=0)


def test_a_corrupted_set_of_another_shape_is_refused(circuit):
    model, prompts = circuit
    with pytest.raises(BadInput, match="one corrupted prompt per prompt"):
        interp.Run(model, prompts).effect(EdgePatch(("L0H0 -> L1H0 via k",), source=prompts[:4]))


def test_a_post_norm_encoder_is_refused_by_edge_patching():
    encoder = post_norm_encoder()
    prompts = PromptSet(random_tokens(4, 6, 20, seed=0).tokens)
    with pytest.raises(BadInput, match="post-norm"):
        interp.Run(encoder, prompts).effect(EdgePatch(("L0H0 -> L1H1 via k",)))


def test_as_edges_takes_one_label_or_many_and_names_what_is_not_an_edge():
    from interp.paths import as_edges

    assert as_edges("L0H0 -> L1H1 via k", "f") == [parse_edge("L0H0 -> L1H1 via k")]
    assert as_edges(["L1H0 -> logits", "L1H0->LOGITS", parse_edge("L0H0 -> L1H1 via q")], "f") == [
        parse_edge("L1H0 -> logits"), parse_edge("L0H0 -> L1H1 via q")]  # duplicates dropped, order kept
    for bad, match in [(5, r"f: edges=5 \(int\); expected an edge label"), ([None], r"f: None \(NoneType\) is not an edge"),
                       ({"L1H0 -> logits": 1}, r"f: edges=\{.*\(dict\)")]:
        with pytest.raises(BadInput, match=match):
            as_edges(bad, "f")


def test_kv_edge_names_a_grouped_heads_key_value_input_by_its_key_value_head():
    from interp.paths import kv_edge, refuse_kv_alias

    alias = parse_edge("L0H0 -> L1H3 via v")
    assert kv_edge(alias, 2) == parse_edge("L0H0 -> L1KV1 via v") and kv_edge(alias, 4) == parse_edge("L0H0 -> L1KV0 via v")
    assert kv_edge(alias, 1) == alias  # no grouping
    for own in ("L0H0 -> L1H3 via q", "L0H0 -> L1KV1 via k", "L1H3 -> logits"):
        assert kv_edge(parse_edge(own), 2) == parse_edge(own)
        refuse_kv_alias(parse_edge(own), 2, 2)
    with pytest.raises(BadInput, match=r"heads L1H2..L1H3 share one value head \(L1KV1\).*use 'L0H0 -> L1KV1 via v'"):
        refuse_kv_alias(alias, 2)
    grouped, plain = small(n_key_value_heads=2), small()
    for model, bad, match in [
        (grouped, alias, "use 'L0H0 -> L1KV1 via v'"),
        (grouped, "L0H0 -> L1H1 via k", "use 'L0H0 -> L1KV0 via k'"),
        (grouped, "L0H0 -> L1KV0 via q", r"reached via k or v only; the query heads reading L1KV0 are L1H0..L1H1"),
        (grouped, "L0H0 -> L1KV2 via k", r"layer 1 has 2 key/value heads \(L1KV0..L1KV1\); L1KV2 does not exist"),
        (plain, "L0H0 -> L1KV0 via k", r"own key/value head\), so it has no key/value head L1KV0: use 'L0H0 -> L1H0 via k'"),
    ]:
        with pytest.raises(BadInput, match=match):
            check_edges(model, [parse_edge(bad)])
        with pytest.raises(BadInput, match=match):
            parse_edge(bad, model)
    check_edges(grouped, graph(grouped))  # every edge of the graph is its own name

def test_the_split_inputs_refusal_names_the_users_class_not_the_hooked_one():
    """An intercepted model runs as a subclass made for the hooks (SDPAHookedRotaryGPT); the refusal names the class
    its user wrote."""
    from own_models import rotary_gpt_trained

    from interp.loading import load
    from interp.paths import check_graph_model

    model = load(rotary_gpt_trained())
    assert type(model).__name__ == "SDPAHookedRotaryGPT"
    with pytest.raises(BadInput) as refused:
        check_graph_model(model)
    assert "RotaryGPT has none" in str(refused.value) and "SDPAHooked" not in str(refused.value)
