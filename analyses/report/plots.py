"""The report's figures (matplotlib, no display, no network): pattern heat maps, offset profiles,
bars with CIs (`plot_ci_bars`), similarity and importance maps, the circuit's drawing (`circuit_figures`).

Pattern heat maps share one colour scale (0 to 1: a weight's colour means the same on every
card, so a diffuse head looks diffuse next to a sharp one) unless `per_head=True`, and then the
colour bar says so. The similarity map's rows and columns follow an average-linkage clustering
of 1 - similarity (`cluster_order`), and its labels shrink to stay readable at 72 heads.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from interp.errors import BadInput
from interp.models.files import write_atomic


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


def plot_pattern(pattern: np.ndarray, label: str, ax=None, *, per_head: bool = False):
    """Heat map of one head's mean pattern (query, key) on the common 0..1 scale (or its own); returns the Figure."""
    fig = ax.figure if ax is not None else _figure(3.2, 3.0)
    ax = ax or fig.add_subplot()
    vmax = max(1e-9, float(np.nanmax(pattern))) if per_head else 1.0
    image = ax.imshow(pattern, cmap="viridis", vmin=0, vmax=vmax, interpolation="nearest")
    ax.set_title(f"{label} mean pattern", fontsize=9)
    ax.set_xlabel("key position", fontsize=8)
    ax.set_ylabel("query position", fontsize=8)
    ax.tick_params(labelsize=7)
    bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    bar.ax.tick_params(labelsize=7)
    bar.set_label(f"weight (this head's scale, max {vmax:.2g})" if per_head else "weight (common scale 0-1)", fontsize=7)
    return fig


def plot_offsets(profile: pd.DataFrame, label: str, ax=None):
    """Mean attention weight per relative offset (key - query; -1 = previous token), with its 95% CI as error bars."""
    fig = ax.figure if ax is not None else _figure(3.2, 2.4)
    ax = ax or fig.add_subplot()
    weight = profile["weight"].to_numpy(dtype=float)
    yerr = None
    if {"weight_ci_low", "weight_ci_high"} <= set(profile.columns):
        low = np.clip(weight - profile["weight_ci_low"].to_numpy(dtype=float), 0, None)
        high = np.clip(profile["weight_ci_high"].to_numpy(dtype=float) - weight, 0, None)
        yerr = np.nan_to_num(np.vstack([low, high]))
    ax.bar(profile["offset"], weight, color="#4c72b0", width=0.8, yerr=yerr, ecolor="#222", capsize=0,
           error_kw={"elinewidth": 0.8})
    ax.set_title(f"{label} offset profile (95% CI bars)", fontsize=9)
    ax.set_xlabel("offset (key - query)", fontsize=8)
    ax.set_ylabel("mean weight", fontsize=8)
    ax.set_ylim(0, 1.05 if len(weight) == 0 or np.nanmax(weight) > 0.5 else None)
    ax.tick_params(labelsize=7)
    return fig



def plot_ci_bars(labels: Sequence[str], mean: Any, ci_low: Any, ci_high: Any, ax=None, *, threshold: float | None = None,
                 title: str = "", ylabel: str = "", highlight: Iterable[str] = ()):
    """One bar per label at `mean`, its CI [ci_low, ci_high] as error bars (a bound that is NaN, or on the wrong side
    of the mean, draws no bar on that side), the `highlight` labels in red and a dashed line at `threshold`; returns
    the Figure. The notebooks' figure for any per-head or per-claim table with CI columns."""
    mean, low, high = (np.asarray(values, dtype=float).reshape(-1) for values in (mean, ci_low, ci_high))
    if not len(labels) == len(mean) == len(low) == len(high):
        raise BadInput(f"plot_ci_bars: {len(labels)} labels, {len(mean)} means, {len(low)} lower and {len(high)} upper "
                       "bounds; pass one of each per bar.")
    fig = ax.figure if ax is not None else _figure(max(3.0, 0.3 * len(labels) + 1.5), 2.8)
    ax = ax or fig.add_subplot()
    yerr = np.nan_to_num(np.vstack([np.clip(mean - low, 0, None), np.clip(high - mean, 0, None)]))  # (2, bar)
    chosen = set(highlight)
    colours = ["#c44e52" if label in chosen else "#4c72b0" for label in labels]
    ax.bar(range(len(labels)), mean, yerr=yerr, color=colours, ecolor="#222", error_kw={"elinewidth": 0.8})
    crowded = len(labels) > 12
    ax.set_xticks(range(len(labels)), labels, rotation=90 if crowded else 0, fontsize=7 if crowded else 9)
    if threshold is not None:
        ax.axhline(threshold, color="k", ls="--", lw=1)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    return fig

def cluster_order(similarity: np.ndarray) -> list[int]:
    """Leaf order of an average-linkage clustering on distance 1 - similarity (NaN = similarity 0).

    Repeatedly merges the two closest clusters (mean pairwise distance, updated by the
    Lance-Williams rule) and concatenates their leaf lists with the closest ends facing each
    other; ties break on the lowest index, so the order is deterministic."""
    n = len(similarity)
    leaf_distance = 1.0 - np.nan_to_num(np.asarray(similarity, dtype=float), nan=0.0)
    distance = leaf_distance.copy()  # (cluster, cluster)
    np.fill_diagonal(distance, np.inf)
    leaves: list[list[int] | None] = [[i] for i in range(n)]
    for _ in range(n - 1):
        i, j = np.unravel_index(int(np.argmin(distance)), distance.shape)
        i, j = min(i, j), max(i, j)
        a, b = leaves[i], leaves[j]
        assert a is not None and b is not None  # merged clusters are at distance inf, never the argmin
        merged = (len(a) * distance[i] + len(b) * distance[j]) / (len(a) + len(b))
        distance[i], distance[:, i] = merged, merged
        distance[i, i] = np.inf
        distance[j], distance[:, j] = np.inf, np.inf
        leaves[i], leaves[j] = _join(a, b, leaf_distance), None
    return next((l for l in leaves if l is not None), [])


def _join(a: list[int], b: list[int], distance: np.ndarray) -> list[int]:
    """a + b oriented so that the closest pair of ends touch."""
    options = [a + b, a + b[::-1], a[::-1] + b, a[::-1] + b[::-1]]
    return min(options, key=lambda o: distance[o[len(a) - 1], o[len(a)]])


def order_by_clustering(matrix: pd.DataFrame) -> pd.DataFrame:
    """The (label x label) matrix with rows and columns in `cluster_order`."""
    order = cluster_order(matrix.to_numpy(dtype=float))
    labels = [matrix.index[i] for i in order]
    return matrix.loc[labels, labels]


def plot_matrix(matrix: pd.DataFrame, title: str, *, cmap: str = "magma", vmin=None, vmax=None, annotate: bool = True):
    """Labelled heat map of a (label x label) or (layer x head) frame; at most ~11 inches, labels sized to fit."""
    values = matrix.to_numpy(dtype=float)
    n = max(values.shape)
    size = min(11.0, max(3.0, 0.14 * n + 2.5)) if n > 16 else max(3.0, 0.35 * n + 1.5)
    fontsize = max(4.5, min(7.0, 0.72 * size * 72 / max(1, n) * 0.8))
    fig = _figure(size + 0.8, size)
    ax = fig.add_subplot()
    image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    ax.set_xticks(range(values.shape[1]), [str(c) for c in matrix.columns], rotation=90, fontsize=fontsize)
    ax.set_yticks(range(values.shape[0]), [str(i) for i in matrix.index], fontsize=fontsize)
    ax.set_title(title, fontsize=9)
    if annotate and values.size <= 144:
        for (i, j), value in np.ndenumerate(values):
            if math.isfinite(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6, color="white" if image.norm(value) < 0.5 else "black")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=7)
    fig.tight_layout()
    return fig


def importance_grid(importance: pd.DataFrame) -> pd.DataFrame:
    """Importance as a (layer x head) frame for a heat map."""
    grid = importance.pivot(index="layer", columns="head", values="delta_loss")
    grid.index = [f"L{l}" for l in grid.index]
    grid.columns = [f"H{h}" for h in grid.columns]
    return grid


def save_png(fig, path: Path) -> str:
    """Write a figure as PNG (no timestamp metadata, so reruns give the same bytes); returns its relative path."""
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", metadata={"Software": None}))
    return f"plots/{path.name}"


def head_figures(data, plots: Path) -> dict[str, str]:
    """One figure per head card (pattern + offset profile); label -> relative path."""
    images = {}
    per_head = data.settings.get("colour_scale") == "per_head"
    offsets = data.offsets
    for label, layer, head in zip(data.heads["label"], data.heads["layer"], data.heads["head"]):
        layer, head = int(layer), int(head)
        fig = _figure(6.6, 2.8)
        plot_pattern(data.patterns[layer][head], label, ax=fig.add_subplot(1, 2, 1), per_head=per_head)
        if offsets is not None:
            profile = offsets[(offsets["layer"] == layer) & (offsets["head"] == head)]
            plot_offsets(profile, label, ax=fig.add_subplot(1, 2, 2))
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.9, wspace=0.55)  # fixed: tight_layout costs ~0.7 s a card
        images[label] = save_png(fig, plots / f"{label}.png")
    return images


def summary_figures(data, plots: Path) -> dict[str, str]:
    """The similarity map (clustered) and the importance map, when the report has them."""
    images = {}
    if data.similarity is not None:
        ordered = order_by_clustering(data.similarity)
        images["similarity"] = save_png(plot_matrix(ordered, "pattern similarity (1 - JS divergence), clustered", vmin=0, vmax=1),
                                    plots / "similarity.png")
    if data.importance is not None:
        images["importance"] = save_png(plot_matrix(importance_grid(data.importance), "importance: loss increase under mean ablation",
                                                cmap="viridis"), plots / "importance.png")
    return images


def circuit_figures(section: Any, plots: Path) -> dict[str, str]:
    """plots/circuit.png when there is a circuit, and plots/circuit_curve.png when it has a faithfulness curve;
    name -> relative path."""
    if section is None or section.summary is None:
        return {}
    from interp.analyses.circuits.drawing import MAX_LABELS, draw_circuit, draw_curve

    found = section.summary
    faith = found.test.faithfulness.mean if found.test is not None else math.nan
    title = f"{found.circuit.method} circuit" + (f", faithfulness {faith:.2f} (held-out)" if math.isfinite(faith) else "")
    if found.nodes is not None:
        title += "; an edge's width: its sender's removal cost"
    drawing = draw_circuit(found.edges_to_draw(), title=title, unit=found.unit,
                           max_labels=0 if found.nodes is not None else MAX_LABELS)
    images = {"circuit": save_png(drawing, plots / "circuit.png")}
    if found.curve is not None:
        images["circuit_curve"] = save_png(draw_curve(found.curve, title="faithfulness over circuit sizes (MIB)"),
                                           plots / "circuit_curve.png")
    return images
