"""A circuit drawn as a graph: nodes by layer, edges labelled with their input (q, k, v, in, direct) and effect.

    draw_circuit(edges)          # a matplotlib Figure (no display, no network)
    draw_curve(curve)            # MIB's faithfulness curve (`faithfulness_curve`) with its CIs and baseline

`edges` is a per-edge effect table, one row per edge: `sender`, `receiver`, `via`, `effect` (in the
behaviour's unit), optionally `ci_low`, `ci_high` (a CI over prompts) and `unit`, as
`interp.analyses.circuits.patching.edge_frame` gives and `circuit_layout` reads. The drawing knows nothing
of how the edges were found, so any edge list with effects can be drawn.

Layout: one column per layer in forward order (embed first, logits last), a layer's heads top to bottom by
index, its key/value heads (grouped-query attention: `L1KV0`, receivers of k and v edges) below them and its
MLP below those; only nodes that an edge touches are drawn. Each edge is an arrow from its
sender to its receiver, coloured by its input, its width growing with |effect|, labelled
"k +6.19" (the input and the effect); several edges between the same pair of nodes (a head read through
q and k) bend apart so each label stays readable.
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from interp.errors import BadInput
from interp.paths import Node, parse_node

VIA_COLOURS = {"q": "#4c72b0", "k": "#dd8452", "v": "#55a868", "in": "#8172b3", "direct": "#666666"}
REQUIRED = ("sender", "receiver", "via", "effect")
MAX_LABELS = 12  # edges labelled in one drawing (the largest |effect| first)
BENDS = (0.0, 0.35, -0.35, 0.6, -0.6)  # arc3 rad of the 1st, 2nd, ... edge between the same two nodes
COLUMN_GAP = 2.0  # drawing units between layers (rows are 1 apart): room for the labels on the arcs
INCHES = 1.4  # figure inches per drawing unit, the same both ways: arc3 bends in display units, so the aspect is 1


def check_edge_table(edges: pd.DataFrame) -> pd.DataFrame:
    """The edge table with its columns checked (a BadInput naming the missing ones) and its nodes parsed."""
    if not isinstance(edges, pd.DataFrame):
        raise BadInput(f"draw_circuit: edges must be a DataFrame with columns {list(REQUIRED)} (one row per edge, e.g. "
                       f"interp.analyses.circuits.patching.edge_frame); got {type(edges).__name__}.")
    missing = [c for c in REQUIRED if c not in edges.columns]
    if missing:
        raise BadInput(f"draw_circuit: the edge table lacks {missing}; expected columns {list(REQUIRED)} (and "
                       "optionally ci_low, ci_high, unit).")
    unknown = sorted(set(edges["via"]) - set(VIA_COLOURS))
    if unknown:
        raise BadInput(f"draw_circuit: via {unknown[0]!r}; expected one of {list(VIA_COLOURS)}.")
    for column in ("sender", "receiver"):
        for label in edges[column]:
            parse_node(str(label))  # a BadInput naming a label that is not a node
    return edges


def circuit_layout(edges: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Node label -> (x, y): x the node's column (embed 0, then each layer with a node, logits last), y from 0
    (top) down: heads by index, then key/value heads by index, then the MLP."""
    check_edge_table(edges)
    nodes = sorted({parse_node(str(label)) for label in (*edges["sender"], *edges["receiver"])})
    columns = sorted({node.layer for node in nodes})
    positions: dict[str, tuple[float, float]] = {}
    for x, layer in enumerate(columns):
        here = sorted((n for n in nodes if n.layer == layer), key=_row_key)
        for y, node in enumerate(here):
            positions[node.label] = (float(x), -float(y) + (len(here) - 1) / 2)  # each column centred on 0
    return positions


def _row_key(node: Node) -> tuple[int, int]:
    """Within a layer: heads by index, key/value heads by index, then the MLP (embed and logits are alone in their
    columns)."""
    return {"head": (0, node.head), "kv": (1, node.head)}.get(node.kind, (2, 0))


def edge_label(via: str, effect: float, ci_low: float = math.nan, ci_high: float = math.nan) -> str:
    """"k +6.19" (with " [5.24, 7.29]" when a CI is given): the input read and the effect."""
    text = f"{via} {effect:+.3g}"
    if math.isfinite(ci_low) and math.isfinite(ci_high):
        text += f" [{ci_low:.3g}, {ci_high:.3g}]"
    return text


def draw_circuit(edges: pd.DataFrame, *, title: str = "circuit", unit: str | None = None, show_ci: bool = False,
                 max_labels: int = MAX_LABELS, ax: Any = None) -> Any:
    """The circuit as a matplotlib Figure (see the module); `show_ci` adds each edge's CI to its label. Only the
    `max_labels` edges of largest |effect| are labelled (the title says so when some are not): beyond a dozen
    the labels cover one another; the table beside the drawing has every edge. An empty table draws an empty
    frame that says so."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch

    positions = {node: (COLUMN_GAP * x, y) for node, (x, y) in circuit_layout(edges).items()}
    arcs = _arcs(edges, positions)
    xs = [x for x, _ in positions.values()] + [x for _, x, _ in arcs]
    ys = [y for _, y in positions.values()] + [y for _, _, y in arcs]
    x_range = (min(xs, default=0.0) - 0.7, max(xs, default=0.0) + 0.7)
    y_range = (min(ys, default=0.0) - 0.7, max(ys, default=0.0) + 0.7)
    size = (max(4.0, INCHES * (x_range[1] - x_range[0])), max(2.6, INCHES * (y_range[1] - y_range[0]) + 0.5))
    fig = ax.figure if ax is not None else Figure(figsize=size, dpi=100)
    ax = ax or fig.add_subplot()
    unit = unit if unit is not None else (str(edges["unit"].iloc[0]) if "unit" in edges.columns and len(edges) else "")
    labelled = set(edges["effect"].abs().sort_values(ascending=False, kind="stable").index[:max_labels])
    hidden = len(edges) - len(labelled)
    what = "edge effects" if max_labels else "widths"  # unlabelled edges: the caller's title says what a width is
    ax.set_title(f"{title}" + (f" ({what} in {unit})" if unit else "")
                 + (f"\nlabels on the {len(labelled)} largest of {len(edges)} edges" if hidden and labelled else ""),
                 fontsize=9)
    ax.set_axis_off()
    if edges.empty:
        ax.text(0.5, 0.5, "no edges", ha="center", va="center", fontsize=9, transform=ax.transAxes)
        return fig
    largest = max(float(edges["effect"].abs().max()), 1e-12)
    for index, row, (bend, mx, my) in zip(edges.index, edges.itertuples(index=False), arcs):
        colour = VIA_COLOURS[str(row.via)]
        effect = float(row.effect)
        ax.add_patch(FancyArrowPatch(positions[str(row.sender)], positions[str(row.receiver)], arrowstyle="-|>",
                                     mutation_scale=10, connectionstyle=f"arc3,rad={bend}", color=colour, alpha=0.85,
                                     linewidth=0.8 + 3.2 * abs(effect) / largest, shrinkA=14, shrinkB=14))
        if index not in labelled:
            continue
        low = float(getattr(row, "ci_low", math.nan)) if show_ci else math.nan
        high = float(getattr(row, "ci_high", math.nan)) if show_ci else math.nan
        ax.text(mx, my, edge_label(str(row.via), effect, low, high), fontsize=7, ha="center", va="center", color=colour,
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
    for label, (x, y) in positions.items():
        ax.text(x, y, label, ha="center", va="center", fontsize=8,
                bbox={"boxstyle": "round,pad=0.3", "facecolor": "#f2f2f2", "edgecolor": "#333333"})
    ax.set_xlim(*x_range)
    ax.set_ylim(*y_range)
    ax.set_aspect("equal", adjustable="box")  # the axes box takes the aspect: the limits (every arc) are kept
    return fig


def _arcs(edges: pd.DataFrame, positions: dict[str, tuple[float, float]]) -> list[tuple[float, float, float]]:
    """Per edge, in the table's order: its arc's bend (arc3's rad) and the arc's midpoint, its farthest point from
    the chord, where its label goes and which the frame must hold. Edges of one pair (a head read through q and k)
    bend one way then the other, further out; an edge skipping a column along one row bows, so as not to run
    through the nodes between. arc3's control point is the chord's midpoint moved by rad x (dy, -dx), and a
    quadratic Bezier passes halfway to it (exact at an aspect of 1)."""
    pairs: dict[tuple[str, str], int] = {}
    out = []
    for row in edges.itertuples(index=False):
        sender, receiver = str(row.sender), str(row.receiver)
        rank = pairs.get((sender, receiver), 0)
        pairs[(sender, receiver)] = rank + 1
        (x0, y0), (x1, y1) = positions[sender], positions[receiver]
        bend = (0.25 if y0 == y1 and x1 - x0 > COLUMN_GAP else 0.0) + BENDS[rank % len(BENDS)]
        out.append((bend, (x0 + x1) / 2 + bend * (y1 - y0) / 2, (y0 + y1) / 2 - bend * (x1 - x0) / 2))
    return out


def draw_curve(curve: Any, *, title: str = "faithfulness curve", ax: Any = None) -> Any:
    """A `FaithfulnessCurve` as a matplotlib Figure: faithfulness per fraction of edges kept for the signed ranking
    (its 95% CI shaded), the |score| ranking and the random rankings' mean, with CPR and CMD [CI] in the legend.
    The x axis is logarithmic so the small fractions can be read; the areas are taken on the linear axis (MIB)."""
    from matplotlib.figure import Figure

    frame = curve.frame()
    fig = ax.figure if ax is not None else Figure(figsize=(5.6, 3.4), dpi=100)
    ax = ax or fig.add_subplot()
    signed, absolute = frame[frame.ranking == "signed"], frame[frame.ranking == "absolute"]
    ax.fill_between(signed.fraction, signed.ci_low, signed.ci_high, color="#4c72b0", alpha=0.25, linewidth=0)
    ax.plot(signed.fraction, signed.faithfulness, "o-", color="#4c72b0", ms=3,
            label=f"signed score: CPR {_area_text(curve.cpr)}")
    ax.plot(absolute.fraction, absolute.faithfulness, "s--", color="#dd8452", ms=3,
            label=f"|score|: CMD {_area_text(curve.cmd)}")
    if curve.random is not None:
        ax.plot(curve.fractions, curve.random.faithfulness, ":", color="#666666",
                label=f"random ({curve.random.n_rankings}): CPR {curve.random.cpr.mean:.3f}, CMD {curve.random.cmd.mean:.3f}")
    ax.axhline(1.0, color="k", lw=0.6, alpha=0.5)
    ax.set_xscale("log")
    ax.set_xlabel(f"fraction of the {curve.n_total_edges} edges kept")
    ax.set_ylabel("faithfulness")
    ax.set_title(f"{title} ({curve.score_name} scores, {curve.n_prompts} held-out prompts)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.15, top=0.9)
    return fig


def _area_text(area: Any) -> str:
    """"0.951 [0.949, 0.953]" (the CI left out when it is unknown)."""
    ci = f" [{area.ci_low:.3f}, {area.ci_high:.3f}]" if math.isfinite(area.ci_low) and math.isfinite(area.ci_high) else ""
    return f"{area.mean:.3f}{ci}"


__all__ = ["MAX_LABELS", "VIA_COLOURS", "check_edge_table", "circuit_layout", "draw_circuit", "draw_curve", "edge_label"]
