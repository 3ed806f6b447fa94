"""The model's own rounding, measured: the noise floor every comparison of the leakage audit is judged against.

Two runs of a causal model that differ only where a leak may enter (a prefix against the full length,
perturbed rows against the base rows, one example against its batch) are two roundings of the same
numbers. Each run's *deviation* is how far its outputs lie from a float64 copy of the model run on the
same inputs at the same shape; the two runs then differ by at most the sum of their deviations, so the
*floor* of a comparison is that sum (`comparison_floor`), taken position by position over the positions
compared. A floor is never taken from the comparison itself (a leak would inflate it). Deep float32 models
round differently at different lengths and batch shapes (SmolLM2-135M, 30 layers: 1.8e-4 of the output
spread between lengths, where a fixed tolerance of 5e-5 calls the correct model leaky).

Where the model cannot be cast (a callable, a model whose float64 copy fails), the floor is the
same-length batch-composition floor: the prompts run together against one at a time. That floor says
how much rounding depends on the batch's arrangement, not how far either run lies from exact numbers,
so the report says the guarantee is weaker.

A method's threshold is max(tol, NOISE_FACTOR x floor): `tol` stays a lower bound. Whenever the float32
floor would put that threshold above FLOAT64_DECIDES (1e-4; the floor above 1e-4 / NOISE_FACTOR, and so
whenever the floor itself exceeds 1e-4), a leak of 1e-4 would hide under the model's own rounding, and
the float64 copy decides: the comparison is made between float64 runs, whose floor is the float32 one
scaled by the ratio of the unit roundoffs (2^-53 / 2^-24).

`measure_floors` measures every method's floor on the audit's own prompts before the methods run
(`Floors`); `comparison_floor` is the reusable piece: two runs' outputs and their float64 references in,
the floor out.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from interp.analyses.leakage.adapter import ModelAdapter
from interp.analyses.leakage.methods import _change, _scale
from interp.analyses.leakage.types import NOISE_FACTOR
from interp.errors import ModelError

FLOAT64_DECIDES = 1e-4  # a float32 threshold (NOISE_FACTOR x floor) above this hides a leak of 1e-4: float64 decides
FLOAT64_SCALE = 2.0 ** -29  # float64's unit roundoff over float32's: the float64 runs' floor, estimated
How = Literal["float64", "batch composition"]


def decides(floor: float) -> bool:
    """Whether a float32 floor calls for float64: its threshold, NOISE_FACTOR x floor, would exceed FLOAT64_DECIDES."""
    return NOISE_FACTOR * floor > FLOAT64_DECIDES


def shape_of(tokens: torch.Tensor) -> str:
    """A run's shape as the floor's keys name it: "rows x positions", e.g. "2x256"."""
    return "x".join(str(size) for size in tokens.shape[:2])


def deviation(out: torch.Tensor, reference: torch.Tensor, scale: float) -> torch.Tensor:
    """(pos,) the largest |out - reference| at each position over rows and features, relative to `scale`."""
    if out.shape != reference.shape:
        raise ValueError(f"a run and its float64 reference differ in shape: {tuple(out.shape)} vs {tuple(reference.shape)}.")
    return _change(out.double(), reference.double()).amax(dim=(0, 2)) / scale  # (pos,)


def comparison_floor(run_a: torch.Tensor, reference_a: torch.Tensor, run_b: torch.Tensor, reference_b: torch.Tensor,
                     *, scale: float) -> float:
    """The floor of comparing run a with run b (each (rows, pos, features); rows may differ): at every position both
    runs have, the sum of the two runs' deviations from their float64 references, relative to `scale`; the largest."""
    dev_a, dev_b = deviation(run_a, reference_a, scale), deviation(run_b, reference_b, scale)
    shared = min(len(dev_a), len(dev_b))
    return float((dev_a[:shared] + dev_b[:shared]).max()) if shared else 0.0


def float64_copy(model: Any) -> nn.Module | None:
    """A float64 copy of `model` (the caller's model is left as it is), or None: a callable, or a model that
    cannot be copied or cast. Its floating tensors are made in float64 as the copy is made, so the model is never
    held twice in its own precision (1.1 GB, not 1.6 GB, beside SmolLM2-135M's 0.54 GB)."""
    if not isinstance(model, nn.Module):
        return None
    memo: dict[int, Any] = {}
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point() and id(tensor) not in memo:
                double = tensor.detach().to(torch.float64)
                memo[id(tensor)] = nn.Parameter(double, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else double
    try:
        return copy.deepcopy(model, memo).double().eval()
    except Exception:  # a model that refuses deepcopy or a dtype change: the batch-composition floor is used
        return None


@dataclass
class Floors:
    """Every method's measured floor: per method, per pair of shapes compared, relative to the output spread.

    `how`: "float64" (deviations from a float64 copy) or "batch composition" (no copy: weaker);
    `reference`: the float64 copy's adapter (None when the model cannot be cast), used where float64 decides."""

    tol: float
    how: How
    pairs: dict[str, dict[str, float]] = field(default_factory=dict)  # method -> "2x64 | 2x256" -> floor
    reference: ModelAdapter | None = None
    notes: list[str] = field(default_factory=list)
    tol64: float | None = None  # the lower bound of float64 comparisons (None: tol); a half-precision default tol
    # is about half-precision rounding, which a float64 comparison does not have

    def add(self, method: str, shapes: str, floor: float) -> None:
        mine = self.pairs.setdefault(method, {})
        mine[shapes] = max(mine.get(shapes, 0.0), floor)

    def floor(self, method: str) -> float:
        """The largest float32 floor measured for `method` (0.0 when none was measured)."""
        return max(self.pairs.get(method, {}).values(), default=0.0)

    def float64_decides(self, method: str) -> bool:
        """Whether `method`'s comparisons run on the float64 copy (`decides`)."""
        return self.reference is not None and decides(self.floor(method))

    def threshold(self, method: str) -> float:
        """max(tol, NOISE_FACTOR x floor): in float64 where it decides, the floor scaled to float64's rounding."""
        if self.float64_decides(method):
            return max(self.tol if self.tol64 is None else self.tol64, NOISE_FACTOR * self.floor(method) * FLOAT64_SCALE)
        floor = self.floor(method)
        return max(self.tol, NOISE_FACTOR * floor) if math.isfinite(floor) else math.inf

    def adapter(self, method: str, adapter: ModelAdapter) -> ModelAdapter:
        """The adapter `method`'s comparisons run through: the float64 copy's where it decides, else `adapter`."""
        if not self.float64_decides(method):
            return adapter
        assert self.reference is not None
        reference = self.reference
        reference.max_rows = adapter.max_rows  # one example per forward, if the batch mixes
        return reference.with_ones_mask() if adapter.ones_mask else reference

    @property
    def float64_checked(self) -> list[str]:
        """The methods whose verdict the float64 copy decided."""
        return [method for method in self.pairs if self.float64_decides(method)]

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {method: dict(pairs) for method, pairs in self.pairs.items()}


class _Runs:
    """Each input's float32 run and float64 reference, run once (keyed by the caller's name for the input); a
    reference the float64 copy fails on is None (that pair falls back to the batch-composition floor)."""

    def __init__(self, adapter: ModelAdapter, reference: ModelAdapter | None):
        self.adapter, self.reference = adapter, reference
        self.done: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def __call__(self, run: "AuditRun", *, alone: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        key = run.key if alone is None else f"{run.key}/alone{alone}"
        if key not in self.done:
            rows = slice(None) if alone is None else slice(alone, alone + 1)
            tokens, mask = run.tokens[rows], None if run.mask is None else run.mask[rows]
            out = self.adapter(tokens, mask, finite_where=mask)
            ref = None
            if self.reference is not None and alone is None:
                try:
                    ref = self.reference(tokens, mask, finite_where=mask)
                except ModelError:
                    ref = None
            self.done[key] = (out, ref)
        return self.done[key]


@dataclass(frozen=True)
class AuditRun:
    """One input of a comparison: its name (runs of the same name are run once), tokens (rows, pos), an attention
    mask or None, and the positions the comparison reads (None: all)."""

    key: str
    tokens: torch.Tensor
    mask: torch.Tensor | None = None
    positions: torch.Tensor | None = None


def measure_floors(adapter: ModelAdapter, reference: ModelAdapter | None,
                   comparisons: dict[str, list[tuple[AuditRun, AuditRun]]], *, tol: float, tol64: float | None = None) -> Floors:
    """Each method's floor from the pairs of runs it compares (`comparisons[method]`). With a float64
    `reference`, `comparison_floor` of the two runs; without one, the batch-composition floor of the pair's
    longer run: its rows run together against one at a time (the report says this guarantee is weaker).
    A method whose runs the model fails gets no floor here: the method itself reports the failure."""
    floors = Floors(tol=tol, how="float64" if reference is not None else "batch composition", reference=reference,
                    tol64=tol64)
    runs = _Runs(adapter, reference)
    for method, pairs in comparisons.items():
        try:
            _measure_method(floors, runs, method, pairs)
        except ModelError as error:
            floors.pairs.pop(method, None)
            floors.notes.append(f"the {method} floor was not measured: {error}")
    return floors


def _measure_method(floors: Floors, runs: "_Runs", method: str, pairs: list[tuple[AuditRun, AuditRun]]) -> None:
    for a, b in pairs:
        out_a, ref_a = runs(a)
        out_b, ref_b = runs(b)
        label = f"{shape_of(a.tokens)} | {shape_of(b.tokens)}"
        scale = _scale(out_b)
        if ref_a is not None and ref_b is not None:
            floor = comparison_floor(_at(out_a, a), _at(ref_a, a), _at(out_b, b), _at(ref_b, b), scale=scale)
        else:  # no float64 copy, or it failed on these inputs
            floor = _batch_composition(runs, b if b.tokens.shape[1] >= a.tokens.shape[1] else a, scale)
        floors.add(method, label, floor)


def _at(out: torch.Tensor, run: AuditRun) -> torch.Tensor:
    return out if run.positions is None else out[:, run.positions]


def _batch_composition(runs: _Runs, run: AuditRun, scale: float) -> float:
    """How much the run's outputs move when its rows run one at a time: rounding that depends on the batch."""
    together, _ = runs(run)
    alone = torch.cat([runs(run, alone=i)[0] for i in range(run.tokens.shape[0])])
    return float(_change(_at(together, run), _at(alone, run)).max()) / scale
