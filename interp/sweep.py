"""Edge sweeps: exact path-patching values for many edge sets on one `interp.Run`, resumed from the receiver's layer.

`PatchSweep(run, source)`: per batch it runs the clean forward once, caching the residual stream entering every
block (`hook_resid_pre`) and every node's write, and the corrupted forward once, keeping every sender's write;
then each edge set resumes the forward at its earliest receiver's layer (`model.run_from(layer, resid_pre)`), with
the patch hooks, several sets stacked along the batch axis. Nothing before that layer is recomputed, which is
exact: a patch changes nothing upstream of its receiver. Sets whose receivers are all the logits need no forward
at all (the final residual stream plus the writes' change). `node_values` patches whole nodes at their outputs.

`interp.Run` routes edge patches here (`run.effects([EdgePatch(...), ...])` on a model that is `sweepable`, unless
`Strategy.HOOKED`), one engine per corrupted source built once (`run.sweep(source)`); every `Effect` is the Run's,
memoised there (`PatchSweep.effects` asks the Run). `interp.analyses.circuits.patching` re-exports it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from interp.behaviour import check_values, last_real_logits
from interp.data import PromptSet
from interp.errors import BadInput
from interp.hooks import hooked
from interp.models.gpt import HookedGPT
from interp.paths import (
    Edge,
    EdgePatch,
    Node,
    check_edges,
    check_graph_model,
    corrupted_prompts,
    input_hook,
    node_write,
    nodes,
    parse_node,
    write_hook,
)

# edge sets resumed together along the batch axis (memory: stack x batch x pos x d_model per layer). On a CPU one
# at a time is fastest at the benchmark shape (benchmarks/bench_circuits.py: 2.6x vs 1.8x with 8 over one hooked
# forward per edge); a GPU gains from the wider batch
DEFAULT_STACK = {"cpu": 1, "cuda": 8}


@torch.no_grad()
def node_writes(model: HookedGPT, tokens: torch.Tensor, mask: torch.Tensor | None, keep_resid: bool = False
                ) -> tuple[dict[Node, torch.Tensor], dict[int, torch.Tensor], torch.Tensor]:
    """Every node's write (batch, pos, d_model), the residual stream entering each block (with `keep_resid`)
    and the final one (before ln_final), in one forward."""
    every = [node for node in nodes(model) if node.kind != "logits"]
    n_layers = int(model.cfg.n_layers)
    acts: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any) -> None:
        acts[hook.name] = act.detach()

    names = {write_hook(node) for node in every}
    if keep_resid:
        names |= {f"blocks.{layer}.hook_resid_pre" for layer in range(n_layers)}
    with hooked(model, [(name, keep) for name in names]):
        final = model(tokens, attention_mask=mask, stop_at_layer=n_layers)
    writes = {node: node_write(model, node, acts[write_hook(node)]) for node in every}
    resid = {layer: acts[f"blocks.{layer}.hook_resid_pre"] for layer in range(n_layers)} if keep_resid else {}
    return writes, resid, final


# -- many edges at once, resumed from the receiver's layer


@dataclass
class _Batch:
    """One batch: its clean run (what resuming needs) and every sender's corrupted write."""

    batch: PromptSet  # the Run's prompts (what the behaviour scores)
    tokens: torch.Tensor  # (batch, pos) what the model reads
    mask: torch.Tensor | None  # (batch, pos) bool
    positions: torch.Tensor  # (batch, pos)
    resid_pre: dict[int, torch.Tensor]  # layer -> (batch, pos, d_model)
    resid_final: torch.Tensor  # (batch, pos, d_model), before ln_final
    clean_writes: dict[Node, torch.Tensor]  # node -> (batch, pos, d_model)
    corrupted_writes: dict[Node, torch.Tensor]  # node -> (batch, pos, d_model)
    clean: torch.Tensor  # (batch,) the behaviour
    summary: torch.Tensor | None = None


@dataclass
class PatchSweep:
    """Exact edge-patch values for many edge sets on one Run, with one clean and one corrupted forward per batch
    (see the module). `values(sets)` -> (set, prompt) behaviour values; `clean()` -> (prompt,)."""

    run: Any  # an interp.Run (interp.run imports this module, so the type is not named here)
    source: PromptSet | None = None  # None: resample within the Run's prompts (EdgePatch's default)
    stack: int | None = None  # None: DEFAULT_STACK for the model's device
    _batches: list[_Batch] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_graph_model(self.run.model, "edge_effects")
        if not isinstance(self.run.model, HookedGPT):
            raise BadInput(f"edge_effects resumes the forward with run_from, which needs a HookedGPT; got "
                           f"{type(self.run.model).__name__}. Use run.effect(EdgePatch(...)) edge by edge.")
        stack = DEFAULT_STACK.get(next(self.run.model.parameters()).device.type, 1) if self.stack is None else self.stack
        if isinstance(stack, bool) or not isinstance(stack, int) or stack < 1:
            raise BadInput(f"edge_effects: stack={stack!r} must be a whole number of at least 1.")
        self.per_forward: int = stack
        self.model: HookedGPT = self.run.model
        self.every = nodes(self.model)
        self.n_layers = int(self.model.cfg.n_layers)

    @property
    def batches(self) -> list[_Batch]:
        if self._batches is None:
            self._batches = [self._prepare(batch) for batch in self.run.prompts.batches(self.run.batch_size)]
        return self._batches

    def clean(self) -> torch.Tensor:
        """(prompt,) float64: the clean behaviour (equal to `run.clean()` to float tolerance)."""
        return torch.cat([b.clean.double().cpu() for b in self.batches])

    def _prepare(self, batch: PromptSet) -> _Batch:
        run, device = self.run, next(self.model.parameters()).device
        read = run.behaviour.model_prompts(batch)
        tokens = read.tokens.to(device)
        mask = None if read.attention_mask is None else read.attention_mask.to(device).bool()
        positions = self.model.position_ids(tokens.shape, mask, device=device)
        clean_writes, resid_pre, final = node_writes(self.model, tokens, mask, keep_resid=True)
        corrupted = corrupted_prompts(run, batch, self.source)
        corrupted_mask = None if corrupted.attention_mask is None else corrupted.attention_mask.to(device).bool()
        corrupted_writes, _, _ = node_writes(self.model, corrupted.tokens.to(device), corrupted_mask)
        summary = None
        if run.behaviour.compares_to_clean:
            summary = run.behaviour.clean_summary(self._output(final), batch)
        out = _Batch(batch, tokens, mask, positions, resid_pre, final, clean_writes, corrupted_writes,
                     torch.zeros(0), summary)
        out.clean = self._value(final, out, "clean run")
        return out

    def _output(self, resid: torch.Tensor) -> torch.Tensor:
        return self.model.head(resid) if self.run.behaviour.reads == "logits" else self.model.ln_final(resid)

    @torch.no_grad()
    def _value(self, resid: torch.Tensor, b: _Batch, what: str, copies: int = 1) -> torch.Tensor:
        """(copies * batch,) the behaviour from final residual streams of `copies` stacked copies of the batch."""
        behaviour = self.run.behaviour
        batch = b.batch if copies == 1 else b.batch[torch.arange(len(b.batch)).repeat(copies)]
        if behaviour.target_weights is not None and behaviour.reads == "logits":
            weights = behaviour.target_weights(batch).to(resid.device)  # (batch, pos - 1)
            return check_values(self.model.next_token_loss_from_resid(resid, batch.tokens, weights),
                                len(batch), what, behaviour)
        summary = None if b.summary is None else b.summary.repeat(copies, *([1] * (b.summary.ndim - 1)))
        if behaviour.last_position and behaviour.reads == "logits":  # unembed each prompt's last real position alone
            resid = last_real_logits(resid, batch)[:, None]  # (batch, 1, d_model)
        return check_values(behaviour(self._output(resid), batch, summary), len(batch), what, behaviour)

    # -- the patched runs

    def values(self, edge_sets: Sequence[Sequence[Edge]]) -> torch.Tensor:
        """(set, prompt) float64: the behaviour with each set of edges patched (EdgePatch semantics)."""
        sets = [tuple(sorted(set(edges))) for edges in edge_sets]
        for edges in sets:
            check_edges(self.model, edges)
        if not sets:
            return torch.zeros(0, len(self.run.prompts), dtype=torch.float64)
        order = sorted(range(len(sets)), key=lambda i: self._start(sets[i]))
        out = torch.empty(len(sets), len(self.run.prompts), dtype=torch.float64)
        start = 0
        for b in self.batches:
            rows = slice(start, start + len(b.batch))
            for chunk_start in range(0, len(order), self.per_forward):
                chunk = order[chunk_start:chunk_start + self.per_forward]
                out[chunk, rows] = self._patched(b, [sets[i] for i in chunk]).view(len(chunk), -1).double().cpu()
            start += len(b.batch)
        return out

    def _start(self, edges: Sequence[Edge]) -> int:
        """The layer to resume at: the earliest receiver's (the logits: n_layers, no block to rerun)."""
        return min((self.n_layers if e.receiver.kind == "logits" else e.receiver.layer) for e in edges) if edges \
            else self.n_layers

    @torch.no_grad()
    def _patched(self, b: _Batch, sets: list[tuple[Edge, ...]]) -> torch.Tensor:
        """(len(sets) * batch,) the behaviour with each set patched; sets resumed together from the earliest start."""
        k, n = len(sets), len(b.batch)
        start = min(self._start(edges) for edges in sets)
        current: dict[Node, torch.Tensor] = {}  # writes of senders at or after `start`, as this forward makes them

        def sender_now(node: Node, rows: slice) -> torch.Tensor:  # (batch, pos, d_model)
            if node in current:
                return current[node][rows]
            return b.clean_writes[node]  # before `start`: nothing patched changed it

        def record(act: torch.Tensor, hook: Any) -> None:
            for node in recorded[hook.name]:
                current[node] = node_write(self.model, node, act)

        recorded: dict[str, list[Node]] = {}
        for edges in sets:
            for edge in edges:
                if edge.sender.kind != "embed" and edge.sender.layer >= start:
                    names = recorded.setdefault(write_hook(edge.sender), [])
                    if edge.sender not in names:
                        names.append(edge.sender)
        by_input: dict[str, list[tuple[int, int | None, Node]]] = {}
        for i, edges in enumerate(sets):
            for edge in edges:
                name, index = input_hook(self.model, edge)
                by_input.setdefault(name, []).append((i, index, edge.sender))

        def make_patch(targets: list[tuple[int, int | None, Node]]) -> Callable[..., torch.Tensor]:
            def patch(act: torch.Tensor, hook: Any) -> torch.Tensor:  # (k * batch, pos, [head,] d_model)
                act = act.clone()
                for i, index, sender in targets:
                    rows = slice(i * n, (i + 1) * n)
                    delta = b.corrupted_writes[sender] - sender_now(sender, rows)  # (batch, pos, d_model)
                    if index is None:
                        act[rows] += delta
                    else:
                        act[rows, :, index] += delta
                return act
            return patch

        final_name = f"blocks.{self.n_layers - 1}.hook_resid_post"
        if start >= self.n_layers:  # only the logits read patched writes: no block to rerun
            resid = make_patch(by_input.get(final_name, []))(b.resid_final.repeat(k, 1, 1), None)
            return self._value(resid, b, "patched edges", copies=k)
        hooks = [(name, record) for name in recorded] + [(name, make_patch(t)) for name, t in by_input.items()]
        mask = None if b.mask is None else b.mask.repeat(k, 1)
        with hooked(self.model, hooks):
            resid = self.model.run_from(start, b.resid_pre[start].repeat(k, 1, 1), attention_mask=mask,
                                        positions=b.positions.repeat(k, 1))
        return self._value(resid, b, "patched edges", copies=k)

    # -- whole nodes: every reader of a node reads its corrupted write

    def node_values(self, node_sets: Sequence[Sequence[Node]], *, base: Sequence[Node] = ()) -> torch.Tensor:
        """(set, prompt) float64: the behaviour with each set of nodes patched, every reader of each node (later
        heads, MLPs, the logits) reading its corrupted write: the same as patching all of the node's outgoing
        edges, done once at the node's own output (`hook_attn_out` for a head, `hook_mlp_out` for an MLP,
        `hook_resid_pre` of block 0 for the embeddings) instead of at each reader.

        `base`: nodes patched in every set as well. Their run is made once per batch and each set resumes from
        it at the set's own earliest node, so sets that share a large base (every node outside a circuit) cost
        the layers after their own nodes only."""
        sets = [self._node_set(node_set) for node_set in node_sets]
        shared = self._node_set(base)
        out = torch.empty(len(sets), len(self.run.prompts), dtype=torch.float64)
        extras = [tuple(n for n in node_set if n not in shared) for node_set in sets]
        order = sorted(range(len(sets)), key=lambda i: min((n.layer for n in extras[i]), default=self.n_layers))
        start = 0
        for b in self.batches:
            rows = slice(start, start + len(b.batch))
            resid_pre, final = self._base_run(b, shared)
            for i in order:
                if not extras[i]:  # the base alone
                    out[i, rows] = self._value(final, b, "patched nodes").double().cpu()
            resumed = [i for i in order if extras[i]]
            for chunk_start in range(0, len(resumed), self.per_forward):
                chunk = resumed[chunk_start:chunk_start + self.per_forward]
                patched = self._node_patched(b, [shared + extras[i] for i in chunk], [extras[i] for i in chunk],
                                             resid_pre)
                out[chunk, rows] = patched.view(len(chunk), -1).double().cpu()
            start += len(b.batch)
        return out

    def _node_set(self, node_set: Sequence[Node | str]) -> tuple[Node, ...]:
        """Sorted, deduplicated writer nodes (BadInput naming one that writes nothing here)."""
        parsed = tuple(sorted(set(parse_node(n) for n in node_set)))
        for node in parsed:
            if node.kind == "logits" or node not in self.every:
                raise BadInput(f"node_values: {node.label} is not a node that writes in this model (heads, MLPs, "
                               "embed).")
        return parsed

    def _base_run(self, b: _Batch, base: tuple[Node, ...]) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
        """The residual stream before every block (layer -> (batch, pos, d_model)) and after the last, with `base`
        patched: the clean run's when the base is empty."""
        if not base:
            return b.resid_pre, b.resid_final
        resid_pre: dict[int, torch.Tensor] = {}

        def keep(act: torch.Tensor, hook: Any) -> None:  # (batch, pos, d_model)
            resid_pre[int(hook.name.split(".")[1])] = act.detach().clone()

        first = max(0, min(node.layer for node in base))
        final = self._node_patched(b, [base], [base], b.resid_pre, keep=[
            (f"blocks.{layer}.hook_resid_pre", keep) for layer in range(first, self.n_layers)], value=False)
        return {**b.resid_pre, **resid_pre}, final

    @torch.no_grad()
    def _node_patched(self, b: _Batch, sets: list[tuple[Node, ...]], own: list[tuple[Node, ...]],
                      resid_pre: dict[int, torch.Tensor], keep: Sequence[tuple[str, Callable[..., Any]]] = (),
                      value: bool = True) -> torch.Tensor:
        """(len(sets) * batch,) the behaviour with each set of nodes patched at their outputs, resumed together from
        the earliest of the sets' `own` nodes with `resid_pre` (a run in which the nodes before that layer are
        already patched); with `value=False`, the final residual stream instead."""
        k, n = len(sets), len(b.batch)
        start = max(0, min((node.layer for nodes_ in own for node in nodes_), default=self.n_layers))
        z_now: dict[int, torch.Tensor] = {}
        by_hook: dict[str, list[tuple[int, Node]]] = {}
        for i, (node_set, own_set) in enumerate(zip(sets, own)):
            for node in node_set:
                if node.layer < start and node not in own_set:  # patched already in `resid_pre`
                    continue
                name = {"head": f"blocks.{node.layer}.hook_attn_out", "mlp": f"blocks.{node.layer}.hook_mlp_out",
                        "embed": "blocks.0.hook_resid_pre"}[node.kind]
                by_hook.setdefault(name, []).append((i, node))

        def keep_z(act: torch.Tensor, hook: Any) -> None:  # (k * batch, pos, head, d_head)
            z_now[int(hook.name.split(".")[1])] = act

        def make_patch(targets: list[tuple[int, Node]]) -> Callable[..., torch.Tensor]:
            def patch(act: torch.Tensor, hook: Any) -> torch.Tensor:  # (k * batch, pos, d_model)
                act = act.clone()
                for i, node in targets:
                    rows = slice(i * n, (i + 1) * n)
                    if node.kind == "head":  # this head's own write, as the forward made it, out; the corrupted one in
                        now = self.model.blocks[node.layer].attn.head_write(node.head, z_now[node.layer][rows, :, node.head])
                        act[rows] += b.corrupted_writes[node] - now
                    else:
                        act[rows] = b.corrupted_writes[node]
                return act
            return patch

        head_layers = {node.layer for targets in by_hook.values() for _, node in targets if node.kind == "head"}
        hooks: list[tuple[str, Callable[..., Any]]] = [(f"blocks.{layer}.attn.hook_z", keep_z) for layer in head_layers]
        hooks += [(name, make_patch(targets)) for name, targets in by_hook.items()] + list(keep)
        mask = None if b.mask is None else b.mask.repeat(k, 1)
        with hooked(self.model, hooks):
            resid = self.model.run_from(start, resid_pre[start].repeat(k, 1, 1), attention_mask=mask,
                                        positions=b.positions.repeat(k, 1))
        return self._value(resid, b, "patched nodes", copies=k) if value else resid

    def effects(self, edge_sets: Sequence[Sequence[Edge]]) -> list[Any]:
        """The Run's `Effect`s of patching each set (`run.effects([EdgePatch(set, source), ...])`: memoised there,
        computed by the Run's own sweep engine, `run.sweep(source)`)."""
        return list(self.run.effects([EdgePatch(tuple(sorted(set(edges))), source=self.source) for edges in edge_sets]))


def patched_values(run: Any, edge_sets: Sequence[Sequence[Edge]], source: PromptSet | None = None) -> torch.Tensor:
    """(set, prompt) float64: the behaviour with each set of edges patched from `source` (None: resampled), read from
    the Run's effects (`EdgePatch`, memoised there; swept by `run.sweep(source)` where the model allows); an empty
    set patches nothing: the sweep's clean run."""
    sets = [tuple(sorted(set(edges))) for edges in edge_sets]
    wanted = [edges for edges in dict.fromkeys(sets) if edges]
    effects = dict(zip(wanted, run.effects([EdgePatch(edges, source=source) for edges in wanted])))
    if not sets:
        return torch.zeros(0, len(run.prompts), dtype=torch.float64)
    return torch.stack([effects[edges].intervened if edges else run.sweep(source).clean() for edges in sets])


def sweepable(model: Any) -> bool:
    """Whether edge patches on `model` can be swept (resumed from the receiver's layer): a HookedGPT whose residual
    stream is a sum of node writes with split inputs (`interp.paths.check_graph_model`)."""
    if not isinstance(model, HookedGPT):
        return False
    try:
        check_graph_model(model, "an edge sweep")
    except BadInput:
        return False
    return True

__all__ = ["DEFAULT_STACK", "PatchSweep", "node_writes", "patched_values", "sweepable"]
