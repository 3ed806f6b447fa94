"""What the claims' evidence shares: the head a claim is about, its head type, a positional claim's parameters, and
the power of a causal evidence (`with_power`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable

from interp.analyses.circuits.power import WriteChange
from interp.analyses.head_types import HEAD_TYPES, HeadType, HeadTypeParams, PlainParams, offset_type
from interp.claims import Claim, Evidence
from interp.errors import BadInput


def weakest(changes: Iterable[WriteChange]) -> WriteChange | None:
    """Of the senders a causal evidence corrupts, the one whose test has the least power (a powerless one first)."""
    return min(changes, key=lambda c: (not c.powerless, c.max), default=None)


def with_power(ev: Evidence, change: WriteChange | None) -> Evidence:
    """The evidence with its sender's `write_change` (`extra` too, for tables); without power, undecided and saying
    why ("inconclusive: the corruption does not change L0H0's write ..."): never refuting nor supporting
    (`interp.claims.lacks_power`). `change` None: nothing measured, the evidence as it is."""
    if change is None:
        return ev
    extra = {**ev.extra, "write_change": change.max, **({"silent_sender": "yes"} if change.silent else {})}
    ev = dataclasses.replace(ev, write_change=change.max, extra=extra)
    if not change.powerless:
        return ev
    return dataclasses.replace(ev, passed=None, detail=f"inconclusive: {change.reason()}; {ev.detail}")


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
