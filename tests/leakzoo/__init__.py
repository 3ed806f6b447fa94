"""A zoo of third-party-style attention models for the leakage audit, each labelled in its source.

Written in the manner of code found in the wild (nanoGPT-style, minGPT-style, plain PyTorch,
Hugging Face wrappers and tiny Hugging Face models), not copied from it. Every factory is a
module-level function `name()` returning a small model (d_model 32, 2 layers, vocab 64) in eval
mode with fixed weights, so `interp audit-leakage leakzoo.nanostyle:flash` works with tests/ on
the path.

Markers, found by scanning the source text (`marked_line`):
- `# BUG: <case>` ends the line that carries the bug of factory `<case>`;
- `# SITE: <label>` ends a line where a mask built elsewhere is applied (`nano-mask`), the
  softmax after it (`nano-softmax`), an attention call (`plain-sdpa`)...: the lines that also count
  as the origin of a bug in how a mask is *built* (an off-by-one `tril` in `__init__`).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

VOCAB = 64
N_EMBD = 32
N_LAYER = 2
SEED = 1234


def seeded(seed: int = SEED) -> None:
    """Every factory draws its weights after this, so the same factory gives the same model."""
    torch.manual_seed(seed)


def marked_line(path: str | Path, kind: str, name: str) -> int:
    """The 1-based line of `path` ending in `# BUG: name` (kind "BUG") or `# SITE: name` (kind "SITE")."""
    pattern = re.compile(rf"#\s*{kind}:\s*{re.escape(name)}\b(?!-)")
    hits = [number for number, line in enumerate(Path(path).read_text().splitlines(), 1) if pattern.search(line)]
    if len(hits) != 1:
        raise LookupError(f"{path}: expected one '# {kind}: {name}' marker, found {len(hits)} (lines {hits})")
    return hits[0]
