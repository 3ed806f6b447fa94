"""Path patching: what one edge (sender -> receiver via q / k / v / in / direct) carries, measured exactly.

    path_patch(model, prompts, sender="L0H0", receiver="L1H0", via="k").frame()
    edge_effects(run, ["L0H0 -> L1H0 via k", "L1H0 -> logits"])     # many edges, one clean run per batch

A path patch is `interp.paths.EdgePatch` of one edge through `interp.Run`: the receiver reads the
sender's write from a corrupted run (other prompts of the set, resampled by a derangement, or a
corrupted set given row for row) and nothing else changes; the effect is the behaviour's change
per prompt, with a bootstrap CI over prompts.

`edge_effects` computes the same numbers for many edges (or sets of edges) at once: per batch it
runs the clean forward once, caching the residual stream entering every block (`hook_resid_pre`)
and every node's write, and the corrupted forward once, keeping every sender's write; then each edge
set resumes the forward at its earliest receiver's layer (`model.run_from(layer, resid_pre)`), with
the patch hooks, several sets stacked along the batch axis. Nothing before that layer is recomputed,
which is exact: a patch changes nothing upstream of its receiver. Sets whose receivers are all the
logits need no forward at all (the final residual stream plus the writes' change).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import pandas as pd
import torch
from torch import nn

from interp.data import PromptSet
from interp.errors import BadInput
from interp.heads import parse_head
from interp.paths import (
    Edge,
    EdgePatch,
    as_edges,
    check_edges,
    check_graph_model,
    graph,
    parse_edge,
    parse_node,
)
from interp.run import Effect, Run, as_run
from interp.sweep import DEFAULT_STACK, PatchSweep, node_writes

EdgeLike = Edge | str
EdgeSetLike = EdgeLike | Iterable[EdgeLike]


@dataclass(frozen=True)
class PathPatch:
    """One path patch: the behaviour's change per prompt when `edge` reads the corrupted sender."""

    edge: Edge
    effect: Effect
    source: str  # "resample" or "corrupted prompts"

    @property
    def values(self) -> torch.Tensor:
        return self.effect.values  # (prompt,) float64

    def frame(self) -> pd.DataFrame:
        """One row: sender, receiver, via, effect, ci_low, ci_high, clean, n_prompts, behaviour, unit, source."""
        return edge_frame([self.effect], source=self.source)


def _edge_of(sender: Any, receiver: Any, via: str | None) -> Edge:
    sender_node, receiver_node = parse_node(sender), parse_node(receiver)
    label = f"{sender_node} -> {receiver_node}" + ("" if via in (None, "") else f" via {via}")
    return parse_edge(label)


def path_patch(model_or_run: nn.Module | Run, prompts: PromptSet | None = None, *, sender: Any, receiver: Any,
               via: str | None = None, source: PromptSet | None = None, behaviour: Any = None,
               batch_size: int | None = None, seed: int | None = None) -> PathPatch:
    """The effect of patching `sender`'s write into only `receiver`'s `via` input ("q", "k", "v"; "in" for an
    MLP, "direct" or None for the logits) from a corrupted run: resampled prompts (`source=None`) or the
    corrupted set `source` (row for row). Per prompt, with a bootstrap CI (`.frame()`)."""
    run = as_run(model_or_run, prompts, where="path_patch", behaviour=behaviour, batch_size=batch_size, seed=seed)
    check_graph_model(run.model, "path_patch")
    edge = _edge_of(sender, receiver, via)
    check_edges(run.model, [edge])
    effect = run.effect(EdgePatch((edge,), source=source))
    return PathPatch(edge, effect, "resample" if source is None else "corrupted prompts")


def edge_frame(effects: Sequence[Effect], source: str = "resample") -> pd.DataFrame:
    """Tidy rows of single-edge effects: edge (its label), sender, receiver, via, effect, ci_low, ci_high, clean,
    n_prompts, ..."""
    rows = []
    for effect in effects:
        labels = effect.intervention.get("edges", [])
        if len(labels) != 1:
            raise BadInput(f"edge_frame takes effects of single edges; got one of {len(labels)} edges ({labels[:3]}...).")
        edge = parse_edge(labels[0])
        rows.append({"edge": edge.label, "sender": edge.sender.label, "receiver": edge.receiver.label, "via": edge.via,
                     "effect": effect.mean, "ci_low": effect.ci_low, "ci_high": effect.ci_high,
                     "clean": float(effect.clean.mean()), "n_prompts": effect.n_prompts,
                     "behaviour": effect.behaviour, "unit": effect.unit, "source": source})
    columns = ["edge", "sender", "receiver", "via", "effect", "ci_low", "ci_high", "clean", "n_prompts", "behaviour", "unit",
               "source"]
    return pd.DataFrame(rows, columns=columns)


def as_edge_set(item: EdgeSetLike) -> tuple[Edge, ...]:
    """One edge ('L0H0 -> L1H0 via k' or an Edge) as a set of one, or a collection of edges as a set."""
    return tuple(sorted(as_edges(item, "edge_effects")))


def edge_effects(run: Run, edges: Iterable[EdgeSetLike], *, source: PromptSet | None = None,
                 stack: int | None = None) -> list[Effect]:
    """Each edge's (or edge set's) exact path-patching effect: `run.effects([EdgePatch(...), ...])`, memoised in the
    Run and computed by its sweep engine (`run.sweep(source)`: resumed from the receiver's layer, see the module;
    one hooked forward each under `Strategy.HOOKED`); `stack` sets per resumed forward (None: `DEFAULT_STACK` for
    the device)."""
    if not isinstance(run, Run):
        raise BadInput(f"edge_effects takes an interp.Run, got {type(run).__name__}; build one with "
                       "interp.Run(model, prompts).")
    if isinstance(edges, (Edge, str)):
        edges = [edges]  # one edge, not its characters
    elif not isinstance(edges, Iterable):
        raise BadInput(f"edge_effects: edges={edges!r} ({type(edges).__name__}); expected a list of edges (labels such as "
                       "'L0H0 -> L1H1 via k') or of edge sets.")
    sets = [as_edge_set(item) for item in edges]
    sweep = run.sweep(source)  # BadInput for a model it cannot sweep
    if stack is not None:
        sweep.per_forward = PatchSweep(run, source, stack).per_forward  # checked as the engine checks it
    return run.effects([EdgePatch(edge_set, source=source) for edge_set in sets])


def path_patches(model_or_run: nn.Module | Run, prompts: PromptSet | None = None, *, edges: Iterable[EdgeLike],
                 source: PromptSet | None = None, behaviour: Any = None, batch_size: int | None = None,
                 seed: int | None = None) -> pd.DataFrame:
    """`path_patch` of many single edges, one row each (computed together by `edge_effects`)."""
    run = as_run(model_or_run, prompts, where="path_patches", behaviour=behaviour, batch_size=batch_size, seed=seed)
    parsed = as_edges(edges, "path_patches")
    check_edges(run.model, parsed)
    return edge_frame(edge_effects(run, parsed, source=source), source="resample" if source is None else "corrupted prompts")


def attention_input_patch(model_or_run: nn.Module | Run, prompts: PromptSet | None = None, *, sender: Any, layer: int,
                          source: PromptSet | None = None, behaviour: Any = None, batch_size: int | None = None,
                          seed: int | None = None) -> pd.DataFrame:
    """Head -> layer patching, `L0H1 -> L1 (attention input)`: `sender`'s write from a corrupted run replaces its clean
    write in what attention layer `layer` reads (q, k and v of all its heads together); the rest of the model keeps
    the clean write. One row, `edge_frame`'s columns (via "q,k,v").

    The patch a model hooked by interception allows (`interp.intercepted.LayerInputPatch`: the change enters the
    layer's input norm), where one head's q, k or v input cannot be patched alone; on a HookedGPT it is the
    path patch of the edges from `sender` into every head of `layer` via q, k and v at once, the same number."""
    from interp.intercepted import LayerInputPatch, check_patchable, has_split_inputs

    run = as_run(model_or_run, prompts, where="attention_input_patch", behaviour=behaviour, batch_size=batch_size,
                 seed=seed)
    head = parse_head(sender)
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise BadInput(f"attention_input_patch: layer={layer!r}; expected the receiver layer's index (an int).")
    intervention: Any
    if has_split_inputs(run.model):
        n_heads = run.model.blocks[layer].cfg.n_heads if 0 <= layer < len(run.model.blocks) else 0
        if head.layer >= layer or n_heads == 0:
            raise BadInput(f"{head.label} -> L{layer} (attention input): the receiver layer must be a later layer of the "
                           f"model (after {head.layer}, at most {len(run.model.blocks) - 1}).")
        # the graph's own edges from the sender into the layer's heads (grouped-query k and v once per kv head)
        edges = [edge for edge in graph(run.model) if edge.sender.kind == "head" and tuple(head) == (
            edge.sender.layer, edge.sender.head) and edge.receiver.layer == layer and edge.via in ("q", "k", "v")]
        intervention = EdgePatch(tuple(edges), source=source, label_=f"{head.label} -> L{layer} (attention input)")
    else:
        check_patchable(run.model, head, layer)
        intervention = LayerInputPatch(head, layer, source=source)
    effect = run.effect(intervention)
    return pd.DataFrame([{
        "edge": f"{head.label} -> L{layer} (attention input)", "sender": head.label, "receiver": f"L{layer}",
        "via": "q,k,v", "effect": effect.mean, "ci_low": effect.ci_low, "ci_high": effect.ci_high,
        "clean": float(effect.clean.mean()), "n_prompts": effect.n_prompts, "behaviour": effect.behaviour,
        "unit": effect.unit, "source": "resample" if source is None else "corrupted prompts"}])


__all__ = ["DEFAULT_STACK", "PatchSweep", "PathPatch", "as_edge_set", "attention_input_patch", "edge_effects", "edge_frame",
           "node_writes", "path_patch", "path_patches"]
