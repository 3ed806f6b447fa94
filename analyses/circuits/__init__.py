"""Circuits: how heads compose, measured and tested like every other claim.

- `composition`: Q-, K- and V-composition scores from the weights (Elhage et al. 2021), each against
  a random baseline of the same shapes;
- the edges and their patching live in `interp.paths` (`Edge`, `EdgePatch`): a path patch is
  `interp.Run(...).effect(EdgePatch([edge]))`.
"""
