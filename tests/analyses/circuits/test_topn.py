"""The top-n circuits of a ranking (`interp.analyses.circuits.topn`): MIB's fractions, n = int(fraction x edges) from the
top, ties in graph order, dangling edges pruned."""
from interp.analyses.circuits.topn import MIB_FRACTIONS, prune, ranked, top_n
from interp.paths import parse_edge

EDGES = [parse_edge(e) for e in ["embed -> L0H0 via v", "L0H0 -> L1H0 via k", "embed -> L1H0 via v", "L1H0 -> logits",
                                 "L0H1 -> L1H0 via q", "embed -> L0H2 via q"]]


def test_prune_drops_edges_that_carry_nothing():
    # L0H1 has no kept input (it computes its corrupted output); L0H2 has no kept output
    assert {e.label for e in prune(set(EDGES))} == {e.label for e in EDGES[:4]}


def test_ranked_orders_by_score_or_its_size_ties_in_graph_order():
    scores = {e.label: s for e, s in zip(EDGES, [-5.0, 3.0, 0.0, 1.0, 3.0, 0.0])}
    assert [e.label for e in ranked(scores, EDGES, absolute=False)][:3] == [EDGES[1].label, EDGES[4].label, EDGES[3].label]
    assert ranked(scores, EDGES, absolute=True)[0] == EDGES[0]
    assert ranked(scores, EDGES, absolute=True)[-2:] == [EDGES[2], EDGES[5]]  # the zeros, in graph order


def test_top_n_selects_int_fraction_of_the_edges_then_prunes():
    assert MIB_FRACTIONS[0] == 0.001 and MIB_FRACTIONS[-1] == 1.0 and len(MIB_FRACTIONS) == 10
    selected, kept = top_n(EDGES, (0.1, 0.5, 0.7, 1.0))
    assert selected == [0, 3, 4, 6]
    assert kept[0] == frozenset() and kept[1] == frozenset()  # the first three leave L1H0 with no output: all pruned
    assert kept[2] == frozenset(EDGES[:4]) and kept[3] == frozenset(EDGES[:4])


def test_a_key_value_heads_outputs_are_its_query_heads():
    """Grouped-query attention: an edge into L1KV0 is live while a head of its group (L1H0, L1H1) has a kept output,
    and a head of the group has input when its key/value head has a kept edge, even with no query edge kept."""
    from interp.errors import BadInput
    from interp.paths import Node

    readers = {Node(1, "kv", 0): (Node(1, "head", 0), Node(1, "head", 1))}
    edges = {parse_edge(e) for e in ["embed -> L0H0 via v", "L0H0 -> L1KV0 via k", "L1H1 -> logits", "embed -> L1KV0 via v"]}
    assert prune(edges, readers=readers) == edges  # L1H1 reads L1KV0 and writes the logits: all live
    unread = {parse_edge("L0H0 -> L1KV0 via k"), parse_edge("embed -> L0H0 via v"), parse_edge("L1H2 -> logits")}
    assert prune(unread, readers=readers) == set()  # no head of group 0 has an output; L1H2 has no input
    import pytest

    with pytest.raises(BadInput, match=r"key/value heads \['L1KV0'\] need their query heads"):
        prune(edges)
    selected, kept = top_n(sorted(edges), (1.0,), readers)
    assert kept[0] == frozenset(edges)
