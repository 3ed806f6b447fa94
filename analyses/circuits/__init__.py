"""Circuits: how heads compose, measured and tested like every other claim.

- `composition`: Q-, K- and V-composition scores from the weights (Elhage et al. 2021), each against
  a random baseline of the same shapes;
- the edges and their patching live in `interp.paths` (`Edge`, `EdgePatch`): a path patch is
  `interp.Run(...).effect(EdgePatch([edge]))`.
- `patching`: `path_patch` (one edge's effect per prompt, with a CI) and `edge_effects` (many edges' exact
  effects at once, each forward resumed from the receiver's layer);
"""
# -- circuits-discover: path patching, attribution patching, discovery, circuit tests (one block, for merging)
from interp.analyses.circuits.patching import PatchSweep, PathPatch, edge_effects, edge_frame, path_patch, path_patches

__all__ = [
    # circuits-discover
    "PatchSweep", "PathPatch", "edge_effects", "edge_frame", "path_patch", "path_patches",
]
