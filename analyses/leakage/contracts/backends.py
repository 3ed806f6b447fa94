"""The back-end contract (`audit(..., attn_impls=[...])`): the same model under each attention implementation
(the strings `attn_implementation` takes: eager, sdpa, flex_attention) gives the same outputs as the first one
(kind `backend`), and each is causal and keeps its declared windows (kinds `future`, `window`).

The model switches with transformers' `set_attn_implementation(name)` or its own `config.attn_impl`. An
implementation that cannot run (the model refuses it, its kernel is unavailable on this device) is reported in the
notes and left out: never a failure of the model, nor a silent skip. FlexAttention runs unfused (torch's compiler
stance "force_eager") so that it takes float64 and no compilation; `compiled=True` runs it as the model calls it.
The floor is the largest of each implementation's batch composition and float32 deviation from its float64 run.

Origin of a disagreement: both implementations' forwards traced side by side, each op keyed by its line of model
code, name and occurrence; at the first such op both make whose outputs differ, the origin is the last line before it
that only the diverging implementation ran (its attention call), or that op itself.
"""
from __future__ import annotations

import contextlib
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Iterator

import torch

from interp.analyses.leakage.contracts.common import (
    ContractFinding,
    ContractResult,
    announce_cost,
    call_rows,
    change,
    float32_twin,
    float64_twin,
    influence,
    judged,
    replace_tokens,
    sample_tokens,
    scale_of,
    scaled,
    timed,
    user_class,
)
from interp.analyses.leakage.contracts.locate import origin_of_change
from interp.analyses.leakage.contracts.windows import declared_windows, reach
from interp.analyses.leakage.fast import FLOAT64_COST
from interp.analyses.leakage.methods import localisation_threshold
from interp.analyses.leakage.origin import _BOUNDARY, Origin, _influence, _op_name, _tensors, _Trace, call_site
from interp.analyses.leakage.types import DEFAULT_TOL
from interp.errors import BadInput

IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")
LENGTH = 12
MAX_TRACE_BYTES = 256 * 2**20  # the reference run's op outputs kept for the origin search


def has_switch(model: Any) -> bool:
    return callable(getattr(model, "set_attn_implementation", None)) or hasattr(getattr(model, "config", None),
                                                                               "attn_impl")


def set_implementation(model: Any, implementation: str) -> None:
    """Switch the model's attention implementation: `set_attn_implementation`, or a config's `attn_impl`."""
    if callable(getattr(model, "set_attn_implementation", None)):
        model.set_attn_implementation(implementation)
    elif hasattr(getattr(model, "config", None), "attn_impl"):
        model.config.attn_impl = implementation
    else:
        raise BadInput(f"--attn-impls: {user_class(model).__qualname__} has no attention implementation switch "
                       "(transformers' set_attn_implementation, or a config's attn_impl); drop --attn-impls")


def check_implementations(model: Any, attn_impls: Any) -> None:
    if not has_switch(model):
        set_implementation(model, "eager")  # raises the BadInput
    names = IMPLEMENTATIONS if attn_impls == "all" else tuple(attn_impls)
    unknown = [n for n in names if n not in IMPLEMENTATIONS]
    if unknown or not names:
        raise BadInput(f"attn_impls={attn_impls!r}: give implementations among {', '.join(IMPLEMENTATIONS)} (or 'all')")


@contextlib.contextmanager
def flex_stance(compiled: bool) -> Iterator[None]:
    """FlexAttention unfused unless `compiled` (torch's compiler stance "force_eager")."""
    if compiled:
        yield
        return
    with torch.compiler.set_stance("force_eager"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")  # unfused on purpose
        yield


def _current(model: Any) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) or getattr(config, "attn_implementation", None) or \
        getattr(config, "attn_impl", None)


def usable(model: Any, names: Sequence[str], probe: torch.Tensor) -> tuple[list[str], list[str]]:
    """The implementations the model runs (a forward of `probe`), and a note for each it cannot."""
    runs, notes = [], []
    for name in names:
        try:
            set_implementation(model, name)
            call_rows(model, probe, {})
        except BadInput:
            raise
        except Exception as error:  # the model refuses it, or its kernel cannot run here: reported, not a leak
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
            notes.append(f"{name} cannot run on this model here ({type(error).__name__}: {first}): not audited")
            continue
        runs.append(name)
    return runs, notes


def audit_backends(model: Any, *, vocab: int, attn_impls: Sequence[str] | str = "all", seed: int = 0,
                   progress: bool = False, compiled: bool = False, length: int = LENGTH) -> ContractResult:
    """The back-end contract (see the module docstring)."""
    started = time.perf_counter()
    check_implementations(model, attn_impls)
    names = list(IMPLEMENTATIONS if attn_impls == "all" else attn_impls)
    original = _current(model)
    generator = torch.Generator().manual_seed(seed)
    tokens = sample_tokens(length, vocab, [], generator)
    rows = torch.stack([tokens] + [replace_tokens(tokens, range(u, length), vocab, [], generator)
                                   for u in range(1, length)])
    announce_cost("backend", f"{len(names)} implementations ({', '.join(names)}) x {len(rows)} rows of {length} tokens, in "
                  "float64 and float32" + ("" if compiled else "; FlexAttention unfused") + " (its first call in a "
                  "process adds seconds)" * ("flex_attention" in names), progress,
                  eta=lambda: scaled(timed(lambda: call_rows(model, rows, {})), len(names) * (FLOAT64_COST + 1)))
    with flex_stance(compiled):
        try:
            result = _measure(model, names, rows, tokens, vocab, seed)
        finally:
            if original in IMPLEMENTATIONS:
                set_implementation(model, original)
    return ContractResult(**{**vars(result), "seconds": time.perf_counter() - started})


def _measure(model: Any, names: list[str], rows: torch.Tensor, tokens: torch.Tensor, vocab: int,
             seed: int) -> ContractResult:
    single = float32_twin(model)
    ran, notes = usable(single, names, rows[:1])
    def probe(copy: Any) -> None:
        for name in ran:
            set_implementation(copy, name)
            call_rows(copy, rows[:1], {})

    model, dtype, cast_notes = float64_twin(model, probe)
    notes += list(cast_notes)
    length = rows.shape[1]
    layer_windows = declared_windows(model)
    reached = reach(length, layer_windows)
    findings: list[ContractFinding] = []
    floor, per_run, first_rows = 0.0, {}, {}
    for name in ran:
        set_implementation(model, name)
        logits = call_rows(model, rows, {})
        first_rows[name] = logits[0]
        scale = scale_of(logits[0])
        floor = max(floor, float(change(call_rows(model, rows[:1], {})[0], logits[0], scale).max()))
        if dtype == "float64":  # what the implementation's kernels keep in float32 shows in its float32 deviation
            set_implementation(single, name)
            floor = max(floor, float(change(call_rows(single, rows[:1], {})[0], logits[0], scale).max()))
        moved = influence(logits, scale)  # (cut - 1, pos): tokens from `cut` on changed
        per_run[name] = max(float(moved[u - 1, :u].max()) for u in range(1, length))
        findings += [ContractFinding("future", name, t, u, float(moved[u - 1, t])) for u in range(1, length)
                     for t in range(u)]
        if any(layer_windows):
            findings += _window_findings(model, tokens, reached, vocab, seed, name, per_run)
    if ran:
        reference = first_rows[ran[0]]
        for name in ran[1:]:
            run = f"{name} vs {ran[0]}"
            moved = change(first_rows[name], reference, scale_of(reference))
            per_run[run] = float(moved.max())
            findings += [ContractFinding("backend", run, t, None, float(c)) for t, c in enumerate(moved)]
    if len(ran) < 2:
        notes.append(f"only {', '.join(ran) or 'no implementation'} ran: nothing to compare")
    result = judged("backend", findings, per_run, floor=floor, dtype=dtype, applicable=len(ran) >= 2,
                    notes=notes + [f"implementations compared with {ran[0]}: {', '.join(ran[1:])}" if ran else
                                   "no implementation ran"])
    origin = None
    if result.leaks:
        origin, note = _located(model, result, rows, reached, vocab, seed, ran)
        result = replace(result, notes=result.notes + ((note,) if note else ()))
    return ContractResult(**{**vars(result), "origin": origin})


def _located(model: Any, result: ContractResult, rows: torch.Tensor, reached: torch.Tensor, vocab: int, seed: int,
             ran: list[str]) -> tuple[Origin | None, str | None]:
    """The origin; where the op trace cannot enter a compiled kernel (dynamo under the trace's TorchFunctionMode), the
    search again with FlexAttention unfused, which runs the model's own mask code, said in a note."""
    try:
        return _origin(model, result, rows, reached, vocab, seed, ran), None
    except Exception as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        failed = f"the op trace failed under the compiled kernel ({type(error).__name__}: {first})"
    try:
        with flex_stance(False):
            origin = _origin(model, result, rows, reached, vocab, seed, ran)
    except Exception:
        return None, f"origin not located: {failed}; the verdict stands"
    if origin is None:
        return None, f"origin not located: {failed}, and unfused the leak does not show; the verdict stands"
    return origin, f"origin located with FlexAttention unfused: {failed}"


def _window_findings(model: Any, tokens: torch.Tensor, reached: torch.Tensor, vocab: int, seed: int, name: str,
                     per_run: dict[str, float]) -> list[ContractFinding]:
    """Each token changed alone: an output out of its reach through the windows must not move (kind `window`)."""
    generator = torch.Generator().manual_seed(seed + 1)
    length = tokens.shape[0]
    rows = torch.stack([tokens] + [replace_tokens(tokens, [j], vocab, [], generator) for j in range(length)])
    logits = call_rows(model, rows, {})
    moved = influence(logits, scale_of(logits[0]))  # (key, query)
    found = [ContractFinding("window", name, i, j, float(moved[j, i])) for j in range(length) for i in range(j + 1, length)
             if not reached[i, j]]
    per_run[name] = max([per_run[name]] + [f.influence for f in found])
    return found


def _origin(model: Any, result: ContractResult, rows: torch.Tensor, reached: torch.Tensor, vocab: int, seed: int,
            ran: list[str]) -> Origin | None:
    worst = result.worst()
    assert worst is not None
    if worst.kind == "backend":
        name = worst.run.split(" vs ")[0]
        return divergence(model, rows[:1], ran[0], name, worst.influence)
    set_implementation(model, worst.run)
    assert worst.key is not None
    if worst.kind == "future":
        keep = torch.arange(worst.key)
        variant = rows[worst.key][None]
        words = f"now depends on position {worst.key} or later under {worst.run}"
    else:
        generator = torch.Generator().manual_seed(seed + 1)
        variant = replace_tokens(rows[0], [worst.key], vocab, [], generator)[None]
        keep = (~reached[:, worst.key]).nonzero().flatten()
        words = f"now depends on position {worst.key}, out of its window under {worst.run}"
    return origin_of_change(model, rows[:1], variant, keep, kind=worst.kind, leak=worst.influence, words=words)


def _trace(model: Any, tokens: torch.Tensor, *, keep_outputs: bool) -> list[tuple[tuple, Any, list[torch.Tensor]]]:
    """Every op of one forward: ((file, line, name, occurrence), (site, user), float outputs)."""
    seen: list[tuple[tuple, Any, list[torch.Tensor]]] = []
    counts: dict[tuple, int] = {}
    used = 0

    def visit(index: int, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        nonlocal used
        site, user = call_site(sys._getframe(1))
        where = site or user
        key = (None if where is None else where.file, None if where is None else where.line, _op_name(func))
        counts[key] = counts.get(key, -1) + 1
        outputs = [t.detach().clone() for t in _tensors(out) if t.is_floating_point()] if keep_outputs else []
        used += sum(t.numel() * t.element_size() for t in outputs)
        seen.append(((*key, counts[key]), (site, user), outputs if used <= MAX_TRACE_BYTES else []))

    _BOUNDARY.append(sys._getframe())
    try:
        with torch.no_grad(), _Trace(visit):
            model(tokens)
    finally:
        _BOUNDARY.pop()
    return seen


def divergence(model: Any, tokens: torch.Tensor, reference: str, other: str, leak: float) -> Origin | None:
    """Where `other` first departs from `reference` (see the module docstring)."""
    set_implementation(model, reference)
    theirs = {key: outputs for key, _, outputs in _trace(model, tokens, keep_outputs=True)}
    set_implementation(model, other)
    threshold = localisation_threshold(leak, DEFAULT_TOL)
    own_line = None
    for key, frames, outputs in _trace(model, tokens, keep_outputs=True):
        if key not in theirs:
            if frames[0] is not None or frames[1] is not None:
                own_line = (key, frames)
            continue
        for ours, their in zip(outputs, theirs[key]):
            value = _influence(their, ours) if ours.shape == their.shape else None
            if value is not None and value > threshold:
                (_, _, name, _), (site, user) = own_line if own_line is not None else (key, frames)
                return Origin("backend", site, name, f"{other} departs from {reference} here: the next op both run "
                              f"({key[2]}) differs by {value:.3g} of its scale", value, None, user)
    return None
