"""What the claims' evidence shares: the head a claim is about, its head type, and a positional claim's parameters."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from interp.analyses.head_types import HEAD_TYPES, HeadType, HeadTypeParams, PlainParams, offset_type
from interp.claims import Claim
from interp.errors import BadInput


def claim_head_type(claim: Claim) -> HeadType | None:
    """The head type a claim is about: its typed params' (`HeadTypeParams`), else the registered type whose
    metric a plain-dict claim names (None for other claims, e.g. positional ones)."""
    if isinstance(claim.params, HeadTypeParams):
        return claim.params.head_type
    metric = claim.params.get("metric")
    return next((t for t in HEAD_TYPES.values() if t.column == metric), None)


def subject(claim: Claim) -> tuple[int, int]:
    """The (layer, head) a head claim is about (its first head)."""
    if not claim.heads:
        raise BadInput(f"claim {claim.name!r} is about the whole model; {claim.kinds} evidence needs a head.")
    return claim.heads[0]


@dataclass(frozen=True)
class PositionalParams(PlainParams):
    """A positional claim's parameters: the relative offset (an int, "first", or None: the modal offset
    of the tested prompts). Reads as the plain mapping {"metric": "argmax_at:K", "offset": K}."""

    offset: int | str | None = None

    @property
    def head_type(self) -> HeadType | None:
        """The positional head type judged (`interp.analyses.head_types.offset_type`); None until the offset is known."""
        return None if self.offset is None else offset_type(self.offset)

    def as_dict(self) -> dict[str, Any]:
        return {"metric": "argmax_at:auto" if self.offset is None else f"argmax_at:{self.offset}", "offset": self.offset}
