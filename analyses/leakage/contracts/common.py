"""What the contracts of modern stacks share: their verdict (`ContractResult`), calling a model with the
arguments a contract needs, the float64 copy, token draws and the measure of a change.

A change of a protected output is measured relative to the row's largest |logit| (max over the vocabulary of
|a - b|, over that scale); a NaN on either side counts as an infinite change. A change counts as a leak above
`threshold(dtype, floor)`: CONTRACT_NOISE_FACTOR times the floor measured on the model itself, and at least
sqrt(eps) of the dtype the comparison ran in (1.5e-8 in float64), since a floor of exactly 0 (the same shapes,
the same kernels) would otherwise make the last bit of a legitimate reassociation a leak.
"""
from __future__ import annotations

import copy
import inspect
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from interp.analyses.leakage.fast import _duration
from interp.analyses.leakage.origin import Origin
from interp.modelinfo import user_class as user_class  # the contracts' modules import it from here

ContractKind = Literal["document", "kv_cache", "window", "backend"]
CONTRACT_KINDS: tuple[str, ...] = ("document", "kv_cache", "window", "backend")
CONTRACT_NOISE_FACTOR = 100.0  # a leak moves a protected output by more than this multiple of the measured floor
# (correct zoo and tiny Hugging Face models measure <= 1e-15 in float64 at one shape, <= 1e-6 across shapes and
# kernels, from their float32 parts; every planted bug >= 1e-2: the factor leaves decades on both sides)
ALL_ONES = "ones"  # in a run's arguments: an all-ones attention_mask shaped as the rows called


@dataclass(frozen=True)
class ContractFinding:
    """One protected output that moved (for `over-masked`: one that should have moved and did not)."""

    kind: str  # "document", "over-masked", "future", "kv_cache", "window", "backend"
    run: str  # the call pattern: "attention_mask=ones", "prefix 5, chunk 3", "length 12", "sdpa vs eager"
    query: int
    key: int | None  # the changed position (the first of them, in a decode call); None for comparisons
    influence: float  # relative change of the output; for a layer's finding, the attention weight itself
    layer: int | None = None  # the window contract per layer: the attention layer (forward order) whose weights broke
    head: int | None = None
    call: int | None = None  # the KV-cache contract: the call the query was computed in (0 the prefill, then decodes)
    positions: tuple[int, int] | None = None  # that call's positions, start and end (exclusive)

    def words(self) -> str:
        if self.call is not None and self.positions is not None:
            return self._call_words(*self.positions)
        where = f"query {self.query}" + ("" if self.key is None else f" from key {self.key}")
        layer = "" if self.layer is None else f", layer {self.layer} head {self.head}"
        return f"{self.kind} at {where} ({self.run}{layer}, {self.influence:.3g})"

    def _call_words(self, start: int, end: int) -> str:
        """Which position of which call moved, e.g. "kv_cache at position 6, token 2 of 3 in decode call 1 (positions
        5..7) after a prefill of 5 (prefix 5, chunk 3, 0.12)"; a decoding query alone: "decoded alone in call 1"."""
        if self.call == 0:
            which = f"token {self.query - start + 1} of {end - start} in the prefill (positions {start}..{end - 1})"
        elif end - start == 1:
            which = f"decoded alone in call {self.call} after a prefill of {self._prefill()}"
        else:
            which = (f"token {self.query - start + 1} of {end - start} in decode call {self.call} (positions "
                     f"{start}..{end - 1}) after a prefill of {self._prefill()}")
        cause = "" if self.key is None else f", moved by position {self.key} later in the same call"
        return f"{self.kind} at position {self.query}, {which}{cause} ({self.run}, {self.influence:.3g})"

    def _prefill(self) -> str:
        words = self.run.split(": ")[-1].split(", ")  # "prefix 5, chunk 3", "sdpa: prefix 5, chunk 3"
        return next((w.split()[1] for w in words if w.startswith("prefix ")), "?")



@dataclass(frozen=True)
class ContractResult:
    """One contract's verdict: `status` is "exact zero", "noise", "leak" or "not applicable"; `found` the kinds of
    what broke it (its own kind, "future", "over-masked", "window" for a back-end held to the windows)."""

    kind: str
    status: str
    max_influence: float  # the largest change of a protected output (relative; comparisons included)
    floor: float  # the rounding measured on the model at the shapes compared
    threshold: float
    dtype: str  # the precision the comparisons ran in: "float64" where the model casts, else "float32"
    findings: tuple[ContractFinding, ...] = ()
    runs: dict[str, float] = field(default_factory=dict)  # each call pattern's largest change
    notes: tuple[str, ...] = ()
    origin: Origin | None = None
    seconds: float = 0.0

    @property
    def leaks(self) -> bool:
        return self.status == "leak"

    @property
    def found(self) -> tuple[str, ...]:
        return tuple(sorted({f.kind for f in self.findings}))

    def first(self, kind: str | None = None) -> ContractFinding | None:
        hits = [f for f in self.findings if kind is None or f.kind == kind]
        return min(hits, key=lambda f: (f.query, -1 if f.key is None else f.key), default=None)

    def worst(self) -> ContractFinding | None:
        """The largest change found; a missing dependence (`over-masked`, influence 0) only when nothing moved."""
        return max(self.findings, key=lambda f: -1.0 if f.kind == "over-masked" else f.influence, default=None)

    @property
    def where(self) -> str:
        """The first finding of each kind in words (the table's `where`)."""
        firsts = [self.first(kind) for kind in self.found]
        return "; ".join(f.words() for f in firsts if f is not None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status, "max_influence": _finite(self.max_influence), "floor": _finite(self.floor),
            "origin": None if self.origin is None else self.origin.to_dict(), "threshold": _finite(self.threshold),
            "dtype": self.dtype, "found": list(self.found),
            "first": {kind: vars(f).copy() for kind in self.found if (f := self.first(kind)) is not None},
            "runs": {run: _finite(value) for run, value in self.runs.items()}, "notes": list(self.notes),
            "n_findings": len(self.findings), "seconds": round(self.seconds, 3),
        }


def _finite(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def judged(kind: str, findings: Sequence[ContractFinding], runs: dict[str, float], *, floor: float, dtype: str,
           notes: Sequence[str] = (), applicable: bool = True) -> ContractResult:
    """The verdict from every candidate finding: those beyond the threshold (over-masking: those at or below it)."""
    limit = threshold(dtype, floor)
    kept = tuple(f for f in findings if (f.influence <= limit) == (f.kind == "over-masked"))
    biggest = max(runs.values(), default=0.0)
    if kept:
        status = "leak"
    elif not applicable:
        status = "not applicable"
    else:
        status = "exact zero" if biggest == 0.0 else "noise"
    return ContractResult(kind, status, biggest, floor, limit, dtype, kept, dict(runs), tuple(notes))


def threshold(dtype: str, floor: float) -> float:
    eps = torch.finfo(torch.float64 if dtype == "float64" else torch.float32).eps
    return max(eps ** 0.5, CONTRACT_NOISE_FACTOR * floor)


# ---------------------------------------------------------------------------------------------
# Calling a model
# ---------------------------------------------------------------------------------------------

def parameters(model: Any) -> set[str]:
    """The names the model's forward takes explicitly (not through **kwargs); a model the toolkit hooked (whose class
    wraps the forward in `*args, **kwargs`) answers for its own class's forward."""
    forward = model
    if isinstance(model, torch.nn.Module):
        forward = user_class(model).forward
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    try:
        return {p.name for p in inspect.signature(forward).parameters.values() if p.kind in kinds}
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        return set()


def logits_of(output: Any) -> torch.Tensor:
    """Logits from a tensor, a (logits, ...) tuple or an output object with `.logits`."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return output[0]
    return output.logits


def cache_of(output: Any) -> Any:
    """The cache an output carries: `(logits, cache)`, or an object's `cache` / `past_key_values`."""
    if isinstance(output, (tuple, list)):
        return output[1]
    for name in ("cache", "past_key_values"):  # transformers 5 names it `cache` (and warns on `past_key_values`)
        found = getattr(output, name, None)
        if found is not None:
            return found
    return None


def call_rows(model: Any, rows: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    """The model's logits (rows, pos, vocab) in float64 for the rows with `kwargs` (ALL_ONES: a mask of ones)."""
    call = {k: (torch.ones_like(rows) if isinstance(v, str) and v == ALL_ONES else v) for k, v in kwargs.items()}
    with torch.no_grad():
        return logits_of(model(rows, **call)).double()


def with_arguments(model: Any, kwargs: dict[str, Any]) -> Callable[..., Any]:
    """`model` called with `kwargs` added, for the origin search (which passes tokens and an attention_mask)."""
    def call(tokens: torch.Tensor, **extra: Any) -> Any:
        fixed = {k: (torch.ones_like(tokens) if isinstance(v, str) and v == ALL_ONES else v) for k, v in kwargs.items()}
        return model(tokens, **{**fixed, **extra})

    return call


def float64_twin(model: Any, probe: Callable[[Any], object]) -> tuple[Any, str, tuple[str, ...]]:
    """A float64 copy of the model when it runs in float64 (`probe` succeeds on it), else the model itself (float32),
    said in the notes."""
    if not isinstance(model, torch.nn.Module):
        return model, "float32", ("a black box: the comparisons ran in the model's own precision",)
    try:
        double = copy.deepcopy(model).to(torch.float64)
        with torch.no_grad():
            probe(double)
    except Exception as error:  # the model's code fixes a dtype, or its kernel has no float64 on this device
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        return model, "float32", (f"float64 refused ({type(error).__name__}: {first}); measured in float32",)
    return double, "float64", ()


def float32_twin(model: Any) -> Any:
    return copy.deepcopy(model).to(torch.float32) if isinstance(model, torch.nn.Module) else model


def sample_tokens(n: int, vocab: int, avoid: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    """n tokens drawn from the vocabulary without the `avoid` ids."""
    allowed = torch.tensor([t for t in range(vocab) if t not in set(avoid)])
    return allowed[torch.randint(len(allowed), (n,), generator=generator)]


def replace_tokens(tokens: torch.Tensor, positions: Sequence[int] | range, vocab: int, avoid: Sequence[int],
                   generator: torch.Generator) -> torch.Tensor:
    """A copy of tokens (T,) with each of `positions` changed to another token outside `avoid`."""
    changed = tokens.clone()
    for position in positions:
        old = int(tokens[position])
        changed[position] = sample_tokens(1, vocab, [*avoid, old], generator)[0]
    return changed


def change(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """max |a - b| over the vocabulary, over `scale`; NaN on either side: an infinite change."""
    return torch.nan_to_num((a - b).abs(), nan=math.inf).amax(-1) / scale


def influence(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """(rows - 1, pos): each row's change against row 0."""
    return change(logits[1:], logits[:1], scale)


def scale_of(logits: torch.Tensor) -> float:
    """The largest finite |logit| (1 when there is none)."""
    finite = logits[torch.isfinite(logits)]
    return float(finite.abs().max()) if finite.numel() else 1.0


def announce_cost(kind: str, words: str, enabled: bool, eta: Callable[[], float | None] | None = None) -> None:
    """A mode's cost, printed to stderr before it starts (`audit(progress=True)`), with its ETA where `eta` (timing a
    forward of the mode's shape, only when printing) gives one."""
    if not enabled:
        return
    seconds = eta() if eta is not None else None
    about = "under 1 s" if seconds is not None and seconds < 1 else f"about {_duration(seconds or 0.0)}"
    tail = "" if seconds is None else f"; ETA {about} (from a timed forward, before localisation)"
    print(f"{kind} contract: {words}{tail}", file=sys.stderr, flush=True)


def scaled(seconds: float | None, factor: float) -> float | None:
    return None if seconds is None else seconds * factor


def timed(call: Callable[[], object]) -> float | None:
    """Seconds one call takes, for an ETA; None when it fails (the mode itself then says why)."""
    started = time.perf_counter()
    try:
        with torch.no_grad():
            call()
    except Exception:
        return None
    return time.perf_counter() - started
