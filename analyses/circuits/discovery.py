"""Circuit discovery: which edges a behaviour needs, proposed on one half of the prompts and tested on the other.

    circuit = discover(model, prompts, method="acdc")    # or "eap"; a Run works too
    circuit.frame()       # every edge scored: sender, receiver, via, score, in_circuit
    circuit.test.frame()  # faithfulness, completeness, minimality on the held-out half
    Circuit.from_json(circuit.to_json())

Methods (both patch from the corrupted run, `interp.paths.EdgePatch`'s resampled prompts or a given set):

- "acdc" (Conmy et al. 2023): receivers from the logits backwards (reverse forward order); for each
  incoming edge, patch it on top of the edges removed so far; if the behaviour (mean over prompts) moves by
  less than the threshold it stays removed. Exact patched runs, each the Run's `EdgePatch` effect (memoised there;
  swept by `run.sweep`, resumed from the receiver's layer). A receiver none of whose outgoing edges is kept cannot be seen through any edge, so its incoming
  edges are removed without a run (score 0: patching them changes nothing, exactly).
- "eap": attribution patching (`interp.analyses.circuits.attribution`): keep the edges whose estimated
  effect is at least the threshold. One corrupted forward and one forward and backward per batch.
- "nodes": ACDC over heads and MLPs instead of edges (a head-level circuit): from the last layer backwards,
  patch a node's write for every reader of it (all its outgoing edges, `PatchSweep.node_values`) on top of
  the nodes removed so far; it stays removed if the behaviour moves by less than the threshold. The circuit
  is every edge between the kept nodes (the embeddings and the logits always kept); an edge's score is its
  sender's. One patched forward per node (about 300 on SmolLM2-135M) against one per edge for "acdc".

Power: a patch can only see a sender whose write the corruption changes (`interp.analyses.circuits.power`: a layer-0
head writing positions is the same on every prompt, so resampling its edges changes nothing, exactly). ACDC keeps an
edge whose sender's largest relative write change is below `interp.claims.POWER_FLOOR` (1e-6), however it scores,
and marks it untested (`Circuit.untested`: the reason, and the behaviour's change when the edge alone is zeroed,
off-distribution); `prune` never drops it for its sender's inputs, only when nothing reads its receiver. ACDC
and "nodes" record every sender's change (`Circuit.write_change`); "nodes" never removes a powerless head or MLP
either (its outgoing edges between kept nodes are untested); EAP drops such an edge (its estimate is 0 as well) and
records no change.

ACDC patches each edge once: a model with more than `ACDC_MAX_EDGES` edges is refused (the message
estimates the time from one timed patched forward), and "nodes" or "eap" are the ways to go.

Both then drop edges that cannot carry anything: from a sender none of whose inputs is kept (it computes its
corrupted output, so patching its edges is a no-op) and into a receiver none of whose outputs is kept.

Thresholds are fixed fractions of the gap |B(all patched) - B(clean)| on the proposing prompts, the same on
every model and not tuned per model (module constants below). Prompts on which that gap is within its own noise
(its 95% bootstrap CI over prompts holds 0: `evaluation.check_gap`) are refused: there is no behaviour to explain,
and any fraction of a noise gap keeps edges at random.

`Circuit` checks its fields (edges parsed and deduplicated, nodes those the edges touch, the method, the threshold
in [0, 1), numbers where numbers belong, untested edges among the kept ones); `Circuit.from_json` reads this version's
schema and version 1 (written before `untested` and `write_change`).
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping, get_args

import pandas as pd
from torch import nn

from interp.analyses.circuits.attribution import attribution_patching
from interp.analyses.circuits.evaluation import CircuitTest, check_gap, nodes_of, test_circuit, test_node_circuit
from interp.analyses.circuits.patching import PatchSweep
from interp.analyses.circuits.power import EdgeZero, sweep_write_changes
from interp.data import PromptSet
from interp.errors import BadInput, BadType
from interp.paths import Edge, EdgePatch, Node, as_edges, graph, nodes, parse_edge, parse_node
from interp.progress import Bar
from interp.run import Run, as_run
from interp.validate import as_real, check_fraction

DiscoveryMethod = Literal["acdc", "eap", "nodes"]
DISCOVERY_METHODS: tuple[str, ...] = get_args(DiscoveryMethod)
# An edge whose removal moves the behaviour by less than 1% of the clean-to-fully-patched gap is below the
# resolution at which faithfulness is reported (two decimals of a fraction of that gap), so ACDC drops it.
ACDC_THRESHOLD = 0.01
# The same resolution for EAP's estimate of one edge's effect (its estimate is in the behaviour's unit too).
EAP_THRESHOLD = 0.01
# The same resolution for a whole node's removal.
NODES_THRESHOLD = 0.01
# ACDC's budget: one exact patched forward per edge; beyond this many edges it would take hours on a CPU
# (SmolLM2-135M has about 70,000), and "nodes" (one per head or MLP) or "eap" (one backward) answer instead.
ACDC_MAX_EDGES = 5000
SCHEMA = "interp.circuit/2"  # 2: `untested` (edges kept without power) and `write_change` (each sender's)
READABLE_SCHEMAS = ("interp.circuit/1", SCHEMA)  # version 1 files have neither field


@dataclass(frozen=True, eq=False)
class Circuit:
    """A set of edges (labels 'L0H0 -> L1H0 via k'), the nodes they touch, and the score of every edge tried."""

    nodes: tuple[str, ...]
    edges: tuple[str, ...]
    scores: dict[str, float]  # every edge of the model: ACDC, the behaviour's change on removal; EAP, the estimate
    method: str
    threshold: float  # fraction of |B(all patched) - B(clean)| on the proposing prompts
    behaviour: str = ""
    unit: str = ""
    gap: float = float("nan")  # B(all patched) - B(clean) on the proposing prompts
    n_prompts: int = 0  # the proposing prompts
    model: str = ""
    test: CircuitTest | None = field(default=None, repr=False)  # on the held-out prompts (discover's split)
    # kept edges the method could not test: their sender's write is the same under the corruption (edge -> why)
    untested: Mapping[str, str] = field(default_factory=dict)
    # each sender's largest relative write change under the corruption (`interp.analyses.circuits.power`); acdc
    write_change: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Checks every field (BadInput naming it): edges parsed and deduplicated (one label is one edge), the nodes
        those the edges touch (derived when none are given; others refused), the method, the threshold in [0, 1),
        the scores numbers keyed by edge labels, the gap a number (NaN: unknown), n_prompts a whole number >= 0."""
        edges = [e.label for e in as_edges(self.edges, "Circuit")]
        object.__setattr__(self, "edges", tuple(edges))
        object.__setattr__(self, "nodes", _nodes(self.nodes, edges))
        if self.method not in DISCOVERY_METHODS:
            raise BadInput(f"Circuit: method={self.method!r}; expected one of {list(DISCOVERY_METHODS)} (how it was found).")
        object.__setattr__(self, "threshold", check_fraction(self.threshold, "threshold", "Circuit",
                                                             what="a fraction of the clean-vs-patched gap"))
        if not isinstance(self.scores, Mapping):
            raise BadInput(f"Circuit: scores is a {type(self.scores).__name__}; expected a mapping of edge labels to "
                           "numbers (every edge tried and its score).")
        object.__setattr__(self, "scores", {_edge_label(k): as_real(v, f"scores[{k!r}]", "Circuit")
                                            for k, v in self.scores.items()})
        object.__setattr__(self, "gap", as_real(self.gap, "gap", "Circuit"))
        if isinstance(self.n_prompts, bool) or not isinstance(self.n_prompts, int) or self.n_prompts < 0:
            raise BadInput(f"Circuit: n_prompts={self.n_prompts!r}; expected a whole number >= 0 (the proposing prompts).")
        for name in ("behaviour", "unit", "model"):
            if not isinstance(getattr(self, name), str):
                raise BadInput(f"Circuit: {name}={getattr(self, name)!r}; expected a string.")
        object.__setattr__(self, "untested", _untested_field(self.untested, edges))
        object.__setattr__(self, "write_change", _write_change_field(self.write_change))

    @property
    def tau(self) -> float:
        """The threshold in the behaviour's unit on the proposing prompts."""
        return self.threshold * abs(self.gap)

    def frame(self) -> pd.DataFrame:
        """One row per scored edge: sender, receiver, via, score, in_circuit, method, threshold (unit), unit, then
        `untested` (kept without power: the corruption does not change the sender's write) and `write_change` (the
        sender's largest relative write change; NaN where not recorded)."""
        kept = set(self.edges)
        rows = []
        for label, score in self.scores.items():
            edge = parse_edge(label)
            rows.append({"sender": edge.sender.label, "receiver": edge.receiver.label, "via": edge.via, "score": score,
                         "in_circuit": label in kept, "method": self.method, "threshold": self.tau, "unit": self.unit,
                         "untested": label in self.untested,
                         "write_change": self.write_change.get(edge.sender.label, float("nan"))})
        columns = ["sender", "receiver", "via", "score", "in_circuit", "method", "threshold", "unit", "untested",
                   "write_change"]
        return pd.DataFrame(rows, columns=columns)

    def to_json(self) -> str:
        """Plain JSON: edges, nodes, scores, method, threshold and what they were measured on (not the test)."""
        data = {"schema": SCHEMA, "nodes": list(self.nodes), "edges": list(self.edges), "scores": self.scores,
                "method": self.method, "threshold": self.threshold, "behaviour": self.behaviour, "unit": self.unit,
                "gap": None if math.isnan(self.gap) else self.gap, "n_prompts": self.n_prompts, "model": self.model,
                "untested": dict(self.untested),
                "write_change": {k: v if math.isfinite(v) else None for k, v in self.write_change.items()}}
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes | Mapping[str, Any]) -> "Circuit":
        """A Circuit from `to_json`'s text (str or UTF-8 bytes) or its parsed dict, every field checked as the
        constructor checks it (BadInput naming the field); a schema other than this version's is refused."""
        data = _json_object(text)
        schema = data.get("schema", SCHEMA)  # files written before the schema field are version 1
        if schema not in READABLE_SCHEMAS:
            raise BadInput(f"Circuit.from_json: schema {schema!r}; this version of the toolkit reads "
                           f"{' and '.join(map(repr, READABLE_SCHEMAS))} (write the circuit again with Circuit.to_json()).")
        missing = [k for k in ("edges", "method", "threshold") if k not in data]
        if missing:
            raise BadInput(f"Circuit.from_json: {missing} missing; expected Circuit.to_json()'s fields "
                           "(edges, nodes, scores, method, threshold, ...).")
        gap = data.get("gap")
        try:
            changes = data.get("write_change") or {}
            if isinstance(changes, Mapping):
                changes = {k: float("nan") if v is None else v for k, v in changes.items()}
            return cls(data.get("nodes") or (), data["edges"], data.get("scores") or {}, data["method"], data["threshold"],
                       data.get("behaviour", ""), data.get("unit", ""), float("nan") if gap is None else gap,
                       data.get("n_prompts", 0), data.get("model", ""), untested=data.get("untested") or {},
                       write_change=changes)
        except BadInput as error:
            raise type(error)(f"Circuit.from_json: {str(error).removeprefix('Circuit: ')}") from None


def _json_object(text: Any) -> dict[str, Any]:
    """The JSON object of `Circuit.from_json`'s input; BadInput when it is not JSON or not an object."""
    if isinstance(text, Mapping):
        return dict(text)
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as error:
            raise BadInput(f"Circuit.from_json: the bytes are not UTF-8 text ({error}); expected Circuit.to_json()'s "
                           "text.") from None
    if not isinstance(text, str):
        raise BadType(f"Circuit.from_json takes Circuit.to_json()'s text (str or bytes) or its parsed dict, got "
                      f"{type(text).__name__}.")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        why = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise BadInput(f"Circuit.from_json: not JSON ({why}); expected Circuit.to_json()'s text.") from None
    if not isinstance(data, dict):
        shown = json.dumps(data)[:40] if not isinstance(data, (list, dict)) else type(data).__name__
        raise BadInput(f"Circuit.from_json: the JSON holds {shown}, not an object; expected a JSON object with edges, "
                       "method, threshold (Circuit.to_json()'s text).")
    return data


def _nodes(given: Any, edges: list[str]) -> tuple[str, ...]:
    """The nodes the edges touch, in forward order; `given` nodes (if any) must be exactly those."""
    derived = nodes_of(edges)
    if isinstance(given, str) or not isinstance(given, Iterable):
        raise BadInput(f"Circuit: nodes={given!r}; expected a list of node labels (or none: they follow from the edges).")
    labels = set()
    for node in given:
        if not isinstance(node, (str, Node)):
            raise BadInput(f"Circuit: node {node!r} ({type(node).__name__}) is not a node label such as 'L1H2'.")
        labels.add(parse_node(node).label)
    if labels and labels != set(derived):
        raise BadInput(f"Circuit: nodes {sorted(labels)} are not those its edges touch ({derived}); leave nodes out, "
                       "they follow from the edges.")
    return tuple(derived)


def _untested_field(given: Any, edges: list[str]) -> dict[str, str]:
    """`Circuit.untested` checked: edge labels of the circuit, each with its reason in words."""
    if not isinstance(given, Mapping):
        raise BadInput(f"Circuit: untested is a {type(given).__name__}; expected a mapping of edge labels to the reason "
                       "each was kept untested.")
    out = {}
    for key, reason in given.items():
        label = _edge_label(key)
        if label not in edges:
            raise BadInput(f"Circuit: untested edge {label!r} is not one of the circuit's edges; an untested edge is kept.")
        if not isinstance(reason, str):
            raise BadInput(f"Circuit: untested[{label!r}]={reason!r}; expected the reason in words (a string).")
        out[label] = reason
    return out


def _write_change_field(given: Any) -> dict[str, float]:
    """`Circuit.write_change` checked: node labels (senders) to numbers >= 0 (NaN: unknown)."""
    if not isinstance(given, Mapping):
        raise BadInput(f"Circuit: write_change is a {type(given).__name__}; expected a mapping of sender labels to "
                       "numbers (each sender's largest relative write change).")
    out = {}
    for key, value in given.items():
        if not isinstance(key, (str, Node)):
            raise BadInput(f"Circuit: write_change key {key!r} is not a node label such as 'L0H0'.")
        number = as_real(value, f"write_change[{key!r}]", "Circuit")
        if number < 0:
            raise BadInput(f"Circuit: write_change[{key!r}]={number}; a relative change is >= 0.")
        out[parse_node(key).label] = number
    return out


def _edge_label(key: Any) -> str:
    if not isinstance(key, (str, Edge)):
        raise BadInput(f"Circuit: scores key {key!r} is not an edge label such as 'L0H0 -> L1H1 via k'.")
    return parse_edge(key).label


def prune(edges: set[Edge], untested: Iterable[Edge] = ()) -> set[Edge]:
    """Drop edges from senders with no kept input (but the embeddings) and into receivers with no kept output
    (but the logits), until none is left to drop: patching those changes nothing. `untested` edges (their sender's
    write is the same under the corruption, so no patch can test them) are never dropped for their sender's inputs,
    only when nothing reads their receiver."""
    kept, exempt = set(edges), set(untested)
    while True:
        has_input = {e.receiver for e in kept}
        has_output = {e.sender for e in kept}
        drop = {e for e in kept if (e.sender.kind != "embed" and e.sender not in has_input and e not in exempt)
                or (e.receiver.kind != "logits" and e.receiver not in has_output)}
        if not drop:
            return kept
        kept -= drop


def _receivers_backwards(model: nn.Module) -> list[Node]:
    """Receivers in reverse forward order: the logits, then the last layer's MLP, its heads, ..."""
    order = [node for node in nodes(model) if node.kind != "embed"]
    return order[::-1]


def _checked_gap(run: Run, every: list[Edge], source: PromptSet | None) -> float:
    """B(all patched) - B(clean), the mean over the proposing prompts (the Run's effect of patching every edge);
    BadInput when it is within its noise (`check_gap`: no behaviour for a circuit to explain)."""
    per_prompt = run.effect(EdgePatch(tuple(every), source=source)).values  # (prompt,)
    check_gap(per_prompt, "discover", run.behaviour.unit, run.seed)
    return float(per_prompt.mean())


def acdc(run: Run, threshold: float = ACDC_THRESHOLD, *, source: PromptSet | None = None,
         max_edges: int = ACDC_MAX_EDGES) -> tuple[set[Edge], dict[str, float], float]:
    """ACDC on `run`'s prompts (see the module): the kept edges, every edge's score, and the gap; refused above
    `max_edges` edges with an estimate of the time it would take."""
    sweep = run.sweep(source)
    every = graph(run.model)
    if len(every) > max_edges:
        raise BadInput(_too_many_edges(sweep, every, max_edges))
    gap = _checked_gap(run, every, source)
    clean = float(sweep.clean().mean())
    tau = threshold * abs(gap)
    power = sweep_write_changes(sweep)  # each sender's write under the corruption: no power, no test
    removed: list[Edge] = []
    kept = set(every)
    scores: dict[str, float] = {}
    current = clean
    for receiver in _receivers_backwards(run.model):
        incoming = [e for e in every if e.receiver == receiver]
        if receiver.kind != "logits" and not any(e.sender == receiver for e in kept):
            for edge in incoming:  # nothing reads this receiver: its inputs change nothing
                scores[edge.label] = 0.0
                removed.append(edge)
                kept.discard(edge)
            continue
        for edge in sorted(incoming, key=lambda e: e.sender, reverse=True):
            trial = float(run.effect(EdgePatch((*removed, edge), source=source)).intervened.mean())
            scores[edge.label] = trial - current
            if power[edge.sender].powerless:
                continue  # untested: the patch cannot change the sender's write, so its score is no test; kept
            if abs(trial - current) < tau:
                removed.append(edge)
                kept.discard(edge)
                current = trial
    return prune(kept, {e for e in kept if power[e.sender].powerless}), scores, gap


def untested_edges(run: Run, edges: Iterable[Edge], source: PromptSet | None = None) -> dict[str, str]:
    """The edges among `edges` whose sender's write the corruption does not change (`sweep_write_changes` of the Run's
    sweep for `source`), each with why and what zero-ablating it alone does (off-distribution, said beside)."""
    power = sweep_write_changes(run.sweep(source))
    out = {}
    for edge in sorted(edges):
        change = power.get(edge.sender)
        if change is None or not change.powerless:
            continue
        zero = run.effect(EdgeZero((edge,)))
        out[edge.label] = (f"untested: {change.reason()}; zero-ablating the edge alone moves the behaviour by "
                           f"{zero.mean:.4g} [{zero.ci_low:.4g}, {zero.ci_high:.4g}] {run.behaviour.unit} "
                           "(off-distribution, never support by itself)")
    return out


def eap(run: Run, threshold: float = EAP_THRESHOLD, *, source: PromptSet | None = None
        ) -> tuple[set[Edge], dict[str, float], float]:
    """EAP discovery on `run`'s prompts (see the module): the kept edges, every edge's estimate, and the gap."""
    every = graph(run.model)
    gap = _checked_gap(run, every, source)
    result = attribution_patching(run, source=source)
    means = result.edge_values.mean(1)  # (edge,)
    scores = {edge.label: float(score) for edge, score in zip(result.edges, means)}
    kept = {edge for edge, score in zip(result.edges, means) if abs(float(score)) >= threshold * abs(gap)}
    return prune(kept), scores, gap


def _too_many_edges(sweep: PatchSweep, every: list[Edge], max_edges: int) -> str:
    """Why ACDC is refused: the edges, and the hours one timed patched forward (from the middle layer) implies."""
    import time

    middle = next((e for e in every if e.receiver.kind == "head" and e.receiver.layer == sweep.n_layers // 2), every[0])
    sweep.clean()  # the clean and corrupted forwards, once, outside the timing
    start = time.perf_counter()
    sweep.values([[middle]])
    each = time.perf_counter() - start  # every batch, resumed from the middle layer: about an average edge
    hours = each * len(every) / 3600
    return (f"ACDC patches each of the model's {len(every):,} edges once, about {hours:.1f} h here ({each:.2f} s per "
            f"patched forward over {len(sweep.run.prompts)} prompts), above its budget of {max_edges:,} edges. Use "
            "method='nodes' (ACDC over heads and MLPs: one forward per node; CLI --method nodes) or 'eap' (attribution "
            "patching), or raise max_edges (CLI --max-edges) to run it anyway.")


def nodes_acdc(run: Run, threshold: float = NODES_THRESHOLD, *, source: PromptSet | None = None, progress: bool = False
               ) -> tuple[set[Edge], dict[str, float], float]:
    """ACDC over nodes on `run`'s prompts (see the module): every edge between the kept nodes, each edge scored with
    its sender's removal effect, and the gap. `progress`: a bar over the nodes tried (one patched forward each)."""
    sweep = run.sweep(source)
    every_node = nodes(run.model)
    candidates = [node for node in every_node if node.kind in ("head", "mlp")]
    writers = [node for node in every_node if node.kind != "logits"]
    clean = float(sweep.clean().mean())
    corrupted = sweep.node_values([writers])[0] - sweep.clean()  # (prompt,) every write corrupted: the corrupted run
    check_gap(corrupted, "discover", sweep.run.behaviour.unit, sweep.run.seed)
    gap = float(corrupted.mean())
    tau = threshold * abs(gap)
    power = sweep_write_changes(sweep)  # a node whose write the corruption does not change: kept, untested
    removed: list[Node] = []
    node_scores: dict[Node, float] = {}
    current = clean
    with Bar(len(candidates), "discovering (nodes)", enabled=progress, unit="nodes") as bar:
        for node in sorted(candidates, reverse=True):  # last layer's MLP, its heads, ... layer 0's heads
            trial = float(sweep.node_values([removed + [node]])[0].mean())
            node_scores[node] = trial - current
            if abs(trial - current) < tau and not power[node].powerless:
                removed.append(node)
                current = trial
            bar.advance(note=f"{node.label}: {len(removed)} removed")
    kept_nodes = set(every_node) - set(removed)
    edges = {e for e in graph(run.model) if e.sender in kept_nodes and e.receiver in kept_nodes}
    scores = {e.label: node_scores.get(e.sender, 0.0) for e in graph(run.model)}
    return prune(edges, {e for e in edges if power[e.sender].powerless}), scores, gap


_METHODS = {"acdc": acdc, "eap": eap, "nodes": nodes_acdc}


def discover(model_or_run: nn.Module | Run, prompts: PromptSet | None = None, *, method: DiscoveryMethod = "acdc",
             threshold: float | None = None, behaviour: Any = None, seed: int = 0, batch_size: int = 16,
             split: bool = True, source: PromptSet | None = None, max_edges: int = ACDC_MAX_EDGES,
             progress: bool = False) -> Circuit:
    """A circuit for the behaviour (see the module): proposed on one half of the prompts (`PromptSet.split`,
    seeded) and tested on the other (`.test`), or on all of them with `split=False` (no test). `threshold`:
    a fraction of the clean-vs-patched gap (default: the method's constant). `source`: a corrupted set, row
    for row (default: resampled prompts); with a split, each half reads its own rows of it. `max_edges`:
    ACDC's budget (see the module). `progress`: a bar over the nodes tried (method "nodes")."""
    if method not in _METHODS:
        raise BadInput(f"discover: method={method!r}; expected one of {list(DISCOVERY_METHODS)}.")
    if isinstance(model_or_run, Run):
        run = as_run(model_or_run, prompts, where="discover")
    else:
        run = as_run(model_or_run, prompts, where="discover", behaviour=behaviour, seed=seed, batch_size=batch_size)
    default = {"acdc": ACDC_THRESHOLD, "eap": EAP_THRESHOLD, "nodes": NODES_THRESHOLD}[method]
    fraction = check_fraction(default if threshold is None else threshold, "threshold", "discover",
                              what="a fraction of the clean-vs-patched gap", example=ACDC_THRESHOLD)
    propose_source, test_source = source, None
    if split:
        propose_half, test_half = run.prompts.split(0.5, seed=run.seed)
        propose_run, test_run = run.on(propose_half), run.on(test_half)
        if source is not None:  # split row for row as the prompts are (the same seeded order)
            if source.tokens.shape != run.prompts.tokens.shape:
                raise BadInput(f"discover: source has shape {tuple(source.tokens.shape)}; expected the prompts' "
                               f"{tuple(run.prompts.tokens.shape)} (one corrupted prompt per prompt, row for row).")
            propose_source, test_source = source.split(0.5, seed=run.seed)
    else:
        propose_run, test_run = run, None
    options = {"acdc": {"max_edges": max_edges}, "nodes": {"progress": progress}}.get(method, {})
    kept, scores, gap = _METHODS[method](propose_run, float(fraction), source=propose_source, **options)
    edges = sorted(kept)
    swept = method in ("acdc", "nodes")  # their sweep holds every sender's clean and corrupted writes: power for free
    circuit = Circuit(tuple(nodes_of(edges)), tuple(e.label for e in edges), scores, method, float(fraction),
                      run.behaviour.describe(propose_run.prompts), run.behaviour.unit, gap, len(propose_run.prompts),
                      str(getattr(getattr(run.model, "cfg", None), "model_name", "") or type(run.model).__name__),
                      untested=untested_edges(propose_run, edges, propose_source) if swept else {},
                      write_change={node.label: change.max for node, change in
                                    sweep_write_changes(propose_run.sweep(propose_source)).items()} if swept else {})
    if test_run is None:
        return circuit
    return dataclasses.replace(circuit, test=(test_node_circuit if method == "nodes" else test_circuit)(
        test_run, circuit, source=test_source))


__all__ = ["ACDC_MAX_EDGES", "ACDC_THRESHOLD", "Circuit", "DISCOVERY_METHODS", "DiscoveryMethod", "EAP_THRESHOLD",
           "NODES_THRESHOLD", "acdc", "discover", "eap", "nodes_acdc", "prune", "untested_edges"]
