"""Circuits: how heads compose, measured and tested like every other claim.

- `dla`: direct logit attribution, `direct_logit_attribution(model, prompts)`: each component's (embeddings,
  every head, every MLP, the biases) direct contribution to the right token's logit per prompt, with CIs,
  the final norm's scale frozen from the clean run (`logit_attributions` keeps the per-prompt values);
- `composition`: Q-, K- and V-composition scores from the weights (Elhage et al. 2021), each against
  a random baseline of the same shapes;
- the edges and their patching live in `interp.paths` (`Edge`, `EdgePatch`): a path patch is
  `interp.Run(...).effect(EdgePatch([edge]))`.
- `patching`: `path_patch` (one edge's effect per prompt, with a CI) and `edge_effects` (many edges' exact
  effects at once, each forward resumed from the receiver's layer);
- `attribution`: `attribution_patching`, every edge's and node's gradient estimate of its patching effect
  (EAP, Syed et al. 2023; "eap-ig": integrated along each layer's path) from one backward pass;
- `discovery`: `discover(..., method="acdc" | "eap")` -> a `Circuit` (nodes, edges, scores; JSON), proposed
  on one half of the prompts and tested on the other;
- `evaluation`: `test_circuit` -> `CircuitTest`: faithfulness, completeness and minimality with CIs;
- `summary`: `circuit_summary` -> `CircuitSummary`: a discovered circuit, each kept edge's own path patch on
  the held-out prompts, the tests (what `interp circuit` prints and `interp report` shows);
- `drawing`: `draw_circuit(edge table)`, the circuit as a graph (nodes by layer, edges labelled);
- `curve`: `faithfulness_curve(run, scores)` -> `FaithfulnessCurve`: MIB's faithfulness over circuit sizes, CPR and
  CMD with CIs and a random baseline; `edge_auroc(scores, truth)` against known edges.
Claims about one edge ("L0H0 -> L1H0 via k composes") live in `interp.analyses.claims.composition`.
"""
# -- circuits-discover: path patching, attribution patching, discovery, circuit tests (one block, for merging)
from interp.analyses.circuits.attribution import Attribution, attribution_patching
from interp.analyses.circuits.composition import baseline, composition_scores
from interp.analyses.circuits.discovery import ACDC_THRESHOLD, EAP_THRESHOLD, Circuit, discover
from interp.analyses.circuits.dla import FROZEN_SCALE, LogitAttribution, direct_logit_attribution, logit_attributions
from interp.analyses.circuits.evaluation import CircuitTest, Interval, test_circuit, test_node_circuit
from interp.analyses.circuits.patching import PatchSweep, PathPatch, edge_effects, edge_frame, path_patch, path_patches

__all__ = ["FROZEN_SCALE", "LogitAttribution", "baseline", "composition_scores", "direct_logit_attribution",
           "logit_attributions"]
__all__ += [  # circuits-discover
    "ACDC_THRESHOLD", "Attribution", "Circuit", "CircuitTest", "EAP_THRESHOLD", "Interval", "PatchSweep", "PathPatch",
    "attribution_patching", "discover", "edge_effects", "edge_frame", "path_patch", "path_patches", "test_circuit",
    "test_node_circuit",
]

# -- circuits-claims: the summary the faces show, and its drawing
from interp.analyses.circuits.drawing import draw_circuit
from interp.analyses.circuits.summary import CircuitSummary, circuit_summary

__all__ += ["CircuitSummary", "circuit_summary", "draw_circuit"]  # circuits-claims

# -- circuits-curve: the benchmark's faithfulness curve (MIB's CPR / CMD) and edge AUROC
from interp.analyses.circuits.curve import (  # noqa: E402
           MIB_FRACTIONS,
           FaithfulnessCurve,
           cmd,
           cpr,
           edge_auroc,
           faithfulness_curve,
)

__all__ += ["FaithfulnessCurve", "MIB_FRACTIONS", "cmd", "cpr", "edge_auroc", "faithfulness_curve"]  # circuits-curve
