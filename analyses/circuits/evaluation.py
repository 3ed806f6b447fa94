"""Circuit tests: is a proposed circuit (a set of edges) faithful, complete and minimal?

    result = test_circuit(model, circuit, prompts)      # or a Run; circuit: a Circuit or edge labels
    result.faithfulness.mean, result.faithfulness.ci_low, result.faithfulness.ci_high
    result.frame()                                     # one row per test

Causal-scrubbing style: what the hypothesis says does not matter, every edge outside the circuit, is
patched from a corrupted run (resampled prompts, `interp.paths.EdgePatch`'s default source), never zeroed.
With B the behaviour (mean over prompts), "all patched" every edge of the model patched:

- faithfulness  F(C) = (B(C) - B(all patched)) / (B(clean) - B(all patched)): the share of the clean
  behaviour the circuit alone keeps (1: all of it; 0: no more than the fully corrupted model);
- completeness  for every single node of the circuit and `n_subsets` random subsets K of its nodes,
  |F(C \\ K) - F(M \\ K)|, M the whole model and "\\ K" every edge touching K patched: a complete circuit
  loses to a knockout what the model loses. Reported per K and as the maximum over K (with its CI);
- minimality    each kept edge's removal from the circuit, |B(C \\ {e}) - B(C)|, against the threshold the
  circuit was found with (a fraction of this prompt set's |B(all patched) - B(clean)|): every kept edge
  should cost at least that.

An empty circuit has no node to knock out and no edge to remove: its completeness and minimality are NaN, not
tested, and `notes` says why (its faithfulness, F of the fully patched model, is measured). A prompt set on
which the clean-vs-patched gap is within its own noise (its 95% bootstrap CI over prompts holds 0: patching
every edge does not change the behaviour) is refused by discovery (`check_gap`: its threshold is a fraction of
that gap); `test_circuit` measures a given circuit there but says in `notes` that its fractions are noise.

`CircuitTest.values` keeps the behaviour per prompt (clean, every edge patched, every edge outside the circuit
patched), float64, so a reader can recompute faithfulness or look at single prompts. Every number is a mean over
prompts with a bootstrap CI over prompts (ratios: resampling prompts' numerator
and denominator together, `interp.stats.ratio_bootstrap`). The patched runs are computed by
`interp.analyses.circuits.patching.PatchSweep` (the clean run cached per batch, each set resumed from its
earliest receiver's layer).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import pandas as pd
import torch
from torch import nn

from interp.data import PromptSet
from interp.errors import BadInput
from interp.paths import Edge, Node, as_edges, check_edges, graph, nodes, parse_edge, parse_node
from interp.run import Run, as_run
from interp.stats import bootstrap, ratio_bootstrap
from interp.sweep import PatchSweep, patched_values
from interp.validate import check_fraction

N_SUBSETS = 10  # random node subsets K for completeness, besides every single node


@dataclass(frozen=True)
class Interval:
    """A mean over prompts and its 95% bootstrap CI."""

    mean: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class CircuitTest:
    """Faithfulness, completeness and minimality of one circuit on one prompt set (see the module)."""

    faithfulness: Interval  # F(C), a fraction
    completeness: Interval  # max over K of |F(C \ K) - F(M \ K)|, a fraction
    minimality: Interval  # the smallest |B(C \ {e}) - B(C)| over kept edges, in the behaviour's unit
    completeness_frame: pd.DataFrame  # one row per K
    minimality_frame: pd.DataFrame  # one row per kept edge
    threshold: float  # the minimality threshold in the behaviour's unit (fraction x |gap| on these prompts)
    clean: float  # B(clean)
    all_patched: float  # B(all patched)
    circuit_only: float  # B(C)
    n_edges: int
    n_prompts: int
    behaviour: str
    unit: str
    notes: tuple[str, ...] = ()  # what was not tested and why (an empty circuit's completeness and minimality)
    # per prompt, float64 (prompt,): "clean", "all_patched", "circuit_only", the behaviour B every number above is
    # computed from (faithfulness is the ratio of the means of circuit_only - all_patched and clean - all_patched)
    values: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def _kept_item(self) -> str:
        """What minimality removes one at a time: an edge, or a head or MLP (a node test's rows read every receiver)."""
        node_level = len(self.minimality_frame) and (self.minimality_frame["receiver"] == "*").all()
        return "node" if node_level else "edge"

    @property
    def minimal(self) -> bool:
        """Whether every kept edge's removal costs at least the threshold (on the mean); False for an empty circuit,
        which has no edge to be minimal with."""
        return bool(self.minimality_frame["minimal"].all()) if len(self.minimality_frame) else False

    def frame(self) -> pd.DataFrame:
        """One row per test: test, value, ci_low, ci_high, unit, threshold, n_edges, n_prompts, behaviour, note
        (why a test was not run: its value is then NaN)."""
        untested = EMPTY_NOTE if self.n_edges == 0 else ""
        noisy = next((note for note in self.notes if "within its noise" in note), "")
        rows = [("faithfulness", self.faithfulness, "fraction of the clean-vs-patched gap", float("nan"), noisy),
                ("completeness", self.completeness, "fraction of the clean-vs-patched gap (max over K)", float("nan"),
                 untested or noisy),
                ("minimality", self.minimality, f"{self.unit} (smallest kept {self._kept_item}'s removal cost)", self.threshold,
                 untested)]
        return pd.DataFrame([{"test": name, "value": iv.mean, "ci_low": iv.ci_low, "ci_high": iv.ci_high, "unit": unit,
                              "threshold": threshold, "n_edges": self.n_edges, "n_prompts": self.n_prompts,
                              "behaviour": self.behaviour, "note": note} for name, iv, unit, threshold, note in rows],
                            columns=TEST_COLUMNS)


TEST_COLUMNS = ["test", "value", "ci_low", "ci_high", "unit", "threshold", "n_edges", "n_prompts", "behaviour", "note"]
EMPTY_NOTE = "not tested: the circuit is empty (no node to knock out, no edge to remove)"
NOT_TESTED = float("nan")


def _per_prompt(clean: torch.Tensor, all_patched: torch.Tensor, circuit_only: torch.Tensor) -> dict[str, torch.Tensor]:
    """`CircuitTest.values`: the behaviour per prompt, float64 copies detached from any graph."""
    return {name: value.detach().to("cpu", torch.float64).clone() for name, value in
            (("clean", clean), ("all_patched", all_patched), ("circuit_only", circuit_only))}


def _interval(values: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> Interval:
    mean, low, high = (float(v) for v in values)
    return Interval(mean, low, high)


def _abs_interval(iv: Interval) -> Interval:
    """|x| of an interval: its CI is [0, max] where it straddles 0."""
    low, high = sorted((abs(iv.ci_low), abs(iv.ci_high)))
    return Interval(abs(iv.mean), 0.0 if iv.ci_low <= 0 <= iv.ci_high else low, high)


def circuit_edges(model: nn.Module, circuit: Any) -> tuple[list[Edge], float | None]:
    """The circuit's edges (checked against the model; one label is a circuit of one edge) and its threshold
    (None when a bare edge list is given)."""
    labels = getattr(circuit, "edges", circuit)
    if not isinstance(labels, (str, Edge, Iterable)) or isinstance(labels, (bytes, dict)):
        raise BadInput(f"test_circuit: circuit must be a Circuit or a list of edge labels ('L0H0 -> L1H0 via k', ...); "
                       f"got {type(circuit).__name__}.")
    edges = sorted(as_edges(labels, "test_circuit"))
    check_edges(model, edges)
    threshold = getattr(circuit, "threshold", None)
    return edges, None if threshold is None else float(threshold)


class NoBehaviour(BadInput):
    """The prompts show no behaviour for a circuit to explain: the clean-vs-patched gap is within its noise."""


def gap_noise(gap: torch.Tensor, unit: str, seed: int) -> str | None:
    """A sentence when the clean-vs-patched gap (prompt,) is within its own noise, else None. Noise is measured on
    the prompts themselves: the gap's 95% bootstrap CI over prompts holds 0, so patching every edge does not
    measurably change the behaviour (every fraction of that gap would be noise)."""
    mean, low, high = (float(v) for v in bootstrap(gap.double(), seed=seed, label="clean-vs-patched gap"))
    if not low <= 0 <= high:
        return None
    suffix = f" {unit}" if unit else ""
    return (f"the clean-vs-patched gap is {mean:+.4g}{suffix} (95% CI [{low:+.4g}, {high:+.4g}] over {len(gap)} prompts), "
            "within its noise: patching every edge does not change the behaviour")


def check_gap(gap: torch.Tensor, where: str, unit: str, seed: int) -> None:
    """`NoBehaviour` (a BadInput) naming the gap when it is within its noise (`gap_noise`): there is nothing for a
    circuit to explain."""
    noise = gap_noise(gap, unit, seed)
    if noise is not None:
        raise NoBehaviour(f"{where}: {noise}, so there is nothing for a circuit to explain. Use prompts on which the model "
                       "shows the behaviour (e.g. repeated tokens for induction), a corrupted source that removes it, or "
                       "more prompts.")


def _subsets(circuit_nodes: list[Node], n_subsets: int, seed: int) -> list[tuple[Node, ...]]:
    """Every single node, then `n_subsets` random non-empty subsets (each node in with probability 1/2), seeded."""
    out: list[tuple[Node, ...]] = [(node,) for node in circuit_nodes]
    if len(circuit_nodes) < 2:
        return out
    generator = torch.Generator().manual_seed(seed)
    seen = set(out)
    for _ in range(n_subsets * 10):
        if len(out) >= len(circuit_nodes) + n_subsets:
            break
        pick = torch.rand(len(circuit_nodes), generator=generator) < 0.5
        subset = tuple(node for node, keep in zip(circuit_nodes, pick.tolist()) if keep)
        if subset and subset not in seen:
            seen.add(subset)
            out.append(subset)
    return out


def _touching(edges: Iterable[Edge], nodes_: Sequence[Node]) -> list[Edge]:
    wanted = set(nodes_)
    return [e for e in edges if e.sender in wanted or e.receiver in wanted]


def _completeness(sweep: PatchSweep, every: list[Edge], kept: list[Edge], outside: list[Edge], clean: torch.Tensor,
                  all_patched: torch.Tensor, n_subsets: int, seed: int) -> tuple[Interval, pd.DataFrame]:
    circuit_nodes = sorted({n for e in kept for n in (e.sender, e.receiver) if n.kind != "logits"})
    columns = ["removed", "n_removed", "faithfulness_circuit", "faithfulness_model", "difference", "ci_low", "ci_high"]
    if not circuit_nodes:  # no node to knock out: not tested, never "complete"
        return Interval(NOT_TESTED, NOT_TESTED, NOT_TESTED), pd.DataFrame(columns=columns)
    subsets = _subsets(circuit_nodes, n_subsets, seed)
    sets = []
    for subset in subsets:
        sets += [outside + _touching(kept, subset), _touching(every, subset)]
    values = patched_values(sweep.run, sets, sweep.source)  # (2 * subset, prompt): C \ K, M \ K
    gap = clean - all_patched  # (prompt,)
    rows, best = [], Interval(0.0, 0.0, 0.0)
    for i, subset in enumerate(subsets):
        in_circuit, in_model = values[2 * i], values[2 * i + 1]
        f_c = ratio_bootstrap(in_circuit - all_patched, gap, seed=seed, label=f"completeness-c-{i}")
        f_m = ratio_bootstrap(in_model - all_patched, gap, seed=seed, label=f"completeness-m-{i}")
        diff = _abs_interval(_interval(ratio_bootstrap(in_circuit - in_model, gap, seed=seed, label=f"completeness-{i}")))
        rows.append({"removed": ", ".join(n.label for n in subset), "n_removed": len(subset),
                     "faithfulness_circuit": float(f_c[0]), "faithfulness_model": float(f_m[0]),
                     "difference": diff.mean, "ci_low": diff.ci_low, "ci_high": diff.ci_high})
        if diff.mean >= best.mean:
            best = diff
    return best, pd.DataFrame(rows, columns=columns)


def _minimality(sweep: PatchSweep, kept: list[Edge], outside: list[Edge], circuit_only: torch.Tensor, tau: float,
                seed: int, unit: str) -> tuple[Interval, pd.DataFrame]:
    values = patched_values(sweep.run, [outside + [edge] for edge in kept], sweep.source)  # (edge, prompt)
    rows, smallest = [], Interval(float("inf"), float("inf"), float("inf"))
    for edge, row in zip(kept, values):
        cost = _abs_interval(_interval(bootstrap(row - circuit_only, seed=seed, label=f"minimality-{edge.label}")))
        rows.append({"sender": edge.sender.label, "receiver": edge.receiver.label, "via": edge.via,
                     "cost": cost.mean, "ci_low": cost.ci_low, "ci_high": cost.ci_high, "threshold": tau,
                     "minimal": cost.mean >= tau, "unit": unit})
        if cost.mean < smallest.mean:
            smallest = cost
    if not kept:
        smallest = Interval(NOT_TESTED, NOT_TESTED, NOT_TESTED)
    columns = ["sender", "receiver", "via", "cost", "ci_low", "ci_high", "threshold", "minimal", "unit"]
    return smallest, pd.DataFrame(rows, columns=columns)


def _test_settings(threshold: Any, own: float | None, n_subsets: Any, where: str) -> float:
    """The minimality threshold (given, else the circuit's own) as a fraction in [0, 1), `n_subsets` checked."""
    if threshold is None and own is None:
        raise BadInput(f"{where}: threshold=None; give the minimality threshold as a fraction in [0, 1) of the "
                       "clean-vs-patched gap (a Circuit carries its own).")
    fraction = check_fraction(own if threshold is None else threshold, "threshold", where,
                              what="the minimality threshold as a fraction of the clean-vs-patched gap")
    if isinstance(n_subsets, bool) or not isinstance(n_subsets, int) or n_subsets < 0:
        raise BadInput(f"{where}: n_subsets={n_subsets!r} must be a whole number >= 0.")
    return fraction


def test_circuit(model_or_run: nn.Module | Run, circuit: Any, prompts: PromptSet | None = None, *,
                 source: PromptSet | None = None, threshold: float | None = None, n_subsets: int = N_SUBSETS,
                 behaviour: Any = None, batch_size: int | None = None, seed: int | None = None) -> CircuitTest:
    """Faithfulness, completeness and minimality of `circuit` (a `Circuit` or edge labels) on `prompts`, every
    edge outside it patched from the corrupted run (see the module). `threshold`: minimality's, as a fraction of
    |B(all patched) - B(clean)| (default: the circuit's own; a bare edge list needs one)."""
    run = as_run(model_or_run, prompts, where="test_circuit", behaviour=behaviour, batch_size=batch_size, seed=seed)
    kept, own = circuit_edges(run.model, circuit)
    fraction = _test_settings(threshold, own, n_subsets, "test_circuit")
    sweep = run.sweep(source)
    every = graph(run.model)
    kept_set = set(kept)
    outside = [e for e in every if e not in kept_set]
    clean = sweep.clean()
    all_patched, circuit_only = patched_values(run, [every, outside], source)
    gap = clean - all_patched
    noise = gap_noise(gap, run.behaviour.unit, run.seed)
    tau = fraction * abs(float(gap.mean()))
    faithfulness = _interval(ratio_bootstrap(circuit_only - all_patched, gap, seed=run.seed, label="faithfulness"))
    completeness, completeness_frame = _completeness(sweep, every, kept, outside, clean, all_patched, n_subsets, run.seed)
    minimality, minimality_frame = _minimality(sweep, kept, outside, circuit_only, tau, run.seed, run.behaviour.unit)
    notes = ((f"completeness and minimality {EMPTY_NOTE}",) if not kept else ()) + (
        (f"{noise}: faithfulness and completeness, fractions of that gap, are noise",) if noise else ())
    return CircuitTest(faithfulness, completeness, minimality, completeness_frame, minimality_frame, tau,
                       float(clean.mean()), float(all_patched.mean()), float(circuit_only.mean()), len(kept),
                       len(clean), run.behaviour.describe(run.prompts), run.behaviour.unit, notes,
                       _per_prompt(clean, all_patched, circuit_only))


test_circuit.__test__ = False  # type: ignore[attr-defined]  # a test of a circuit, not a pytest test


def test_node_circuit(model_or_run: nn.Module | Run, circuit: Any, prompts: PromptSet | None = None, *,
                      source: PromptSet | None = None, threshold: float | None = None, n_subsets: int = N_SUBSETS,
                      behaviour: Any = None, batch_size: int | None = None, seed: int | None = None) -> CircuitTest:
    """`test_circuit` of a head-level circuit (`discover(method="nodes")`: every edge between its nodes), done with
    nodes: every head and MLP outside it has its write patched for every reader (`PatchSweep.node_values`), which
    patches exactly the edges outside the circuit that can change anything (an edge into a patched node changes
    only that node's own write, which no reader then sees). Completeness removes circuit nodes K the same way;
    minimality removes each kept head or MLP (its rows' `sender`; `receiver` "*": every reader). One patched forward
    per set instead of tens of thousands of edge patches on a large model."""
    run = as_run(model_or_run, prompts, where="test_node_circuit", behaviour=behaviour, batch_size=batch_size, seed=seed)
    kept_edges, own = circuit_edges(run.model, circuit)
    fraction = _test_settings(threshold, own, n_subsets, "test_node_circuit")
    sweep = run.sweep(source)
    writers = [n for n in nodes(run.model) if n.kind != "logits"]
    kept = {n for e in kept_edges for n in (e.sender, e.receiver)} | {parse_node("embed")}
    inside = [n for n in writers if n in kept and n.kind != "embed"]
    outside = [n for n in writers if n not in kept]
    clean = sweep.clean()
    subsets = _subsets(inside, n_subsets, run.seed)
    all_patched = sweep.node_values([writers])[0]
    # every set on top of the nodes outside the circuit: their run once, each set resumed at its own first node
    on_circuit = sweep.node_values([[], *(list(s) for s in subsets), *([node] for node in inside)], base=outside)
    circuit_only = on_circuit[0]
    in_model_values = sweep.node_values([list(subset) for subset in subsets])
    gap = clean - all_patched
    noise = gap_noise(gap, run.behaviour.unit, run.seed)
    tau = fraction * abs(float(gap.mean()))
    faithfulness = _interval(ratio_bootstrap(circuit_only - all_patched, gap, seed=run.seed, label="faithfulness"))
    rows, best = [], Interval(0.0, 0.0, 0.0)
    for i, subset in enumerate(subsets):
        in_circuit, in_model = on_circuit[1 + i], in_model_values[i]
        diff = _abs_interval(_interval(ratio_bootstrap(in_circuit - in_model, gap, seed=run.seed, label=f"completeness-{i}")))
        rows.append({"removed": ", ".join(n.label for n in subset), "n_removed": len(subset),
                     "faithfulness_circuit": float(ratio_bootstrap(in_circuit - all_patched, gap, seed=run.seed, label=f"completeness-c-{i}")[0]),
                     "faithfulness_model": float(ratio_bootstrap(in_model - all_patched, gap, seed=run.seed, label=f"completeness-m-{i}")[0]),
                     "difference": diff.mean, "ci_low": diff.ci_low, "ci_high": diff.ci_high})
        best = diff if diff.mean >= best.mean else best
    completeness = pd.DataFrame(rows, columns=["removed", "n_removed", "faithfulness_circuit", "faithfulness_model",
                                               "difference", "ci_low", "ci_high"])
    minimality, minimality_frame = _node_minimality(inside, on_circuit[1 + len(subsets):], circuit_only, tau, run.seed,
                                                    run.behaviour.unit)
    notes = ((f"completeness and minimality {EMPTY_NOTE}",) if not kept_edges else ()) + (
        (f"{noise}: faithfulness and completeness, fractions of that gap, are noise",) if noise else ())
    return CircuitTest(faithfulness, best, minimality, completeness, minimality_frame, tau, float(clean.mean()),
                       float(all_patched.mean()), float(circuit_only.mean()), len(kept_edges), len(clean),
                       run.behaviour.describe(run.prompts), run.behaviour.unit, notes,
                       _per_prompt(clean, all_patched, circuit_only))


test_node_circuit.__test__ = False  # type: ignore[attr-defined]  # a test of a circuit, not a pytest test


def _node_minimality(inside: list[Node], values: torch.Tensor, circuit_only: torch.Tensor, tau: float, seed: int,
                     unit: str) -> tuple[Interval, pd.DataFrame]:
    """Each kept node's removal from the circuit (`values`: (node, prompt), its write patched for every reader on top
    of the nodes outside), against the threshold."""
    rows, smallest = [], Interval(float("inf"), float("inf"), float("inf"))
    for node, row in zip(inside, values):
        cost = _abs_interval(_interval(bootstrap(row - circuit_only, seed=seed, label=f"minimality-{node.label}")))
        rows.append({"sender": node.label, "receiver": "*", "via": "all", "cost": cost.mean, "ci_low": cost.ci_low,
                     "ci_high": cost.ci_high, "threshold": tau, "minimal": cost.mean >= tau, "unit": unit})
        smallest = cost if cost.mean < smallest.mean else smallest
    if not inside:
        smallest = Interval(NOT_TESTED, NOT_TESTED, NOT_TESTED)
    columns = ["sender", "receiver", "via", "cost", "ci_low", "ci_high", "threshold", "minimal", "unit"]
    return smallest, pd.DataFrame(rows, columns=columns)


def nodes_of(edges: Iterable[Edge | str]) -> list[str]:
    """The labels of the nodes the edges touch, in forward order."""
    parsed = [parse_edge(e) for e in edges]
    return [n.label for n in sorted({parse_node(x) for e in parsed for x in (e.sender, e.receiver)})]


__all__ = ["CircuitTest", "EMPTY_NOTE", "Interval", "N_SUBSETS", "NoBehaviour", "TEST_COLUMNS", "check_gap", "circuit_edges",
           "gap_noise", "nodes_of", "test_circuit", "test_node_circuit"]
