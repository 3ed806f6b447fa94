"""Circuit discovery: which edges a behaviour needs, proposed on one half of the prompts and tested on the other.

    circuit = discover(model, prompts, method="acdc")    # or "eap"; a Run works too
    circuit.frame()       # every edge scored: sender, receiver, via, score, in_circuit
    circuit.test.frame()  # faithfulness, completeness, minimality on the held-out half
    Circuit.from_json(circuit.to_json())

Methods (both patch from the corrupted run, `interp.paths.EdgePatch`'s resampled prompts or a given set):

- "acdc" (Conmy et al. 2023): receivers from the logits backwards (reverse forward order); for each
  incoming edge, patch it on top of the edges removed so far; if the behaviour (mean over prompts) moves by
  less than the threshold it stays removed. Exact patched runs (`PatchSweep`: resumed from the receiver's
  layer). A receiver none of whose outgoing edges is kept cannot be seen through any edge, so its incoming
  edges are removed without a run (score 0: patching them changes nothing, exactly).
- "eap": attribution patching (`interp.analyses.circuits.attribution`): keep the edges whose estimated
  effect is at least the threshold. One corrupted forward and one forward and backward per batch.

Both then drop edges that cannot carry anything: from a sender none of whose inputs is kept (it computes its
corrupted output, so patching its edges is a no-op) and into a receiver none of whose outputs is kept.

Thresholds are fixed fractions of the gap |B(all patched) - B(clean)| on the proposing prompts, the same on
every model and not tuned per model (module constants below).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import pandas as pd
from torch import nn

from interp.data import PromptSet
from interp.errors import BadInput
from interp.paths import Edge, Node, graph, nodes, parse_edge
from interp.run import Run, as_run

from interp.analyses.circuits.attribution import attribution_patching
from interp.analyses.circuits.evaluation import CircuitTest, nodes_of, test_circuit
from interp.analyses.circuits.patching import PatchSweep

DiscoveryMethod = Literal["acdc", "eap"]
DISCOVERY_METHODS: tuple[str, ...] = get_args(DiscoveryMethod)
# An edge whose removal moves the behaviour by less than 1% of the clean-to-fully-patched gap is below the
# resolution at which faithfulness is reported (two decimals of a fraction of that gap), so ACDC drops it.
ACDC_THRESHOLD = 0.01
# The same resolution for EAP's estimate of one edge's effect (its estimate is in the behaviour's unit too).
EAP_THRESHOLD = 0.01
SCHEMA = "interp.circuit/1"


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "edges", tuple(parse_edge(e).label for e in self.edges))
        object.__setattr__(self, "nodes", tuple(self.nodes))

    @property
    def tau(self) -> float:
        """The threshold in the behaviour's unit on the proposing prompts."""
        return self.threshold * abs(self.gap)

    def frame(self) -> pd.DataFrame:
        """One row per scored edge: sender, receiver, via, score, in_circuit, method, threshold (unit), unit."""
        kept = set(self.edges)
        rows = []
        for label, score in self.scores.items():
            edge = parse_edge(label)
            rows.append({"sender": edge.sender.label, "receiver": edge.receiver.label, "via": edge.via, "score": score,
                         "in_circuit": label in kept, "method": self.method, "threshold": self.tau, "unit": self.unit})
        columns = ["sender", "receiver", "via", "score", "in_circuit", "method", "threshold", "unit"]
        return pd.DataFrame(rows, columns=columns)

    def to_json(self) -> str:
        """Plain JSON: edges, nodes, scores, method, threshold and what they were measured on (not the test)."""
        data = {"schema": SCHEMA, "nodes": list(self.nodes), "edges": list(self.edges), "scores": self.scores,
                "method": self.method, "threshold": self.threshold, "behaviour": self.behaviour, "unit": self.unit,
                "gap": None if math.isnan(self.gap) else self.gap, "n_prompts": self.n_prompts, "model": self.model}
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | dict[str, Any]) -> "Circuit":
        """A Circuit from `to_json`'s text (or its parsed dict)."""
        try:
            data = json.loads(text) if isinstance(text, str) else dict(text)
        except json.JSONDecodeError as error:
            raise BadInput(f"Circuit.from_json: not JSON ({error}); expected Circuit.to_json()'s text.") from None
        missing = [k for k in ("edges", "method", "threshold") if k not in data]
        if missing:
            raise BadInput(f"Circuit.from_json: {missing} missing; expected Circuit.to_json()'s fields "
                           "(edges, nodes, scores, method, threshold, ...).")
        edges = [parse_edge(e).label for e in data["edges"]]
        gap = data.get("gap")
        return cls(tuple(data.get("nodes") or nodes_of(edges)), tuple(edges),
                   {str(k): float(v) for k, v in (data.get("scores") or {}).items()}, str(data["method"]),
                   float(data["threshold"]), str(data.get("behaviour", "")), str(data.get("unit", "")),
                   float("nan") if gap is None else float(gap), int(data.get("n_prompts", 0)), str(data.get("model", "")))


def prune(edges: set[Edge]) -> set[Edge]:
    """Drop edges from senders with no kept input (but the embeddings) and into receivers with no kept output
    (but the logits), until none is left to drop: patching those changes nothing."""
    kept = set(edges)
    while True:
        has_input = {e.receiver for e in kept}
        has_output = {e.sender for e in kept}
        drop = {e for e in kept if (e.sender.kind != "embed" and e.sender not in has_input)
                or (e.receiver.kind != "logits" and e.receiver not in has_output)}
        if not drop:
            return kept
        kept -= drop


def _receivers_backwards(model: nn.Module) -> list[Node]:
    """Receivers in reverse forward order: the logits, then the last layer's MLP, its heads, ..."""
    order = [node for node in nodes(model) if node.kind != "embed"]
    return order[::-1]


def acdc(run: Run, threshold: float = ACDC_THRESHOLD, *, source: PromptSet | None = None
         ) -> tuple[set[Edge], dict[str, float], float]:
    """ACDC on `run`'s prompts (see the module): the kept edges, every edge's score, and the gap."""
    sweep = PatchSweep(run, source)
    every = graph(run.model)
    clean = float(sweep.clean().mean())
    gap = float(sweep.values([every])[0].mean()) - clean
    tau = threshold * abs(gap)
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
            trial = float(sweep.values([removed + [edge]])[0].mean())
            scores[edge.label] = trial - current
            if abs(trial - current) < tau:
                removed.append(edge)
                kept.discard(edge)
                current = trial
    return prune(kept), scores, gap


def eap(run: Run, threshold: float = EAP_THRESHOLD, *, source: PromptSet | None = None
        ) -> tuple[set[Edge], dict[str, float], float]:
    """EAP discovery on `run`'s prompts (see the module): the kept edges, every edge's estimate, and the gap."""
    sweep = PatchSweep(run, source)
    every = graph(run.model)
    gap = float((sweep.values([every])[0] - sweep.clean()).mean())
    result = attribution_patching(run, source=source)
    means = result.edge_values.mean(1)  # (edge,)
    scores = {edge.label: float(score) for edge, score in zip(result.edges, means)}
    kept = {edge for edge, score in zip(result.edges, means) if abs(float(score)) >= threshold * abs(gap)}
    return prune(kept), scores, gap


_METHODS = {"acdc": acdc, "eap": eap}


def discover(model_or_run: nn.Module | Run, prompts: PromptSet | None = None, *, method: DiscoveryMethod = "acdc",
             threshold: float | None = None, behaviour: Any = None, seed: int = 0, batch_size: int = 16,
             split: bool = True, source: PromptSet | None = None) -> Circuit:
    """A circuit for the behaviour (see the module): proposed on one half of the prompts (`PromptSet.split`,
    seeded) and tested on the other (`.test`), or on all of them with `split=False` (no test). `threshold`:
    a fraction of the clean-vs-patched gap (default: the method's constant). `source`: a corrupted set, row
    for row (default: resampled prompts)."""
    if method not in _METHODS:
        raise BadInput(f"discover: method={method!r}; expected one of {list(DISCOVERY_METHODS)}.")
    if isinstance(model_or_run, Run):
        run = as_run(model_or_run, prompts, where="discover")
    else:
        run = as_run(model_or_run, prompts, where="discover", behaviour=behaviour, seed=seed, batch_size=batch_size)
    fraction = (ACDC_THRESHOLD if method == "acdc" else EAP_THRESHOLD) if threshold is None else threshold
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise BadInput(f"discover: threshold={threshold!r}; expected a fraction of the clean-vs-patched gap in [0, 1), "
                       f"e.g. {ACDC_THRESHOLD}.")
    if split:
        if source is not None:
            raise BadInput("discover: a corrupted source is given row for row, so it cannot follow a split; pass "
                           "split=False (and test the circuit with test_circuit on other prompts and their source).")
        propose_half, test_half = run.prompts.split(0.5, seed=run.seed)
        propose_run, test_run = run.on(propose_half), run.on(test_half)
    else:
        propose_run, test_run = run, None
    kept, scores, gap = _METHODS[method](propose_run, float(fraction), source=source)
    edges = sorted(kept)
    circuit = Circuit(tuple(nodes_of(edges)), tuple(e.label for e in edges), scores, method, float(fraction),
                      run.behaviour.describe(propose_run.prompts), run.behaviour.unit, gap, len(propose_run.prompts),
                      str(getattr(getattr(run.model, "cfg", None), "model_name", "") or type(run.model).__name__))
    if test_run is None:
        return circuit
    return Circuit(circuit.nodes, circuit.edges, circuit.scores, circuit.method, circuit.threshold, circuit.behaviour,
                   circuit.unit, circuit.gap, circuit.n_prompts, circuit.model, test_circuit(test_run, circuit))


__all__ = ["ACDC_THRESHOLD", "Circuit", "DISCOVERY_METHODS", "DiscoveryMethod", "EAP_THRESHOLD", "acdc", "discover",
           "eap", "prune"]
