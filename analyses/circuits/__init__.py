"""Circuits: how heads compose, measured and tested like every other claim.

- `dla`: direct logit attribution, `direct_logit_attribution(model, prompts)`: each component's (embeddings,
  every head, every MLP, the biases) direct contribution to the right token's logit per prompt, with CIs,
  the final norm's scale frozen from the clean run (`logit_attributions` keeps the per-prompt values);
- `composition`: Q-, K- and V-composition scores from the weights (Elhage et al. 2021), each against
  a random baseline of the same shapes;
- the edges and their patching live in `interp.paths` (`Edge`, `EdgePatch`): a path patch is
  `interp.Run(...).effect(EdgePatch([edge]))`.
- `patching`: `path_patch` (one edge's effect per prompt, with a CI) and `edge_effects` (many edges' exact
  effects at once, each forward resumed from the receiver's layer); `attention_input_patch`, a head's write into
  a later layer's whole attention input (q, k and v of all its heads), which models hooked by interception allow;
- `attribution`: `attribution_patching`, every edge's and node's gradient estimate of its patching effect
  (EAP, Syed et al. 2023; "eap-ig": integrated along each layer's path) from one backward pass;
- `discovery`: `discover(..., method="acdc" | "eap")` -> a `Circuit` (nodes, edges, scores; JSON), proposed
  on one half of the prompts and tested on the other;
- `evaluation`: `test_circuit` -> `CircuitTest`: faithfulness, completeness and minimality with CIs;
- `summary`: `circuit_summary` -> `CircuitSummary`: a discovered circuit, each kept edge's own path patch on
  the held-out prompts, the tests (what `interp circuit` prints and `interp report` shows);
- `drawing`: `draw_circuit(edge table)`, the circuit as a graph (nodes by layer, edges labelled); `draw_curve(curve)`,
  a faithfulness curve;
- `curve`: `faithfulness_curve(run, scores)` -> `FaithfulnessCurve`: MIB's faithfulness over circuit sizes, CPR and
  CMD with CIs and a random baseline; `edge_auroc(scores, truth)` against known edges.
Claims about one edge ("L0H0 -> L1H0 via k composes") live in `interp.analyses.claims.composition`.
"""
from interp.analyses.circuits.attribution import Attribution, attribution_patching
from interp.analyses.circuits.composition import composition_scores
from interp.analyses.circuits.curve import FaithfulnessCurve, edge_auroc, faithfulness_curve
from interp.analyses.circuits.discovery import Circuit, discover
from interp.analyses.circuits.dla import LogitAttribution, direct_logit_attribution, logit_attributions
from interp.analyses.circuits.drawing import draw_circuit, draw_curve
from interp.analyses.circuits.evaluation import CircuitTest, test_circuit
from interp.analyses.circuits.patching import PathPatch, attention_input_patch, edge_effects, path_patch, path_patches
from interp.analyses.circuits.summary import CircuitSummary as CircuitSummary  # circuit_summary's result
from interp.analyses.circuits.summary import circuit_summary

# what a user calls: one entry point per question above, and the result types they return
__all__ = [
    "direct_logit_attribution",
    "logit_attributions",
    "LogitAttribution",
    "composition_scores",
    "path_patch",
    "path_patches",
    "PathPatch",
    "attention_input_patch",
    "edge_effects",
    "attribution_patching",
    "Attribution",
    "discover",
    "Circuit",
    "test_circuit",
    "CircuitTest",
    "circuit_summary",
    "draw_circuit",
    "draw_curve",
    "faithfulness_curve",
    "FaithfulnessCurve",
    "edge_auroc",
]

# importable from here too, but no part of the surface (`name as name`: an explicit re-export): defaults,
# building blocks and the engine behind path patching
from interp.analyses.circuits.composition import baseline as baseline
from interp.analyses.circuits.curve import MIB_FRACTIONS as MIB_FRACTIONS
from interp.analyses.circuits.curve import cmd as cmd
from interp.analyses.circuits.curve import cpr as cpr
from interp.analyses.circuits.discovery import ACDC_THRESHOLD as ACDC_THRESHOLD
from interp.analyses.circuits.discovery import EAP_THRESHOLD as EAP_THRESHOLD
from interp.analyses.circuits.dla import FROZEN_SCALE as FROZEN_SCALE
from interp.analyses.circuits.evaluation import Interval as Interval
from interp.analyses.circuits.evaluation import (
    test_node_circuit as test_node_circuit,  # discover(method='nodes') runs it
)
from interp.analyses.circuits.patching import PatchSweep as PatchSweep
from interp.analyses.circuits.patching import edge_frame as edge_frame
