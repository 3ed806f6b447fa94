"""The circuit drawing: layout by layer, edge labels, bad tables (independent of how the edges were found)."""
import warnings

import numpy as np
import pandas as pd
import pytest

from interp.analyses.circuits.drawing import VIA_COLOURS, circuit_layout, draw_circuit, edge_label
from interp.errors import BadInput

EDGES = pd.DataFrame([
    ("embed", "L0H2", "k", 0.2, 0.1, 0.3),
    ("L0H2", "L1H2", "k", 2.07, 1.95, 2.2),
    ("L0H2", "L1H2", "v", 2.03, 1.93, 2.12),
    ("L0H0", "L1H2", "q", 1.84, 1.71, 1.96),
    ("L0H2", "MLP0", "in", 0.5, 0.4, 0.6),
    ("L1H2", "logits", "direct", 4.0, 3.9, 4.1),
], columns=["sender", "receiver", "via", "effect", "ci_low", "ci_high"]).assign(unit="nats")


def test_layout_puts_layers_in_columns_and_heads_before_the_mlp():
    positions = circuit_layout(EDGES)
    assert positions["embed"] == (0.0, 0.0) and positions["logits"] == (3.0, 0.0)
    # layer 0 holds L0H0, L0H2, MLP0 top to bottom, centred on 0
    assert [positions[n] for n in ("L0H0", "L0H2", "MLP0")] == [(1.0, 1.0), (1.0, 0.0), (1.0, -1.0)]
    assert positions["L1H2"] == (2.0, 0.0)
    assert set(positions) == {"embed", "L0H0", "L0H2", "MLP0", "L1H2", "logits"}  # only nodes an edge touches


def test_edge_labels_name_the_input_and_the_effect():
    assert edge_label("k", 6.19) == "k +6.19"
    assert edge_label("q", -0.0123, -0.02, -0.004) == "q -0.0123 [-0.02, -0.004]"


def test_draw_circuit_draws_every_edge_with_its_label_and_every_node():
    fig = draw_circuit(EDGES, title="toy", show_ci=True)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert "k +2.07 [1.95, 2.2]" in texts and "direct +4 [3.9, 4.1]" in texts and "in +0.5 [0.4, 0.6]" in texts
    assert {"embed", "L0H0", "L0H2", "MLP0", "L1H2", "logits"} <= set(texts)
    assert len(ax.patches) == len(EDGES)  # one arrow per edge: q and k of one pair are two arrows
    colours = {tuple(round(c, 3) for c in p.get_edgecolor()[:3]) for p in ax.patches}
    assert len(colours) == 5  # q, k, v, in, direct each in its own colour
    assert ax.get_title() == "toy (edge effects in nats)"
    plain = draw_circuit(EDGES.drop(columns=["ci_low", "ci_high", "unit"]))
    assert "k +2.07" in [t.get_text() for t in plain.axes[0].texts] and set(VIA_COLOURS) == {"q", "k", "v", "in", "direct"}


def test_only_the_largest_edges_are_labelled():
    fig = draw_circuit(EDGES, max_labels=2)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert [t for t in texts if "+" in t] == ["k +2.07", "direct +4"] and len(fig.axes[0].patches) == len(EDGES)
    assert fig.axes[0].get_title().endswith("labels on the 2 largest of 6 edges")


def test_an_empty_circuit_says_so():
    fig = draw_circuit(EDGES.iloc[:0])
    assert [t.get_text() for t in fig.axes[0].texts] == ["no edges"]


@pytest.mark.parametrize("table, message", [
    (EDGES.drop(columns=["via"]), r"lacks \['via'\]"),
    (EDGES.assign(via="x"), r"via 'x'; expected one of"),
    (EDGES.assign(sender="head0"), r"'head0' is not a node"),
    ("L0H0 -> L1H0 via k", r"edges must be a DataFrame"),
])
def test_bad_tables(table, message):
    with pytest.raises(BadInput, match=message):
        draw_circuit(table)


def test_draw_curve_plots_the_rankings_with_their_areas(induction):
    """The signed ranking with its CI band, the |score| ranking and the random mean, each labelled with its area."""
    import interp
    from interp.analyses.circuits import draw_curve, faithfulness_curve
    from interp.data import repeated_tokens
    from interp.paths import graph

    scores = {edge.label: -float(i) for i, edge in enumerate(graph(induction))}  # graph order: any fixed ranking
    curve = faithfulness_curve(interp.Run(induction, repeated_tokens(8, 8, 63, bos=63)), scores, n_random=1)
    fig = draw_curve(curve, title="t")
    ax = fig.axes[0]
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels[0] == f"signed score: CPR {curve.cpr.mean:.3f} [{curve.cpr.ci_low:.3f}, {curve.cpr.ci_high:.3f}]"
    assert labels[1].startswith("|score|: CMD ") and labels[2].startswith("random (1): CPR ")
    assert [list(line.get_ydata()) for line in ax.get_lines()[:2]] == [
        list(curve.frame().query("ranking == @r").faithfulness) for r in ("signed", "absolute")]
    assert ax.get_xscale() == "log" and ax.get_title().startswith("t (given scores, 4 held-out prompts)")


def test_a_key_value_head_is_drawn_in_its_layers_column_below_the_heads():
    grouped = pd.DataFrame([("L0H0", "L1KV0", "k", 2.0), ("embed", "L1H0", "q", 1.0), ("L1H0", "logits", "direct", 3.0),
                            ("L0H0", "MLP1", "in", 0.1)], columns=["sender", "receiver", "via", "effect"])
    positions = circuit_layout(grouped)
    assert [positions[n] for n in ("L1H0", "L1KV0", "MLP1")] == [(2.0, 1.0), (2.0, 0.0), (2.0, -1.0)]
    assert draw_circuit(grouped) is not None


def test_the_frame_holds_every_arc_not_only_the_nodes():
    """Edges between the same two nodes bend apart, and an edge skipping columns along one row bows: an arc between
    far columns reaches beyond the outermost nodes, and the frame must still hold all of it (they were clipped)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    edges = pd.DataFrame([("embed", "L3H0", via, 1.0) for via in "qkv"] + [("L3H0", "logits", "direct", 2.0),
                          ("embed", "L0H0", "v", 1.0), ("L0H0", "L1H0", "k", 1.0), ("L1H0", "L2H0", "k", 1.0)],
                         columns=["sender", "receiver", "via", "effect"])
    fig = draw_circuit(edges)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. matplotlib ignoring our limits to keep the aspect
        FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    (x_low, x_high), (y_low, y_high) = ax.get_xlim(), ax.get_ylim()
    for arrow in ax.patches:
        points = np.concatenate(arrow.get_path().to_polygons(closed_only=False))  # the drawn curve in data coordinates
        assert (points[:, 1] >= y_low).all() and (points[:, 1] <= y_high).all(), arrow
        assert (points[:, 0] >= x_low).all() and (points[:, 0] <= x_high).all(), arrow
