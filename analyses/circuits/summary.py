"""A discovered circuit with what a reader needs beside it: each kept edge's own effect with a CI, and the tests.

    found = circuit_summary(model, prompts)          # discover (ACDC by default) + edge effects + tests
    found.edges                                      # one row per kept edge: sender, receiver, via, score, effect, CI
    found.to_json()                                  # plain data: the circuit, its edges, its tests
    circuit_summary(model, prompts, curve=True).curve  # and MIB's faithfulness curve of discovery's scores
    draw_circuit(found.edges)                        # interp.analyses.circuits.drawing

`discover` proposes the circuit on one half of the prompts and tests it on the other (faithfulness,
completeness, minimality: `CircuitTest`). Each kept edge's effect is its own path patch
(`path_patches`: the receiver reads the sender's write from a resampled prompt, nothing else changes) on
the held-out half, the prompts the test uses, so no number shown was measured on the prompts that chose
the edges. `score` is discovery's own number for the edge (ACDC: the behaviour's change when it was
removed on top of the edges removed before it, on the proposing half).

A head-level circuit (`method="nodes"`) is read by its nodes: `found.nodes` has each kept head's or MLP's
removal cost from the circuit on the held-out half (its write patched for every reader on top of every node
outside the circuit: the test's minimality rows, so no forward is added), and its edges (every edge between
kept nodes, thousands on a large model) are listed without an effect of their own.

With `curve=True` discovery's scores of every edge are also ranked into MIB's faithfulness curve
(`interp.analyses.circuits.curve.faithfulness_curve`: the curve, CPR and CMD with CIs and the random baseline),
measured on the same held-out half: the scores come from the proposing half, so the ranking is fixed before any
point of the curve is measured.

The face `interp circuit SPEC` prints and writes this; `interp report` draws it in its circuit section.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
from torch import nn

from interp.analyses.circuits.curve import FaithfulnessCurve, faithfulness_curve
from interp.analyses.circuits.discovery import Circuit, discover
from interp.analyses.circuits.evaluation import TEST_COLUMNS, CircuitTest
from interp.analyses.circuits.patching import path_patches
from interp.data import PromptSet
from interp.paths import parse_edge
from interp.run import Run, as_run

EDGE_COLUMNS = ["edge", "sender", "receiver", "via", "score", "effect", "ci_low", "ci_high", "unit", "n_prompts"]
NODE_COLUMNS = ["node", "score", "effect", "ci_low", "ci_high", "unit", "n_prompts"]
# each kept edge's own path patch is one patched forward per batch of the held-out half: beyond this many kept
# edges (a head-level circuit of a large model keeps thousands), those of largest |score| are measured, the rest
# are listed with no effect (NaN)
MAX_EDGE_EFFECTS = 150


@dataclass(frozen=True)
class CircuitSummary:
    """A circuit, its kept edges' own effects on the held-out prompts, and its tests there."""

    circuit: Circuit
    edges: pd.DataFrame  # EDGE_COLUMNS, one row per kept edge, in the circuit's order
    test: CircuitTest | None  # on the held-out half; None when discovery used every prompt
    behaviour: str  # what the effects measure, in words
    unit: str
    curve: FaithfulnessCurve | None = None  # MIB's curve of discovery's scores (`curve=True`), on the held-out half
    # method "nodes": NODE_COLUMNS, each kept head's or MLP's removal cost from the circuit (held-out half); else None
    nodes: pd.DataFrame | None = None

    def tests_frame(self) -> pd.DataFrame:
        """The tests as rows (`CircuitTest.frame`); empty when none ran."""
        if self.test is None:
            return pd.DataFrame(columns=TEST_COLUMNS)
        return self.test.frame()

    def edges_to_draw(self) -> pd.DataFrame:
        """The edges a drawing shows (`draw_circuit`): those with a measured effect; for a head-level circuit every
        edge, its width its sender's removal cost (`nodes`: a node's number, so the drawing labels no edge)."""
        if self.nodes is None:
            return self.edges.dropna(subset=["effect"])
        cost = dict(zip(self.nodes["node"], self.nodes["effect"]))
        return self.edges.assign(effect=[cost.get(s, 0.0) for s in self.edges["sender"]],
                                 ci_low=math.nan, ci_high=math.nan)

    def to_json(self) -> dict[str, Any]:
        """Plain data: the circuit (`Circuit.to_json`), its edges' effects, its tests (NaN as None), the tests'
        per-prompt behaviour (`values`: `CircuitTest.values` as lists; None without a test) and the curve
        (`FaithfulnessCurve.to_json`; None unless asked for)."""
        values = None if self.test is None else {name: v.tolist() for name, v in self.test.values.items()}
        return {"circuit": json.loads(self.circuit.to_json()), "behaviour": self.behaviour, "unit": self.unit,
                "edges": _records(self.edges), "nodes": None if self.nodes is None else _records(self.nodes),
                "tests": _records(self.tests_frame()), "values": values,
                "curve": None if self.curve is None else json.loads(self.curve.to_json())}


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A frame's rows as dicts, NaN written as None (JSON has no NaN)."""
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
            for row in json.loads(frame.to_json(orient="records"))]


def circuit_summary(model_or_run: nn.Module | Run, prompts: PromptSet | None = None, *, method: str = "acdc",
                    threshold: float | None = None, behaviour: Any = None, seed: int = 0,
                    batch_size: int = 16, max_edges: int | None = None, curve: bool = False,
                    progress: bool = False) -> CircuitSummary:
    """Discover a circuit (`discover`: proposed on one half of the prompts, tested on the other) and measure each
    kept edge's own path-patching effect on the held-out half (see the module; at most `MAX_EDGE_EFFECTS` of them,
    those of largest |score|; a head-level circuit gets its nodes' removal costs instead). `max_edges`: ACDC's budget (`discover`). `curve`: also MIB's faithfulness curve of
    discovery's scores on the held-out half (`faithfulness_curve`). `progress`: discovery's bar (`discover`)."""
    if isinstance(model_or_run, Run):
        run = as_run(model_or_run, prompts, where="circuit_summary")
    else:
        run = as_run(model_or_run, prompts, where="circuit_summary", behaviour=behaviour, seed=seed,
                     batch_size=batch_size)
    budget = {} if max_edges is None else {"max_edges": max_edges}
    circuit = discover(run, method=method, threshold=threshold, progress=progress, **budget)  # type: ignore[arg-type]  # discover checks the name
    _, held_out = run.prompts.split(0.5, seed=run.seed)  # the half discover tests on (its split, same seed)
    test_run = run.on(held_out)
    node_level = circuit.method == "nodes" and circuit.test is not None
    edges = _edge_effects(test_run, circuit, measure=0 if node_level else MAX_EDGE_EFFECTS)
    return CircuitSummary(circuit, edges, circuit.test, test_run.behaviour.describe(held_out), test_run.behaviour.unit,
                          _curve(run, circuit) if curve else None, _node_costs(circuit) if node_level else None)


def _edge_effects(test_run: Run, circuit: Circuit, measure: int) -> pd.DataFrame:
    """EDGE_COLUMNS, one row per kept edge: the own path patch on the held-out half of the `measure` edges of largest
    |score|, NaN for the rest."""
    by_score = sorted(circuit.edges, key=lambda e: -abs(float(circuit.scores.get(e, 0.0))))
    measured = set(by_score[:measure])
    unmeasured = [parse_edge(e) for e in circuit.edges if e not in measured]
    rest = pd.DataFrame({"edge": [e.label for e in unmeasured], "sender": [e.sender.label for e in unmeasured],
                         "receiver": [e.receiver.label for e in unmeasured], "via": [e.via for e in unmeasured],
                         "effect": math.nan, "ci_low": math.nan, "ci_high": math.nan, "unit": test_run.behaviour.unit,
                         "n_prompts": len(test_run.prompts)})
    if measured:
        effects = path_patches(test_run, edges=[e for e in circuit.edges if e in measured])
        effects = pd.concat([effects, rest], ignore_index=True) if len(rest) else effects
    else:
        effects = rest
    order = {label: i for i, label in enumerate(circuit.edges)}
    effects = effects.sort_values("edge", key=lambda column: column.map(order), kind="stable")
    edges = effects.assign(score=[float(circuit.scores.get(label, math.nan)) for label in effects.edge])
    return edges[EDGE_COLUMNS].reset_index(drop=True)


def _node_costs(circuit: Circuit) -> pd.DataFrame:
    """NODE_COLUMNS: each kept head's or MLP's removal cost from the circuit on the held-out half (the node test's
    minimality rows) beside its discovery score (the behaviour's change when it was removed on the proposing half)."""
    assert circuit.test is not None
    node_score = {parse_edge(label).sender.label: float(score) for label, score in circuit.scores.items()}
    rows = circuit.test.minimality_frame
    return pd.DataFrame({"node": rows["sender"], "score": [node_score.get(n, math.nan) for n in rows["sender"]],
                         "effect": rows["cost"], "ci_low": rows["ci_low"], "ci_high": rows["ci_high"],
                         "unit": rows["unit"], "n_prompts": circuit.test.n_prompts}, columns=NODE_COLUMNS)


def _curve(run: Run, circuit: Circuit) -> FaithfulnessCurve:
    """MIB's curve of the circuit's scores (every edge of the model), measured on the half discover tested on."""
    measured = faithfulness_curve(run, circuit)  # given scores: the same seeded split, the held-out half measured
    return replace(measured, score_name=circuit.method, n_proposing=circuit.n_prompts)


__all__ = ["CircuitSummary", "EDGE_COLUMNS", "NODE_COLUMNS", "circuit_summary"]
