"""Attribution patching: the first-order estimate of every edge's and every node's patching effect, from one
backward pass (edge attribution patching, Syed et al. 2023).

    result = attribution_patching(model, prompts)      # or a Run
    result.edges_frame()    # sender, receiver, via, score, ci_low, ci_high, n_prompts, unit
    result.nodes_frame()    # node, layer, head, score, ...

For an edge S -> R via x the score of one prompt is

    sum over positions of (corrupted(S) - clean(S)) . dB / d(input_x of R)

with the gradient taken on the clean run (the split inputs `hook_q_input`... carry each head's own copy of
the residual stream, so each receiver input has its own gradient). It estimates `EdgePatch([edge])`'s effect
(patched - clean) to first order. A node's score (patching its whole output, i.e. every edge out of it) is
the sum of its outgoing edges' scores: the residual stream's gradient at a write is the sum of its readers'.
Per batch: one forward on the corrupted prompts (the senders' writes, no gradient) and one forward and
backward on the clean prompts, whatever the number of edges.

`method="eap-ig"` integrates the gradient along a path instead of reading it at the clean end (as EAP-IG,
Hanna et al. 2024, but along the writes): a group of senders' writes go from clean to corrupted (alpha from 0
to 1), everything downstream recomputed, and the score is the change of write times the gradient averaged by
Simpson's rule (`steps=3`: alpha 0, 1/2, 1; the clean pass shared). `per="layer"` interpolates each layer's
heads together (1 + 2 x (layers + MLPs + 1) passes per batch); `per="node"` each sender alone
(1 + 2 x senders passes), which makes a node's score the integral along its own patch.

Measured against exact patching (resampled prompts; Spearman over the heads' node scores / over all edges):
toy-induction (48 repeated prompts) EAP 0.12 / 0.35, eap-ig per layer -0.05 / 0.34, per node 1.00 / 0.62;
stdlib-bytes (32 planted repeats) EAP 0.56 / 0.41, eap-ig per layer 0.96 / 0.70, per node 1.00 / 0.78. Resampling every token is
a large patch, far from the clean point's tangent: read plain EAP as a screen, not a measurement.

Limits: a first-order estimate is poor where the behaviour is far from linear in the patched activation.
On saturated circuits (the hand-set ones of `interp.models.constructed` and `interp.models.handbuilt`) it
misses query edges (no gradient through a saturated pattern: 4e-6 nats estimated for a 7-nat edge), gives
the value and direct edges of a confident head about 1/55 of their effect *with the wrong sign* (-0.49 for
+27 nats: the loss is flat where the clean run sits and the patch goes far beyond), gives key-composition
edges the right size but the wrong sign (-7.4 for +6.5), and sees nothing at all where the output softmax
saturates (1e-12 for 29-nat value chains). `estimate_agreement` measures how far the estimates can be read
on a model: their Spearman correlation with exact patches of a seeded sample of edges.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal, get_args

import pandas as pd
import torch
from torch import nn
from transformer_lens.utilities.statistics import derive_generator

from interp.analyses.circuits.patching import node_writes
from interp.data import PromptSet
from interp.errors import BadInput
from interp.hooks import hooked
from interp.models.gpt import HookedGPT
from interp.paths import (
    Edge,
    EdgePatch,
    Node,
    check_graph_model,
    corrupted_prompts,
    graph,
    input_hook,
    nodes,
    parse_edge,
    refuse_kv_alias,
)
from interp.run import Run, as_run
from interp.stats import bootstrap


@dataclass(frozen=True)
class Attribution:
    """Attribution-patching scores per prompt for every edge and every sending node of a model."""

    edges: tuple[Edge, ...]
    edge_values: torch.Tensor  # (edge, prompt) float64: the estimated change of the behaviour (patched - clean)
    nodes: tuple[Node, ...]  # the senders (embed, heads, MLPs)
    node_values: torch.Tensor  # (node, prompt) float64: patching the node's whole output
    behaviour: str
    unit: str
    seed: int = 0
    kv_groups: tuple[int, ...] = ()  # per layer: query heads per key / value head (1 without grouped-query attention)

    def score(self, edge: Edge | str) -> float:
        """The mean score of one edge of the graph; BadInput naming an edge the graph lacks (and, for a grouped
        head's key / value input, the graph's name for it: its key/value head's edge, 'L0H0 -> L1KV0 via k')."""
        parsed = parse_edge(edge)
        if parsed.receiver.kind in ("head", "kv") and parsed.receiver.layer < len(self.kv_groups):
            refuse_kv_alias(parsed, self.kv_groups[parsed.receiver.layer])
        if parsed not in self.edges:
            raise BadInput(f"attribution score: {parsed.label!r} is not an edge of this model's graph ({len(self.edges)} "
                           "edges; each sender into a later receiver: see edges_frame()).")
        return float(self.edge_values[self.edges.index(parsed)].mean())

    def edges_frame(self) -> pd.DataFrame:
        """One row per edge: edge (its label), sender, receiver, via, score (mean over prompts), ci_low, ci_high,
        n_prompts, unit."""
        mean, low, high = bootstrap(self.edge_values.T, seed=self.seed, label="attribution-edges")
        return pd.DataFrame({"edge": [e.label for e in self.edges], "sender": [e.sender.label for e in self.edges], "receiver": [e.receiver.label for e in self.edges],
                             "via": [e.via for e in self.edges], "score": mean.numpy(), "ci_low": low.numpy(),
                             "ci_high": high.numpy(), "n_prompts": self.edge_values.shape[1], "behaviour": self.behaviour,
                             "unit": self.unit})

    def nodes_frame(self) -> pd.DataFrame:
        """One row per sending node: node, layer, head (heads only), score, ci_low, ci_high, n_prompts, unit."""
        mean, low, high = bootstrap(self.node_values.T, seed=self.seed, label="attribution-nodes")
        return pd.DataFrame({"node": [n.label for n in self.nodes],
                             "layer": pd.array([n.layer if n.kind != "embed" else None for n in self.nodes], dtype="Int64"),
                             "head": pd.array([n.head if n.kind == "head" else None for n in self.nodes], dtype="Int64"),
                             "score": mean.numpy(), "ci_low": low.numpy(), "ci_high": high.numpy(),
                             "n_prompts": self.node_values.shape[1], "behaviour": self.behaviour, "unit": self.unit})

    def frame(self) -> pd.DataFrame:
        return self.edges_frame()


def _input_names(model: HookedGPT, edges: list[Edge]) -> list[str]:
    return sorted({input_hook(model, edge)[0] for edge in edges})


AttributionMethod = Literal["eap", "eap-ig"]
METHODS: tuple[str, ...] = get_args(AttributionMethod)
Per = Literal["layer", "node"]
PERS: tuple[str, ...] = get_args(Per)
IG_STEPS = 3  # gradient points per sender group for "eap-ig" (Simpson's rule on 0, 1/2, 1; the clean one shared)


def _rule(steps: int) -> tuple[list[float], list[float]]:
    """Where along the path from a group's clean (0) to its corrupted (1) writes the gradient is taken, and the
    weights of the quadrature: 1, the midpoint; 2, both ends (trapezoid); 3, Simpson's rule."""
    rules = {1: ([0.5], [1.0]), 2: ([0.0, 1.0], [0.5, 0.5]), 3: ([0.0, 0.5, 1.0], [1 / 6, 4 / 6, 1 / 6])}
    if steps not in rules:
        raise BadInput(f"attribution_patching: steps={steps!r}; expected 1 (the midpoint), 2 (trapezoid) or 3 "
                       "(Simpson's rule along the path).")
    return rules[steps]


def _groups(senders: list[Node], per: str = "layer") -> list[tuple[str, tuple[Node, ...]]]:
    """Senders interpolated together in "eap-ig", with the hook whose activation carries their summed write:
    the embeddings; each layer's heads (`hook_attn_out`), or each head alone with per="node"; each MLP."""
    out: list[tuple[str, tuple[Node, ...]]] = [("blocks.0.hook_resid_pre", (Node(-1, "embed"),))]
    for layer in sorted({s.layer for s in senders if s.kind != "embed"}):
        heads = tuple(s for s in senders if s.layer == layer and s.kind == "head")
        if heads:
            split = [(h,) for h in heads] if per == "node" else [heads]
            out += [(f"blocks.{layer}.hook_attn_out", group) for group in split]
        out += [(f"blocks.{layer}.hook_mlp_out", (s,)) for s in senders if s.layer == layer and s.kind == "mlp"]
    return out


def _input_grads(run: Run, batch: PromptSet, tokens: torch.Tensor, mask: torch.Tensor | None, names: list[str],
                 shift: tuple[str, torch.Tensor] | None = None, clean: torch.Tensor | None = None
                 ) -> dict[str, torch.Tensor]:
    """The behaviour's gradient at each receiver input `names`, with `shift` = (hook, (batch, pos, d_model))
    added to that hook's activation (None: the clean run): one forward and backward. `clean`: the clean run's
    summary for a behaviour that compares to it (None: this forward is the clean run)."""
    model = run.model
    assert isinstance(model, HookedGPT)
    acts: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any) -> torch.Tensor:
        # a copy of its own: hook_mlp_in's tensor is also the residual stream the block adds to, whose
        # gradient would include the skip path; the copy carries only the receiver's read
        acts[hook.name] = act.clone()
        return acts[hook.name]

    def leaf(act: torch.Tensor, hook: Any) -> torch.Tensor:
        # gradients flow from here whether or not the parameters require them (none is accumulated in .grad)
        return act.detach().clone().requires_grad_(True)

    def add(act: torch.Tensor, hook: Any) -> torch.Tensor:
        assert shift is not None
        return act + shift[1]

    hooks: list[tuple[str, Any]] = [("blocks.0.hook_resid_pre", leaf)]
    hooks += [] if shift is None else [(shift[0], add)]
    with torch.enable_grad(), hooked(model, hooks + [(name, keep) for name in names]):
        resid = model(tokens, attention_mask=mask, stop_at_layer=int(model.cfg.n_layers))
        output = model.head(resid) if run.behaviour.reads == "logits" else model.ln_final(resid)
        summary = clean if clean is not None else run.behaviour.clean_summary(output.detach(), batch)
        values = run.behaviour(output, batch, summary)  # (batch,)
        grads = torch.autograd.grad(values.sum(), [acts[name] for name in names], allow_unused=True)
    return {name: torch.zeros_like(acts[name]) if g is None else g for name, g in zip(names, grads)}


def _scores(model: HookedGPT, edges: list[Edge], grads: dict[str, torch.Tensor], deltas: dict[Node, torch.Tensor],
            out: torch.Tensor) -> None:
    """Fill out[i] (batch,) for each edge i whose sender is in `deltas`: change of write . receiver-input gradient."""
    senders = sorted(deltas)
    stacked = torch.stack([deltas[s] for s in senders], 2)  # (batch, pos, sender, d_model)
    index_of = {s: i for i, s in enumerate(senders)}
    per_input: dict[str, torch.Tensor] = {}
    for i, edge in enumerate(edges):
        if edge.sender not in index_of:
            continue
        name, index = input_hook(model, edge)
        if name not in per_input:
            grad = grads[name] if grads[name].ndim == 4 else grads[name][:, :, None]  # (batch, pos, head or 1, d_model)
            per_input[name] = torch.einsum("bpsd,bphd->bsh", stacked.to(grad.dtype), grad)  # (batch, sender, head)
        out[i] = per_input[name][:, index_of[edge.sender], 0 if index is None else index].detach().double().cpu()


def _batch_scores(run: Run, batch: PromptSet, edges: list[Edge], senders: list[Node], source: PromptSet | None,
                  method: str, steps: int, per: str = "layer") -> torch.Tensor:
    """(edge, batch) scores of one batch: a corrupted forward, then one clean forward and backward ("eap"), or
    per sender group the quadrature's points along its path ("eap-ig")."""
    model = run.model
    assert isinstance(model, HookedGPT)  # attribution_patching checked it
    device = next(model.parameters()).device
    read = run.behaviour.model_prompts(batch)
    tokens = read.tokens.to(device)
    mask = None if read.attention_mask is None else read.attention_mask.to(device).bool()
    corrupted = corrupted_prompts(run, batch, source)
    corrupted_mask = None if corrupted.attention_mask is None else corrupted.attention_mask.to(device).bool()
    corrupted_writes, _, _ = node_writes(model, corrupted.tokens.to(device), corrupted_mask)
    names = _input_names(model, edges)
    out = torch.zeros(len(edges), len(batch), dtype=torch.float64)
    if method == "eap":
        clean_grads = _input_grads(run, batch, tokens, mask, names)
        clean_writes, _, _ = node_writes(model, tokens, mask)
        _scores(model, edges, clean_grads, {s: corrupted_writes[s] - clean_writes[s] for s in senders}, out)
        return out
    clean_writes, _, final = node_writes(model, tokens, mask)
    # a behaviour measured from the clean run's output (a squared change) keeps that reference along the path
    clean = run.behaviour.clean_summary(model.head(final) if run.behaviour.reads == "logits" else model.ln_final(final),
                                        batch)
    alphas, weights = _rule(steps)
    clean_grads = _input_grads(run, batch, tokens, mask, names) if 0.0 in alphas else {}
    for hook, group in _groups(senders, per):
        deltas = {s: corrupted_writes[s] - clean_writes[s] for s in group}
        total = torch.stack(list(deltas.values())).sum(0)  # (batch, pos, d_model): the group's summed change of write
        grads: dict[str, torch.Tensor] = {}
        for alpha, weight in zip(alphas, weights):
            at = clean_grads if alpha == 0.0 else _input_grads(run, batch, tokens, mask, names, (hook, alpha * total), clean)
            for name, grad in at.items():
                grads[name] = grads[name] + weight * grad if name in grads else weight * grad
        _scores(model, edges, grads, deltas, out)
    return out


def attribution_patching(model_or_run: nn.Module | Run, prompts: PromptSet | None = None, *,
                         source: PromptSet | None = None, behaviour: Any = None, batch_size: int | None = None,
                         seed: int | None = None, method: AttributionMethod = "eap", steps: int = IG_STEPS,
                         per: Per = "layer") -> Attribution:
    """Every edge's and every sending node's attribution-patching score per prompt (see the module): the
    gradient estimate of patching from the corrupted run (`source=None`: resampled prompts, as EdgePatch)."""
    run = as_run(model_or_run, prompts, where="attribution_patching", behaviour=behaviour, batch_size=batch_size,
                 seed=seed)
    check_graph_model(run.model, "attribution_patching")
    if not isinstance(run.model, HookedGPT):
        raise BadInput(f"attribution_patching needs a HookedGPT (its forward stops before the unembedding); got "
                       f"{type(run.model).__name__}.")
    edges = graph(run.model)
    senders = [node for node in nodes(run.model) if node.kind != "logits"]
    if method not in METHODS:
        raise BadInput(f"attribution_patching: method={method!r}; expected one of {list(METHODS)}.")
    _rule(steps)
    if per not in PERS:
        raise BadInput(f"attribution_patching: per={per!r}; expected one of {list(PERS)} (what eap-ig interpolates together).")
    if method == "eap" and run.behaviour.compares_to_clean:
        warnings.warn(f"attribution_patching: {run.behaviour.name} is a distance from the clean run, smallest there, so "
                      "its gradient at the clean run (EAP's estimate) is 0 for every edge; use method='eap-ig', which "
                      "reads the gradient along the path to the corrupted run.", UserWarning, stacklevel=2)
    parts = [_batch_scores(run, batch, edges, senders, source, method, steps, per) for batch in run.prompts.batches(run.batch_size)]
    edge_values = torch.cat(parts, 1)  # (edge, prompt)
    node_values = torch.zeros(len(senders), edge_values.shape[1], dtype=torch.float64)
    where = {s: i for i, s in enumerate(senders)}
    for i, edge in enumerate(edges):
        node_values[where[edge.sender]] += edge_values[i]
    return Attribution(tuple(edges), edge_values, tuple(senders), node_values,
                       run.behaviour.describe(run.prompts), run.behaviour.unit, run.seed,
                       tuple(int(block.attn.group) for block in run.model.blocks))


AGREEMENT_SAMPLE = 32  # edges patched exactly to check the estimates against


@dataclass(frozen=True)
class Agreement:
    """How well attribution estimates rank edges as exact patching does, on a seeded sample of edges."""

    spearman: float  # rank correlation of the mean estimate with the mean exact effect (NaN: a side is constant)
    edges: tuple[Edge, ...]  # the sample
    estimates: tuple[float, ...]  # mean over prompts, per sampled edge
    exact: tuple[float, ...]  # `EdgePatch([edge])`'s mean effect (patched - clean), per sampled edge

    def frame(self) -> pd.DataFrame:
        """One row per sampled edge: edge, estimate, exact."""
        return pd.DataFrame({"edge": [e.label for e in self.edges], "estimate": list(self.estimates),
                             "exact": list(self.exact)})


def estimate_agreement(run: Run, result: Attribution, n_edges: int = AGREEMENT_SAMPLE, *,
                       source: PromptSet | None = None) -> Agreement:
    """The Spearman correlation of `result`'s edge estimates with exact single-edge patches (`run.effects`, one
    `EdgePatch` each, from `source` as the estimates were) over `n_edges` edges (every edge when the graph has
    fewer): the half of them with the largest |estimate|, the edges a ranking by estimate keeps first, and the
    rest drawn without replacement from the others (seeded by the run's seed), so that the sample holds both
    the edges the estimates call important and the background they are ranked against (a uniform sample of a
    model whose few edges matter holds mostly edges with no effect, tied at zero on both sides, and says
    little). `run`: the prompts the estimates are from."""
    if isinstance(n_edges, bool) or not isinstance(n_edges, int) or n_edges < 2:
        raise BadInput(f"estimate_agreement: n_edges={n_edges!r}; expected a whole number >= 2 (edges to patch).")
    if result.edge_values.shape[1] != len(run.prompts):
        raise BadInput(f"estimate_agreement: the estimates are over {result.edge_values.shape[1]} prompts, the run has "
                       f"{len(run.prompts)}; pass the Run the estimates were computed on.")
    means = result.edge_values.mean(1)  # (edge,)
    top = torch.argsort(means.abs(), descending=True, stable=True)[: n_edges // 2].tolist()
    chosen = set(top)
    rest = [i for i in range(len(result.edges)) if i not in chosen]
    order = torch.randperm(len(rest), generator=derive_generator(run.seed, "eap-agreement"))
    picked = sorted(top + [rest[j] for j in order[: n_edges - len(top)].tolist()])
    edges = tuple(result.edges[i] for i in picked)
    estimates = means[picked]  # (sample,)
    exact = torch.tensor([e.mean for e in run.effects([EdgePatch((edge,), source=source) for edge in edges])],
                         dtype=torch.float64)  # (sample,)
    rho = pd.Series(estimates.numpy()).rank().corr(pd.Series(exact.numpy()).rank())
    return Agreement(float(rho), edges, tuple(estimates.tolist()), tuple(exact.tolist()))


__all__ = ["AGREEMENT_SAMPLE", "Agreement", "Attribution", "attribution_patching", "estimate_agreement"]
