"""Experiments: the runs that train the shipped models and measure them for their cards.

- `tasks`: what the small models are trained on (repeated random tokens, windows of text) and how the toy
  card measures induction (`evaluate_induction`);
- `train`: `toy-induction` and `stdlib-bytes` (`interp train --task induction | stdlib-bytes ...`);
- `stdlib_bpe`: `stdlib-bpe`, its BPE, training with snapshots and induction tracked along the way, and its
  card (`interp train stdlib-bpe train ...`, then `interp train stdlib-bpe finish ...`).

They sit above the analyses (they measure with the toolkit's own metrics and statistics: the head types of
`interp.analyses.head_types`, `interp.stats`), unlike `interp.models`, which knows no toolkit. Import the
modules themselves (`from interp.experiments import train`); nothing is re-exported here.
"""
