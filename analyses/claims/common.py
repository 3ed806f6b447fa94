"""What the claims' evidence shares: the head a claim is about and its head type."""
from __future__ import annotations

from interp.analyses.head_types import HEAD_TYPES, HeadType, HeadTypeParams
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
