"""The computational graph of a pre-norm transformer, and the intervention that patches its edges.

Nodes are what writes to (or reads the whole of) the residual stream:

    embed      the embeddings (the residual stream entering block 0)
    L{l}H{h}   attention head h of layer l (its `hook_result`: z @ W_O[h]); read by `interp.heads.parse_label`
    L{l}KV{g}  key/value head g of a grouped-query layer l (receives only: its key and value inputs, shared by
               the query heads g * group ... (g + 1) * group - 1; `receivers`, not `nodes`)
    MLP{l}     layer l's MLP (`hook_mlp_out`)
    logits     the final residual stream, read by the final norm and the unembedding

An `Edge` is one sender's write reaching one input of a receiver: `via` "q", "k" or "v" (a head's
query, key or value input: `blocks.{l}.attn.hook_q_input`...), "in" (an MLP's input: `hook_mlp_in`) or
"direct" (the logits). On a grouped-query layer (several query heads per key/value head) a head has only its
query input and the key and value inputs are the key/value head's: 'L0H0 -> L1KV0 via k'; on every other layer
each head is its own key/value head and keeps 'L0H0 -> L1H1 via k'. The residual stream a receiver reads is the sum of its senders' writes
(plus biases, which no patch changes), so an edge can be patched alone.

`EdgePatch(edges)` is an intervention for `interp.Run`: in the forward, every patched edge's receiver
reads the sender's write from a *corrupted* run in place of the sender's write in this run,
`input += corrupted(S) - current(S)`, and nothing else changes (the receiver's own output then flows on
as usual). The corrupted run is the model on other prompts of the same set (`source=None`: each prompt
reads a donor drawn by a derangement keyed by the Run's seed, among prompts of the same length) or on
a corrupted set given row for row. Path patching is an `EdgePatch` of one edge; a circuit test patches
every edge outside the circuit (causal scrubbing: resampled, never zeroed).

Defined for pre-norm models with split inputs (`HookedGPT`: sequential or parallel blocks); post-norm
blocks normalise the residual stream between writers, so the stream is not a sum of node outputs there.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Literal, get_args

import torch
from torch import nn

from interp.advice import split_inputs_advice
from interp.data import PromptSet, prompt_fingerprint
from interp.errors import BadInput
from interp.heads import KVHead, head_label, parse_label
from interp.hooks import hooked
from interp.modelinfo import user_class

Via = Literal["q", "k", "v", "in", "direct"]
VIAS: tuple[str, ...] = get_args(Via)
HEAD_VIAS = ("q", "k", "v")

_NODE = re.compile(r"^\s*(?:(embed)|MLP([0-9]+)|(logits))\s*$", re.IGNORECASE)  # heads: interp.heads.parse_label
_EDGE = re.compile(r"^\s*(.+?)\s*->\s*(.+?)(?:\s+via\s+(\w+))?\s*$", re.IGNORECASE)


@dataclass(frozen=True, order=True)
class Node:
    """One component: kind "embed", "head", "kv" (a key/value head: receives only), "mlp" or "logits"; `layer`
    orders them (embed -1, logits last; within a layer heads, key/value heads, the MLP)."""

    layer: int
    kind: str
    head: int = -1  # heads: the query head's index; "kv": the key/value head's index

    @property
    def label(self) -> str:
        if self.kind == "head":
            return head_label((self.layer, self.head))
        if self.kind == "kv":
            return KVHead(self.layer, self.head).label
        if self.kind == "mlp":
            return f"MLP{self.layer}"
        return self.kind

    def __str__(self) -> str:
        return self.label


LOGITS_LAYER = 2**31 - 1  # the logits sort after every layer of any model


def parse_node(node: "Node | str") -> Node:
    """A Node from 'embed', a head label 'L1H2' or a key/value head label 'L1KV0' (`interp.heads.parse_label`:
    'L1 H2' too), 'MLP0' or 'logits' (case ignored)."""
    if isinstance(node, Node):
        return node
    if not isinstance(node, str):
        raise BadInput(f"{node!r} is not a node; expected 'embed', a head 'L{{layer}}H{{head}}', 'MLP{{layer}}' or 'logits'.")
    match = _NODE.match(node)
    if match is not None:
        embed, mlp, _ = match.groups()
        return Node(-1, "embed") if embed else Node(int(mlp), "mlp") if mlp is not None else Node(LOGITS_LAYER, "logits")
    try:
        head = parse_label(node)
    except BadInput:
        raise BadInput(f"{node!r} is not a node; expected 'embed', a head 'L{{layer}}H{{head}}', a key/value head "
                       "'L{layer}KV{kv_head}', 'MLP{layer}' or 'logits'.") from None
    if isinstance(head, KVHead):
        return Node(head.layer, "kv", head.kv_head)
    return Node(head.layer, "head", head.head)


@dataclass(frozen=True, order=True)
class Edge:
    """A sender's write reaching one input of a receiver."""

    sender: Node
    receiver: Node
    via: str

    @property
    def label(self) -> str:
        """'L0H0 -> L1H1 via k'; edges into an MLP or the logits (one input each) read 'L0H1 -> MLP1', 'L1H1 -> logits'."""
        return f"{self.sender} -> {self.receiver}" + ("" if self.via in ("in", "direct") else f" via {self.via}")

    def __str__(self) -> str:
        return self.label


def parse_edge(edge: "Edge | str", model: nn.Module | None = None) -> Edge:
    """An Edge from 'L0H0 -> L1H1 via k', 'L0H0 -> L1KV0 via k' (a grouped layer's key/value head), 'L0H0 -> MLP1'
    (via in), 'MLP1 -> logits' (direct); checked against `model`'s graph when given."""
    if isinstance(edge, Edge):
        parsed = edge
    else:
        match = _EDGE.match(edge) if isinstance(edge, str) else None
        if match is None:
            raise BadInput(f"{edge!r} is not an edge; expected 'SENDER -> RECEIVER via q|k|v' (e.g. 'L0H0 -> L1H1 via k'), "
                           "'SENDER -> MLP{layer}' or 'SENDER -> logits'.")
        sender, receiver = parse_node(match.group(1)), parse_node(match.group(2))
        via = (match.group(3) or "").lower() or {"mlp": "in", "logits": "direct"}.get(receiver.kind, "")
        if not via:
            wanted = "'via k' or 'via v'" if receiver.kind == "kv" else "'via q', 'via k' or 'via v'"
            raise BadInput(f"edge {edge!r} into a {'key/value ' if receiver.kind == 'kv' else ''}head needs {wanted} "
                           "(which input the sender reaches).")
        parsed = Edge(sender, receiver, via)
    if parsed.via not in VIAS:
        raise BadInput(f"edge {parsed.label!r}: via {parsed.via!r}; expected one of {list(VIAS)}.")
    if model is not None:
        check_edges(model, [parsed])
    return parsed


def as_edges(edges: Any, where: str) -> list[Edge]:
    """Edges from one edge (an `Edge` or its label: one string is one edge) or a collection of them, duplicates
    dropped, order kept; BadInput naming `where` and the item that is not an edge."""
    if isinstance(edges, (Edge, str)):
        edges = [edges]
    elif isinstance(edges, (bytes, dict)) or not isinstance(edges, Iterable):
        raise BadInput(f"{where}: edges={edges!r} ({type(edges).__name__}); expected an edge label such as "
                       "'L0H0 -> L1H1 via k', an Edge, or a list of them.")
    seen: set[Edge | str] = set()
    out: dict[Edge, None] = {}
    for item in edges:
        if not isinstance(item, (Edge, str)):
            raise BadInput(f"{where}: {item!r} ({type(item).__name__}) is not an edge; expected labels such as "
                           "'L0H0 -> L1H1 via k', 'L1H0 -> MLP1', 'L1H0 -> logits', or Edge objects.")
        if item not in seen:  # a label repeated is parsed once
            seen.add(item)
            out[parse_edge(item)] = None
    return list(out)


def kv_node(layer: int, head: int, group: int) -> Node:
    """The key/value head that query head `head` of a layer with `group` query heads per key/value head reads."""
    return Node(layer, "kv", head // group)


def group_heads(node: Node, group: int) -> list[Node]:
    """The query heads that read key/value head `node` (kind "kv") on a layer with `group` query heads per key/value
    head: the heads whose keys and values an edge into it changes."""
    return [Node(node.layer, "head", head) for head in range(node.head * group, (node.head + 1) * group)]


def kv_edge(edge: Edge, group: int) -> Edge:
    """The graph's name for `edge` when its receiver's layer shares each key/value head among `group` query heads
    (grouped-query attention): a head's key or value input is its key/value head's ('L0H0 -> L1H1 via k' is
    'L0H0 -> L1KV0 via k' with groups of 2). Every other edge is its own name."""
    receiver = edge.receiver
    if receiver.kind != "head" or edge.via not in ("k", "v") or group <= 1:
        return edge
    return Edge(edge.sender, kv_node(receiver.layer, receiver.head, group), edge.via)


def refuse_kv_alias(edge: Edge, group: int, n_kv: int | None = None) -> None:
    """BadInput when `edge` names a head's input the way a layer with `group` query heads per key/value head (and
    `n_kv` key/value heads, when given) does not: a query head's key or value input on a grouped layer (naming the
    key/value head's edge, `kv_edge`), a key/value head on an ungrouped layer (naming the head's), a key/value head's
    query input, a key/value head out of range."""
    receiver = edge.receiver
    if receiver.kind == "kv":
        if group <= 1:
            named = Edge(edge.sender, Node(receiver.layer, "head", receiver.head), edge.via)
            raise BadInput(f"edge {edge.label!r}: layer {receiver.layer} does not group its query heads (each head is its "
                           f"own key/value head), so it has no key/value head {receiver}: use {named.label!r}.")
        heads = group_heads(receiver, group)
        if edge.via not in ("k", "v"):
            raise BadInput(f"edge {edge.label!r}: a key/value head is reached via k or v only; the query heads reading "
                           f"{receiver} are {heads[0]}..{heads[-1]}: name one, e.g. "
                           f"{Edge(edge.sender, heads[0], 'q').label!r}.")
        if n_kv is not None and receiver.head >= n_kv:
            raise BadInput(f"edge {edge.label!r}: layer {receiver.layer} has {n_kv} key/value heads (L{receiver.layer}KV0.."
                           f"L{receiver.layer}KV{n_kv - 1}); {receiver} does not exist.")
        return
    named = kv_edge(edge, group)
    if named == edge or n_kv is not None and receiver.head >= group * n_kv:
        return
    heads, which = group_heads(named.receiver, group), "key" if edge.via == "k" else "value"
    raise BadInput(f"edge {edge.label!r} is not an edge of this model's graph: with grouped-query attention heads "
                   f"{heads[0]}..{heads[-1]} share one {which} head ({named.receiver}), and the graph names its {which} "
                   f"input by it: use {named.label!r}.")


def _blocks(model: nn.Module) -> Any:
    """The model's blocks (a HookedGPT's `blocks`: check_graph_model has checked them)."""
    return model.blocks


def _n_layers(model: nn.Module) -> int:
    return len(_blocks(model))


# why path patching cannot run on a model hooked by interception, and what can (also analyses.circuits.composition)
SPLIT_INPUTS_NEEDED = ("a model whose heads read split q/k/v inputs (blocks.{l}.attn.hook_q_input ...), so that one "
                       "head's query, key or value input can be patched alone")
SPLIT_INPUTS_WORK = ("What works: a HookedGPT (interp.models), a checkpoint saved with interp.save, a Hugging Face model "
                     "that interp.load converts (GPT-2, Llama, Qwen2, ...), or a nanoGPT ckpt.pt through "
                     "interp.load('ckpt.pt'). On this model, head ablations, patterns and claims (interp.Run) work as "
                     "they are.")


def check_graph_model(model: nn.Module, where: str = "edge patching") -> None:
    """Refuse a model whose residual stream is not a sum of node writes, or that lacks split inputs."""
    blocks = getattr(model, "blocks", None)
    if blocks is None or not all(hasattr(block, "hook_q_input") for block in blocks):
        raise BadInput(f"{where} needs {SPLIT_INPUTS_NEEDED}; {user_class(model).__name__} has none (hooked by intercepting its "
                       f"attention, it computes q, k and v from one input). {split_inputs_advice(model, _head_count(model))}")
    if any(block.cfg.post_norm for block in blocks):
        raise BadInput(f"{where} needs a pre-norm model: {user_class(model).__name__}'s post-norm blocks normalise the residual "
                       "stream between writers, so it is not a sum of node outputs. Use head ablations (interp.Run) there.")


def _head_count(model: nn.Module) -> int | None:
    """The first attention site's head count, or None where no site can be found."""
    from interp.hooks import attention_sites

    try:
        return attention_sites(model)[0].n_heads
    except (BadInput, TypeError, IndexError):
        return None


def nodes(model: nn.Module) -> list[Node]:
    """Every component, in forward order: embed, each layer's heads then its MLP, logits. These are what writes
    (and the logits); a grouped layer's key/value heads only receive, and are in `receivers`."""
    check_graph_model(model)
    out = [Node(-1, "embed")]
    for layer, block in enumerate(_blocks(model)):
        out += [Node(layer, "head", head) for head in range(block.cfg.n_heads)]
        if not block.cfg.attn_only:
            out.append(Node(layer, "mlp"))
    return out + [Node(LOGITS_LAYER, "logits")]


def receivers(model: nn.Module) -> list[Node]:
    """Every node an edge can reach, in forward order: each layer's heads, its key/value heads where the layer
    groups query heads (grouped-query attention), its MLP; the logits."""
    check_graph_model(model)
    out = []
    for layer, block in enumerate(_blocks(model)):
        out += [Node(layer, "head", head) for head in range(block.cfg.n_heads)] + kv_nodes(model, layer)
        if not block.cfg.attn_only:
            out.append(Node(layer, "mlp"))
    return out + [Node(LOGITS_LAYER, "logits")]


def kv_readers(model: nn.Module) -> dict[Node, tuple[Node, ...]]:
    """Each key/value head of the model's grouped layers and the query heads that read it (its outputs: an edge into
    it matters only through them); empty without grouped-query attention."""
    return {kv: tuple(group_heads(kv, group_of(model, kv.layer)))
            for layer in range(_n_layers(model)) for kv in kv_nodes(model, layer)}


def group_of(model: nn.Module, layer: int) -> int:
    """Query heads per key/value head on `layer` (1: each head is its own key/value head)."""
    return int(_blocks(model)[layer].attn.group)


def kv_nodes(model: nn.Module, layer: int) -> list[Node]:
    """A grouped layer's key/value heads (none on an ungrouped layer)."""
    attn = _blocks(model)[layer].attn
    return [Node(layer, "kv", g) for g in range(attn.n_kv_heads)] if attn.group > 1 else []


def reads(model: nn.Module, sender: Node, receiver: Node) -> bool:
    """Whether `receiver`'s input holds `sender`'s write (the sender runs earlier in the forward)."""
    if sender.kind == "logits" or receiver.kind == "embed":
        return False
    if receiver.kind == "logits" or sender.kind == "embed":
        return True
    if receiver.kind in ("head", "kv"):
        return sender.layer < receiver.layer
    # an MLP reads its own layer's heads unless the block is parallel (its MLP reads resid_pre)
    parallel = bool(_blocks(model)[receiver.layer].cfg.parallel_attn_mlp)
    return sender.layer < receiver.layer or (sender.layer == receiver.layer and sender.kind == "head" and not parallel)


def _vias(model: nn.Module, receiver: Node) -> tuple[str, ...]:
    """The inputs of a receiver that are edges of the graph: on a grouped layer a head's query only, its key/value
    head's key and value."""
    if receiver.kind == "mlp":
        return ("in",)
    if receiver.kind == "logits":
        return ("direct",)
    if receiver.kind == "kv":
        return ("k", "v")
    return ("q",) if group_of(model, receiver.layer) > 1 else HEAD_VIAS


def graph(model: nn.Module) -> list[Edge]:
    """Every edge of the model: each sender into each later receiver's q, k and v (heads), in (MLPs) or
    direct (logits); on a grouped layer q into each head and k and v into each key/value head (`_vias`)."""
    senders = [node for node in nodes(model) if node.kind != "logits"]
    edges = []
    for receiver in receivers(model):
        vias = _vias(model, receiver)
        for sender in senders:
            if reads(model, sender, receiver):
                edges += [Edge(sender, receiver, via) for via in vias]
    return sorted(edges, key=lambda e: (e.receiver, VIAS.index(e.via), e.sender))


def check_edges(model: nn.Module, edges: Iterable[Edge]) -> None:
    """Each edge exists in the model's graph; the error names what does (on a grouped layer, the key/value head's
    edge for a head's key or value input, and the other way round)."""
    writers, reached = set(nodes(model)), set(receivers(model))
    for edge in edges:
        if edge.sender.kind == "kv":
            raise BadInput(f"edge {edge.label!r}: {edge.sender} is a key/value head, which writes nothing to the residual "
                           "stream; it can only receive (its query heads write: L{layer}H{head}).")
        if edge.receiver.kind in ("head", "kv"):
            _check_head_input(model, edge)
        for node, known in ((edge.sender, writers), (edge.receiver, reached)):
            if node.kind != "logits" and node not in known:
                shown = ", ".join(n.label for n in sorted(known)[:6])
                raise BadInput(f"edge {edge.label!r}: {node.label} does not exist in this {user_class(model).__name__} "
                               f"(its nodes: {shown}, ..., logits).")
        wanted = _wanted_vias(edge.receiver)
        if edge.via not in wanted:
            raise BadInput(f"edge {edge.label!r}: a {edge.receiver.kind} receiver is reached via {' / '.join(wanted)}, "
                           f"not {edge.via!r}.")
        if not reads(model, edge.sender, edge.receiver):
            raise BadInput(f"edge {edge.label!r}: {edge.receiver} does not read {edge.sender} (a receiver reads only "
                           "nodes earlier in the forward).")


def _wanted_vias(receiver: Node) -> tuple[str, ...]:
    return {"head": HEAD_VIAS, "kv": ("k", "v"), "mlp": ("in",)}.get(receiver.kind, ("direct",))


def _check_head_input(model: nn.Module, edge: Edge) -> None:
    """`refuse_kv_alias` with the receiver layer's grouping (nothing for a layer the model lacks: check_edges names it)."""
    if 0 <= edge.receiver.layer < _n_layers(model):
        attn = _blocks(model)[edge.receiver.layer].attn
        refuse_kv_alias(edge, int(attn.group), int(attn.n_kv_heads))


# -- what the forward carries at each node


def write_hook(node: Node) -> str:
    """The hook whose activation gives a sender's write: z for heads (times W_O[h]), mlp_out, resid_pre 0."""
    if node.kind == "head":
        return f"blocks.{node.layer}.attn.hook_z"
    if node.kind == "mlp":
        return f"blocks.{node.layer}.hook_mlp_out"
    if node.kind == "embed":
        return "blocks.0.hook_resid_pre"
    raise BadInput(f"{node.label} writes nothing to the residual stream; it can only receive.")


def input_hook(model: nn.Module, edge: Edge) -> tuple[str, int | None]:
    """The hook of the receiver's input an edge reaches, and the head index in it (the key/value head's for k / v:
    the receiver itself, a key/value head on a grouped layer or a head that is its own elsewhere)."""
    receiver = edge.receiver
    if receiver.kind == "logits":
        return f"blocks.{_n_layers(model) - 1}.hook_resid_post", None
    if receiver.kind == "mlp":
        return f"blocks.{receiver.layer}.hook_mlp_in", None
    if receiver.kind == "head" and edge.via != "q" or receiver.kind == "kv":
        _check_head_input(model, edge)  # a grouped head's k / v is its key/value head's: never patched under its name
    return f"blocks.{receiver.layer}.attn.hook_{edge.via}_input", receiver.head


def node_write(model: nn.Module, node: Node, act: torch.Tensor) -> torch.Tensor:
    """A sender's write (batch, pos, d_model) from its hook's activation (`write_hook`)."""
    if node.kind == "head":
        write: torch.Tensor = _blocks(model)[node.layer].attn.head_write(node.head, act[:, :, node.head])
        return write
    return act


@torch.no_grad()
def sender_writes(model: nn.Module, prompts: PromptSet, senders: Iterable[Node]) -> dict[Node, torch.Tensor]:
    """Each sender's write (batch, pos, d_model) on `prompts` (one forward, stopped after the last sender)."""
    senders = sorted(set(senders))
    acts: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any) -> None:
        acts[hook.name] = act.detach().clone()

    last = max(node.layer for node in senders) + 1
    with hooked(model, [(name, keep) for name in {write_hook(node) for node in senders}]):
        model(prompts.tokens, attention_mask=prompts.attention_mask, stop_at_layer=max(last, 1))
    return {node: node_write(model, node, acts[write_hook(node)]) for node in senders}


def edge_hooks(model: nn.Module, edges: Iterable[Edge], corrupted: dict[Node, torch.Tensor]
               ) -> list[tuple[str, Callable[..., Any]]]:
    """Hooks that patch `edges` in one forward: record each sender's write as it happens, and add
    corrupted - current to each receiver input. `corrupted`: `sender_writes` on the corrupted prompts."""
    edges = list(edges)
    current: dict[Node, torch.Tensor] = {}
    senders = sorted({edge.sender for edge in edges})

    def record(act: torch.Tensor, hook: Any) -> None:
        for node in senders:
            if write_hook(node) == hook.name:
                current[node] = node_write(model, node, act)

    by_input: dict[str, list[tuple[int | None, Node]]] = {}
    for edge in edges:
        name, index = input_hook(model, edge)
        if (index, edge.sender) not in by_input.setdefault(name, []):  # each input patched once per sender
            by_input[name].append((index, edge.sender))

    def make_patch(targets: list[tuple[int | None, Node]]) -> Callable[..., torch.Tensor]:
        def patch(act: torch.Tensor, hook: Any) -> torch.Tensor:  # (batch, pos, [head,] d_model)
            act = act.clone()
            for index, sender in targets:
                delta = corrupted[sender] - current[sender]
                if index is None:
                    act += delta
                else:
                    act[:, :, index] += delta
            return act
        return patch

    hooks: list[tuple[str, Callable[..., Any]]] = [(name, record) for name in {write_hook(node) for node in senders}]
    return hooks + [(name, make_patch(targets)) for name, targets in by_input.items()]


# -- where the corrupted run comes from


def donors(prompts: PromptSet, seed: int) -> torch.Tensor:
    """(prompt,) each prompt's donor: a random cyclic order within each group of equal real length
    (so no prompt is its own donor), keyed by `seed` and the prompts alone."""
    lengths = prompts.real_mask().sum(-1)
    out = torch.empty(len(prompts), dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    for length in sorted(set(lengths.tolist())):
        group = (lengths == length).nonzero().flatten()
        if len(group) < 2:
            raise BadInput(f"resampling needs another prompt of the same length for each prompt; prompt "
                           f"{prompts.row_numbers(group.tolist())[0]} is the only one of {length} real tokens. Give "
                           "prompts of equal lengths, or a corrupted set (source=PromptSet, row for row).")
        order = group[torch.randperm(len(group), generator=generator)]
        out[order] = order.roll(-1)
    return out


@dataclass(frozen=True)
class EdgePatch:
    """Patch `edges` with the senders' writes from a corrupted run (see the module): an `interp.Run`
    intervention, so `run.effect(EdgePatch(...))` gives the behaviour's change per prompt with a CI."""

    edges: tuple[Edge, ...]
    source: PromptSet | None = field(default=None, compare=False, hash=False)  # None: resample within the Run's prompts
    label_: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "edges", tuple(sorted(as_edges(self.edges, "EdgePatch"))))
        if not self.edges:
            raise BadInput("EdgePatch needs at least one edge, e.g. EdgePatch(['L0H0 -> L1H1 via k']).")
        if self.source is not None and not isinstance(self.source, PromptSet):
            raise BadInput(f"EdgePatch.source must be a PromptSet (the corrupted prompts, row for row) or None "
                           f"(resample), got {type(self.source).__name__}.")

    def spec(self) -> dict[str, Any]:
        source = "resample" if self.source is None else {"prompts": prompt_fingerprint(self.source)}
        return {"intervention": "edge_patch", "edges": [edge.label for edge in self.edges], "source": source}

    @property
    def label(self) -> str:
        return self.label_ or ("; ".join(edge.label for edge in self.edges) if len(self.edges) <= 3
                               else f"{len(self.edges)} edges")

    def intervene(self, run: Any, batch: PromptSet) -> contextlib.AbstractContextManager[nn.Module]:
        check_graph_model(run.model)
        check_edges(run.model, self.edges)
        corrupted = sender_writes(run.model, corrupted_prompts(run, batch, self.source), [edge.sender for edge in self.edges])
        return hooked(run.model, edge_hooks(run.model, self.edges, corrupted))


def corrupted_prompts(run: Any, batch: PromptSet, source: PromptSet | None = None) -> PromptSet:
    """The corrupted prompts the model reads for `batch` (rows of the Run's prompts): each prompt's donor
    (`donors`, keyed by the Run's seed) or, with `source`, its row of the corrupted set."""
    positions = _positions_in(run.prompts, batch)
    if source is not None:
        if source.tokens.shape != run.prompts.tokens.shape:
            raise BadInput(f"EdgePatch.source has shape {tuple(source.tokens.shape)}; expected the Run's prompts' "
                           f"{tuple(run.prompts.tokens.shape)} (one corrupted prompt per prompt, row for row).")
        chosen = source[positions]
    else:
        donor = run.cached(("edge-donors",), lambda: donors(run.prompts, run.seed))
        chosen = run.prompts[donor[positions]]
    read: PromptSet = run.behaviour.model_prompts(chosen)
    return read


def _positions_in(prompts: PromptSet, batch: PromptSet) -> torch.Tensor:
    """Where `batch`'s prompts sit in `prompts`, by their rows."""
    rows = torch.arange(len(prompts)) if prompts.rows is None else prompts.rows
    where = {int(row): i for i, row in enumerate(rows.tolist())}
    batch_rows = torch.arange(len(batch)) if batch.rows is None else batch.rows
    if len(where) != len(rows) or any(int(r) not in where for r in batch_rows):
        raise BadInput("EdgePatch could not place a batch in the Run's prompts (their rows repeat or differ); build the "
                       "PromptSet with distinct rows.")
    return torch.tensor([where[int(r)] for r in batch_rows])


@contextlib.contextmanager
def patch_edges(model: nn.Module, edges: Iterable[Edge | str], prompts: PromptSet, corrupted: PromptSet
                ) -> Iterator[nn.Module]:
    """`with patch_edges(model, ["L0H0 -> L1H1 via k"], prompts, corrupted): model(prompts.tokens)`: the
    edges patched from `corrupted` (row for row) for a forward on `prompts`; hooks removed on exit."""
    check_graph_model(model)
    parsed = [parse_edge(edge, model) for edge in edges]
    writes = sender_writes(model, corrupted, [edge.sender for edge in parsed])
    with hooked(model, edge_hooks(model, parsed, writes)):
        yield model


__all__ = ["Edge", "EdgePatch", "HEAD_VIAS", "LOGITS_LAYER", "Node", "VIAS", "Via", "as_edges", "check_edges",
           "check_graph_model", "corrupted_prompts", "donors", "edge_hooks", "graph", "group_heads", "group_of",
           "input_hook", "kv_edge", "kv_node", "kv_nodes", "kv_readers", "nodes", "parse_edge", "parse_node", "patch_edges", "reads", "receivers",
           "refuse_kv_alias", "sender_writes", "write_hook"]
