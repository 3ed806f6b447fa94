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

On a model hooked by interception (no split q/k/v inputs, so no edge can be patched) the section gives what the
model allows instead, where it allows it: each head's write patched into each later layer's whole attention
input (`interp.analyses.circuits.attention_input_patch`, `L0H1 -> L1 (attention input)`), at most
`MAX_LAYER_PATCHES` of them (`CircuitSection.layer_patches`; report.json's "layer_patches" beside "skipped").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from interp.data import PromptSet
from interp.errors import BadInput

MAX_GRAPH_EDGES = 2000  # ACDC runs one patched forward per edge: beyond this, a report waits too long
MAX_LAYER_PATCHES = 64  # head -> later layer patches on an intercepted model (three forwards each)


@dataclass(frozen=True)
class CircuitSection:
    """The section's content: a `CircuitSummary`, or None and the reason it was not computed."""

    summary: Any  # interp.analyses.circuits.summary.CircuitSummary | None
    note: str = ""  # why there is no circuit (empty when there is one)
    layer_patches: Any = None  # pd.DataFrame of attention_input_patch rows on an intercepted model, else None

    def to_json(self) -> dict[str, Any]:
        if self.summary is not None:
            return self.summary.to_json()
        skipped: dict[str, Any] = {"skipped": self.note}
        if self.layer_patches is not None:
            skipped["layer_patches"] = self.layer_patches.to_dict("records")
        return skipped


def report_circuit(model: nn.Module, prompts: PromptSet, *, seed: int, behaviour: Any = None,
                   has_loss: bool = True) -> CircuitSection:
    """The circuit section for the report (see the module): computed, or skipped with the reason."""
    from interp.paths import check_graph_model, graph

    if not has_loss:
        return CircuitSection(None, "no meaningful loss for this model, so no behaviour to find a circuit for")
    try:
        check_graph_model(model, "the circuit section")
    except BadInput as error:
        return CircuitSection(None, str(error), _layer_patches(model, prompts, seed, behaviour))
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


def _layer_patches(model: nn.Module, prompts: PromptSet, seed: int, behaviour: Any) -> Any:
    """Every head -> later layer (attention input) patch an intercepted model allows, or None (none, too many, too few
    prompts, or a model with split inputs, refused for another reason)."""
    import pandas as pd

    from interp.analyses.circuits.patching import attention_input_patch
    from interp.heads import Head
    from interp.hooks import attention_sites
    from interp.intercepted import check_patchable, has_split_inputs

    if has_split_inputs(model) or not hasattr(model, "hook_dict") or len(prompts) < 4:
        return None
    sites = attention_sites(model)
    pairs = []
    for sender in sites:
        for receiver in sites[sender.layer + 1:]:
            for head in range(sender.n_heads):
                try:
                    check_patchable(model, Head(sender.layer, head), receiver.layer)
                except BadInput:
                    continue
                pairs.append(((sender.layer, head), receiver.layer))
    if not pairs or len(pairs) > MAX_LAYER_PATCHES:
        return None
    rows = [attention_input_patch(model, prompts, sender=head, layer=layer, behaviour=behaviour, seed=seed)
            for head, layer in pairs]
    return pd.concat(rows, ignore_index=True)


__all__ = ["CircuitSection", "MAX_GRAPH_EDGES", "MAX_LAYER_PATCHES", "report_circuit"]
