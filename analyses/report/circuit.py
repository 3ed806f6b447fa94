"""The report's circuit section: the circuit discovered for the report's behaviour, drawn, with its tests.

`report_circuit` runs `interp.analyses.circuits.summary.circuit_summary` (ACDC at its fixed threshold,
proposed on half of the report's prompts and tested on the other half) when the model can be path patched
(pre-norm blocks with split q/k/v inputs), has a meaningful loss, and its graph has at most
`MAX_GRAPH_EDGES` edges (ACDC patches each of them once, so a larger model is left to `interp circuit`), and
its prompts show a behaviour to explain (a clean-vs-patched gap beyond its noise, `evaluation.check_gap`);
otherwise the section says why it is absent. With the circuit comes MIB's faithfulness curve of ACDC's scores
(`circuit_summary(..., curve=True)`: CPR and CMD with CIs against random rankings, on the held-out half; about
70 patched forwards, few beside ACDC's one per edge). Rendered as `plots/circuit.png` (`.plots.circuit_figures`:
`draw_circuit`, nodes by layer, edges labelled with their input and effect) and `plots/circuit_curve.png`
(`draw_curve`), an HTML table of the kept edges, the tests and the curve's points and lines in summary.md
(`.html.circuit_html`, `.html.circuit_markdown`), and `report.json`'s "circuit" entry (`CircuitSection.to_json`:
`CircuitSummary.to_json` with its `curve` and the tests' per-prompt `values`, or {"skipped": reason}).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from interp.data import PromptSet
from interp.errors import BadInput

MAX_GRAPH_EDGES = 2000  # ACDC runs one patched forward per edge: beyond this, a report waits too long


@dataclass(frozen=True)
class CircuitSection:
    """The section's content: a `CircuitSummary`, or None and the reason it was not computed."""

    summary: Any  # interp.analyses.circuits.summary.CircuitSummary | None
    note: str = ""  # why there is no circuit (empty when there is one)

    def to_json(self) -> dict[str, Any]:
        return self.summary.to_json() if self.summary is not None else {"skipped": self.note}


def report_circuit(model: nn.Module, prompts: PromptSet, *, seed: int, behaviour: Any = None,
                   has_loss: bool = True) -> CircuitSection:
    """The circuit section for the report (see the module): computed, or skipped with the reason."""
    from interp.paths import check_graph_model, graph

    if not has_loss:
        return CircuitSection(None, "no meaningful loss for this model, so no behaviour to find a circuit for")
    try:
        check_graph_model(model, "the circuit section")
    except BadInput as error:
        return CircuitSection(None, str(error))
    n_edges = len(graph(model))
    if n_edges > MAX_GRAPH_EDGES:
        return CircuitSection(None, f"the model's graph has {n_edges} edges, more than the report's {MAX_GRAPH_EDGES} "
                                    "(ACDC patches each once); run `interp circuit SPEC` for it")
    if len(prompts) < 4:
        return CircuitSection(None, f"{len(prompts)} prompts cannot be split into a proposing and a testing half")
    from interp.analyses.circuits.evaluation import NoBehaviour
    from interp.analyses.circuits.summary import circuit_summary

    try:
        return CircuitSection(circuit_summary(model, prompts, seed=seed, behaviour=behaviour, curve=True))
    except NoBehaviour as error:  # the report's prompts show no behaviour to explain (e.g. random tokens)
        return CircuitSection(None, str(error))


__all__ = ["CircuitSection", "MAX_GRAPH_EDGES", "report_circuit"]
