"""Experiments: the runs that train the shipped models and measure them for their cards.

- `tasks`: what the small models are trained on (repeated random tokens, windows of text) and how the toy
  card measures induction (`evaluate_induction`);
- `train`: `toy-induction` and `stdlib-bytes` (`interp train --task induction | stdlib-bytes ...`);
- `stdlib_bpe`: `stdlib-bpe`, its BPE, training with snapshots and induction tracked along the way, and its
  card (`interp train stdlib-bpe train ...`, then `interp train stdlib-bpe finish ...`).

They measure with the toolkit's own metrics and statistics (the core's head types, `interp.head_types`, and
`interp.stats`), unlike `interp.models`, which knows no toolkit; they need no analysis (`analyses.text_heads`
builds on them). Import the modules themselves (`from interp.experiments import train`); nothing is re-exported.
"""
