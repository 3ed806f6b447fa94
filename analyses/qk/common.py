"""The names the QK attribution's modules share: its two views and its unit."""
from __future__ import annotations

from typing import Literal, get_args

View = Literal["difference", "score"]
VIEWS: tuple[str, ...] = get_args(View)
UNIT = "score"  # the head's attention score: q . k times attn.scale, before the softmax
FROZEN_NORM = ("ln1's scale frozen at its clean-run value (per prompt and position), so the terms sum exactly to the "
               "model's score; removing a source would also change that scale, which only .check() measures")
