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
- "eap": attribution patching (`interp.analyses.circuits.attribution`) ranks the edges by |estimate|; the
  circuit is the smallest top-n (n = int(fraction x edges) for MIB's fractions, `curve.MIB_FRACTIONS`, dangling
  edges pruned as the faithfulness curve prunes them) whose *exact* faithfulness on the proposing prompts
  reaches `target` (0.9): each candidate one multi-edge patch through the Run, smallest first, at most ten.
  (All edges kept is the clean run, faithfulness 1, so one always reaches it; were none to, every edge is kept
  and a note says so.) The estimates only order the candidates: on saturated circuits they are of the wrong
  sign on key, value and direct edges and up to 10^13 times smaller than the exact effects (see `attribution`),
  so no cut on them keeps the right edges. Their Spearman correlation with exact single-edge patches on 32 edges (the 16 of
  largest |estimate| and 16 seeded others: `attribution.estimate_agreement`) is recorded; below 0.5 the
  circuit carries a note (and discover warns) that the estimates are unreliable there. `Circuit.selection`
  holds the candidates tried, their faithfulness and the one kept. One corrupted forward and one forward and
  backward per batch, then up to ten patched forwards and 32 single-edge patches.
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

Thresholds ("eap": only the circuit's minimality resolution) are fixed fractions of the gap |B(all patched) - B(clean)| on the proposing prompts, the same on
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
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Mapping, get_args

import pandas as pd
from torch import nn

from interp.analyses.circuits.attribution import AGREEMENT_SAMPLE, attribution_patching, estimate_agreement
from interp.analyses.circuits.evaluation import CircuitTest, check_gap, nodes_of, test_circuit, test_node_circuit
from interp.analyses.circuits.patching import PatchSweep
from interp.analyses.circuits.power import EdgeZero, sweep_write_changes
from interp.analyses.circuits.topn import MIB_FRACTIONS, prune, ranked, top_n
from interp.data import PromptSet
from interp.errors import BadInput, BadType
from interp.paths import Edge, EdgePatch, Node, as_edges, graph, kv_readers, nodes, parse_edge, parse_node, receivers
from interp.progress import Bar
from interp.run import Run, as_run
from interp.sweep import patched_values
from interp.validate import as_real, check_fraction

DiscoveryMethod = Literal["acdc", "eap", "nodes"]
DISCOVERY_METHODS: tuple[str, ...] = get_args(DiscoveryMethod)
# An edge whose removal moves the behaviour by less than 1% of the clean-to-fully-patched gap is below the
# resolution at which faithfulness is reported (two decimals of a fraction of that gap), so ACDC drops it.
ACDC_THRESHOLD = 0.01
# EAP's circuit's minimality resolution (as ACDC's); its edges are chosen by EAP_TARGET, not by a cut on estimates.
EAP_THRESHOLD = 0.01
# EAP keeps the smallest top-n by |estimate| whose exact faithfulness on the proposing prompts reaches this.
EAP_TARGET = 0.9
# Below this Spearman correlation with exact patching (on AGREEMENT_SAMPLE edges), EAP's estimates are unreliable.
EAP_MIN_SPEARMAN = 0.5
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
    selection: Selection | None = field(default=None, repr=False)  # "eap": the top-n candidates and the one kept
    notes: tuple[str, ...] = ()  # what a reader must be told with the circuit (e.g. unreliable estimates)

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
        _check_eap_fields(self)

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
        data["selection"] = None if self.selection is None else self.selection.to_dict()
        data["notes"] = list(self.notes)
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
                       write_change=changes,
                       selection=None if data.get("selection") is None else Selection.from_dict(data["selection"]),
                       notes=data.get("notes") or ())
        except BadInput as error:
            raise type(error)(f"Circuit.from_json: {str(error).removeprefix('Circuit: ')}") from None


def _check_eap_fields(circuit: Circuit) -> None:
    """selection None or a Selection; notes strings (a list of them becomes a tuple)."""
    if circuit.selection is not None and not isinstance(circuit.selection, Selection):
        raise BadInput(f"Circuit: selection is a {type(circuit.selection).__name__}; expected None or a Selection.")
    if isinstance(circuit.notes, str) or not isinstance(circuit.notes, Iterable):
        raise BadInput(f"Circuit: notes={circuit.notes!r}; expected a list of strings.")
    notes = tuple(circuit.notes)
    if not all(isinstance(note, str) for note in notes):
        raise BadInput(f"Circuit: notes={list(notes)!r}; expected strings.")
    object.__setattr__(circuit, "notes", notes)


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


def _receivers_backwards(model: nn.Module) -> list[Node]:
    """Receivers in reverse forward order: the logits, then the last layer's MLP, its key/value heads, its heads, ..."""
    return receivers(model)[::-1]


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
    readers = kv_readers(run.model)
    for receiver in _receivers_backwards(run.model):
        incoming = [e for e in every if e.receiver == receiver]
        outputs = readers.get(receiver, (receiver,))  # a key/value head is read through its query heads
        if receiver.kind != "logits" and not any(e.sender in outputs for e in kept):
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
    return prune(kept, {e for e in kept if power[e.sender].powerless}, readers), scores, gap


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


@dataclass(frozen=True)
class Selection:
    """How "eap" chose its circuit: the candidates tried (top-n by |estimate|, n from MIB's fractions, dangling
    edges pruned), each one's exact faithfulness on the proposing prompts, the one kept, and how well the
    estimates rank edges as exact patching does (`attribution.estimate_agreement`)."""

    target: float  # the faithfulness the kept candidate had to reach
    fractions: tuple[float, ...]  # per candidate tried, smallest first
    n_selected: tuple[int, ...]  # int(fraction x edges)
    n_edges: tuple[int, ...]  # after pruning
    faithfulness: tuple[float, ...]  # exact, on the proposing prompts
    chosen: int  # index of the kept candidate
    reached: bool  # whether it reached the target (False: none did; every edge is kept)
    spearman: float  # estimates vs exact single-edge patches on the sample (NaN: one side constant)
    n_sampled: int  # edges in that sample

    @property
    def fraction(self) -> float:
        return self.fractions[self.chosen]

    def frame(self) -> pd.DataFrame:
        """One row per candidate: fraction, n_selected, n_edges, faithfulness, kept."""
        return pd.DataFrame({"fraction": list(self.fractions), "n_selected": list(self.n_selected),
                             "n_edges": list(self.n_edges), "faithfulness": list(self.faithfulness),
                             "kept": [i == self.chosen for i in range(len(self.fractions))]})

    def to_dict(self) -> dict[str, Any]:
        def number(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {"target": self.target, "fractions": list(self.fractions), "n_selected": list(self.n_selected),
                "n_edges": list(self.n_edges), "faithfulness": [number(f) for f in self.faithfulness],
                "chosen": self.chosen, "reached": self.reached, "spearman": number(self.spearman),
                "n_sampled": self.n_sampled}

    @classmethod
    def from_dict(cls, data: Any) -> "Selection":
        if not isinstance(data, Mapping):
            raise BadInput(f"Circuit: selection={data!r}; expected Selection.to_dict()'s object.")
        def number(x: Any) -> float:
            return float("nan") if x is None else float(x)

        try:
            return cls(float(data["target"]), tuple(float(f) for f in data["fractions"]),
                       tuple(int(n) for n in data["n_selected"]), tuple(int(n) for n in data["n_edges"]),
                       tuple(number(f) for f in data["faithfulness"]), int(data["chosen"]), bool(data["reached"]),
                       number(data["spearman"]), int(data["n_sampled"]))
        except (KeyError, TypeError, ValueError) as error:
            raise BadInput(f"Circuit: selection is not Selection.to_dict()'s object ({error!r}).") from None


def check_target(value: Any, where: str = "discover") -> float:
    """The faithfulness target of "eap": a number in (0, 1]."""
    number = as_real(value, "target", where)
    if not (math.isfinite(number) and 0 < number <= 1):
        raise BadInput(f"{where}: target={value!r}; expected the exact faithfulness the EAP circuit must reach on the "
                       f"proposing prompts, a fraction in (0, 1], e.g. {EAP_TARGET}.")
    return number


def _smallest_faithful(run: Run, scores: dict[str, float], every: list[Edge], gap: float, target: float,
                       source: PromptSet | None) -> tuple[set[Edge], list[tuple[float, int, int, float]], bool]:
    """The smallest top-n by |score| (n from MIB's fractions, dangling edges pruned, as `curve` keeps them) whose
    exact faithfulness 1 - (B(C) - B(clean)) / gap reaches `target`; each candidate one multi-edge patch, tried
    smallest first. The candidates tried, and whether one reached it (if none did, every edge is kept)."""
    selected, sets = top_n(ranked(scores, every, absolute=True), MIB_FRACTIONS, kv_readers(run.model))
    clean = float(run.sweep(source).clean().mean())
    tried: list[tuple[float, int, int, float]] = []
    seen: set[frozenset[Edge]] = set()
    for fraction, n, kept in zip(MIB_FRACTIONS, selected, sets):
        if kept in seen:
            continue
        seen.add(kept)
        patched = float(patched_values(run, [[e for e in every if e not in kept]], source)[0].mean())
        faithfulness = 1.0 - (patched - clean) / gap
        tried.append((fraction, n, len(kept), faithfulness))
        if faithfulness >= target:
            return set(kept), tried, True
    return set(every), tried, False


def eap(run: Run, threshold: float = EAP_THRESHOLD, *, source: PromptSet | None = None, target: float = EAP_TARGET
        ) -> tuple[set[Edge], dict[str, float], float, Selection]:
    """EAP discovery on `run`'s prompts (see the module): the kept edges, every edge's estimate, the gap, and how the
    circuit was chosen. `threshold` is not a cut on the estimates: it is the circuit's minimality resolution."""
    every = graph(run.model)
    gap = _checked_gap(run, every, source)
    result = attribution_patching(run, source=source)
    means = result.edge_values.mean(1)  # (edge,)
    scores = {edge.label: float(score) for edge, score in zip(result.edges, means)}
    kept, tried, reached = _smallest_faithful(run, scores, every, gap, check_target(target, "eap"), source)
    agreement = estimate_agreement(run, result, min(AGREEMENT_SAMPLE, len(every)), source=source)
    fractions, n_selected, n_edges, faithfulness = (tuple(column) for column in zip(*tried))
    selection = Selection(target, fractions, n_selected, n_edges, faithfulness, len(tried) - 1, reached,
                          agreement.spearman, len(agreement.edges))
    return prune(kept, readers=kv_readers(run.model)), scores, gap, selection


def eap_notes(selection: Selection) -> tuple[str, ...]:
    """What a reader of an EAP circuit must be told (each note also a UserWarning when discovered)."""
    notes = []
    rho = selection.spearman
    if not rho >= EAP_MIN_SPEARMAN:
        shown = "undefined (one side constant)" if math.isnan(rho) else f"{rho:.2f}"
        notes.append(f"EAP estimates unreliable here: their Spearman correlation with exact patching on "
                     f"{selection.n_sampled} sampled edges is {shown}, below {EAP_MIN_SPEARMAN}; the edges were kept "
                     "by exact faithfulness, but their order and scores are not the edges' effects (use "
                     "method='acdc' or 'nodes')")
    if selection.reached and selection.fraction == 1.0 and len(selection.fractions) > 1:
        best = max(range(selection.chosen), key=lambda i: selection.faithfulness[i])
        notes.append(f"no top-n smaller than every edge reached faithfulness {selection.target:g} on the proposing "
                     f"prompts (the best: {selection.faithfulness[best]:.3f} with {selection.n_edges[best]} edges): the "
                     "circuit is the whole model")
    if not selection.reached:
        notes.append(f"no top-n circuit reached faithfulness {selection.target} on the proposing prompts (best "
                     f"{max(selection.faithfulness):.3f}): every edge is kept")
    return tuple(notes)


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
    readers = kv_readers(run.model)
    kept_nodes = set(every_node) - set(removed)
    kept_nodes |= {kv for kv, heads in readers.items() if kept_nodes.intersection(heads)}  # read by a kept head
    edges = {e for e in graph(run.model) if e.sender in kept_nodes and e.receiver in kept_nodes}
    scores = {e.label: node_scores.get(e.sender, 0.0) for e in graph(run.model)}
    return prune(edges, {e for e in edges if power[e.sender].powerless}, readers), scores, gap


# "eap" apart: it also says how it chose
_METHODS: dict[str, Callable[..., tuple[set[Edge], dict[str, float], float]]] = {"acdc": acdc, "nodes": nodes_acdc}


def discover(model_or_run: nn.Module | Run, prompts: PromptSet | None = None, *, method: DiscoveryMethod = "acdc",
             threshold: float | None = None, behaviour: Any = None, seed: int = 0, batch_size: int = 16,
             split: bool = True, source: PromptSet | None = None, max_edges: int = ACDC_MAX_EDGES,
             progress: bool = False, target: float | None = None) -> Circuit:
    """A circuit for the behaviour (see the module): proposed on one half of the prompts (`PromptSet.split`,
    seeded) and tested on the other (`.test`), or on all of them with `split=False` (no test). `threshold`:
    a fraction of the clean-vs-patched gap (default: the method's constant). `source`: a corrupted set, row
    for row (default: resampled prompts); with a split, each half reads its own rows of it. `max_edges`:
    ACDC's budget (see the module). `progress`: a bar over the nodes tried (method "nodes"). `target`: the exact
    faithfulness "eap"'s circuit must reach on the proposing half (default `EAP_TARGET`); its choice is
    `.selection`, and `.notes` (each also a UserWarning) say when its estimates disagree with exact patching."""
    if method not in DISCOVERY_METHODS:
        raise BadInput(f"discover: method={method!r}; expected one of {list(DISCOVERY_METHODS)}.")
    if isinstance(model_or_run, Run):
        run = as_run(model_or_run, prompts, where="discover")
    else:
        run = as_run(model_or_run, prompts, where="discover", behaviour=behaviour, seed=seed, batch_size=batch_size)
    default = {"acdc": ACDC_THRESHOLD, "eap": EAP_THRESHOLD, "nodes": NODES_THRESHOLD}[method]
    fraction = check_fraction(default if threshold is None else threshold, "threshold", "discover",
                              what="a fraction of the clean-vs-patched gap", example=ACDC_THRESHOLD)
    goal = _eap_target(method, target)
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
    selection: Selection | None = None
    if method == "eap":
        kept, scores, gap, selection = eap(propose_run, float(fraction), source=propose_source, target=goal)
    else:
        options: dict[str, Any] = {"max_edges": max_edges} if method == "acdc" else {"progress": progress}
        kept, scores, gap = _METHODS[method](propose_run, float(fraction), source=propose_source, **options)
    notes = () if selection is None else eap_notes(selection)
    for note in notes:
        warnings.warn(note, UserWarning, stacklevel=2)
    edges = sorted(kept)
    swept = method in ("acdc", "nodes")  # their sweep holds every sender's clean and corrupted writes: power for free
    circuit = Circuit(tuple(nodes_of(edges)), tuple(e.label for e in edges), scores, method, float(fraction),
                      run.behaviour.describe(propose_run.prompts), run.behaviour.unit, gap, len(propose_run.prompts),
                      str(getattr(getattr(run.model, "cfg", None), "model_name", "") or type(run.model).__name__),
                      untested=untested_edges(propose_run, edges, propose_source) if swept else {},
                      write_change={node.label: change.max for node, change in
                                    sweep_write_changes(propose_run.sweep(propose_source)).items()} if swept else {},
                      selection=selection, notes=notes)
    if test_run is None:
        return circuit
    return dataclasses.replace(circuit, test=(test_node_circuit if method == "nodes" else test_circuit)(
        test_run, circuit, source=test_source))


def _eap_target(method: str, target: Any) -> float:
    """discover's `target`: EAP_TARGET by default for "eap", checked; refused for the other methods."""
    if target is None:
        return EAP_TARGET
    if method != "eap":
        raise BadInput(f"discover: target={target!r} is the faithfulness method='eap' chooses its circuit by; "
                       f"method={method!r} keeps edges by threshold. Leave target out, or pass method='eap'.")
    return check_target(target)


__all__ = ["ACDC_MAX_EDGES", "ACDC_THRESHOLD", "Circuit", "DISCOVERY_METHODS", "DiscoveryMethod", "EAP_MIN_SPEARMAN",
           "EAP_TARGET", "EAP_THRESHOLD", "NODES_THRESHOLD", "Selection", "acdc", "discover", "eap", "eap_notes",
           "nodes_acdc", "prune", "untested_edges"]
