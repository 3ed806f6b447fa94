"""The KV-cache contract (`audit(..., kv_cache=True)`): prefill then decode equals the full forward.

For a model that takes `past_key_values` (or `cache`) with `use_cache=True` (the Hugging Face convention: the
calls pass `position_ids`, `cache_position` where the forward takes it, and an attention_mask covering the cache and
the new tokens, as `generate` does) or has a `step(tokens, cache) -> (logits, cache)` method (nanoGPT style): a
prefix of several lengths is prefilled, then the rest decoded one token, or a chunk of several, at a time. Every
position's logits must equal the full forward's (kind `kv_cache`), and inside each call the tokens after a position
must not move it (kind `future`).

Decoding runs other kernels at other shapes than the full forward, and some models keep parts in float32 when cast
(transformers' eager softmax), so the floor is the larger of both runs' float32 deviation from their float64 runs
(and of the full forward's batch composition): never a fixed tolerance.

Origins: a `future` leak through the origin search on the call's own tokens (the earlier calls replayed first); a
`kv_cache` difference by tracing the decode call beside the full forward and comparing the outputs of the ops both
make (`COMPARED_OPS`, the k-th call of each name in each run) at the decoded positions: the first that differs is
where the cached path goes wrong.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from interp.analyses.leakage.contracts.common import (
    ContractFinding,
    ContractResult,
    announce_cost,
    cache_of,
    change,
    float32_twin,
    float64_twin,
    influence,
    judged,
    logits_of,
    parameters,
    replace_tokens,
    sample_tokens,
    scale_of,
    scaled,
    timed,
    user_class,
)
from interp.analyses.leakage.contracts.locate import origin_of_change
from interp.analyses.leakage.fast import FLOAT64_COST
from interp.analyses.leakage.methods import localisation_threshold
from interp.analyses.leakage.origin import _BOUNDARY, Origin, _influence, _op_name, _tensors, _Trace, call_site
from interp.analyses.leakage.types import DEFAULT_TOL
from interp.errors import BadInput

LENGTH = 12  # tokens decoded in all
PREFIXES = (1, 5, 9)  # prefill lengths: one token; shorter and longer than a window of 4
CHUNKS = (1, 3)  # tokens per decode call
COMPARED_OPS = frozenset({"embedding", "linear", "scaled_dot_product_attention", "softmax", "matmul", "bmm", "einsum",
                          "layer_norm", "rms_norm", "flex_attention"})


class Cached:
    """Prefill and decode calls on a model with a cache: `step(tokens, cache)` or a forward taking `past_key_values`
    / `cache` with `use_cache=True`; a BadInput for a model with none."""

    def __init__(self, model: Any):
        names = parameters(model)
        if callable(getattr(model, "step", None)):
            self.style = "step"
        elif "past_key_values" in names or "cache" in names:
            self.style = "cache" if "cache" in names else "past_key_values"  # transformers 5 names it `cache`
        else:
            raise BadInput(f"--kv-cache: {user_class(model).__qualname__} has no KV cache to audit: its forward "
                           "takes no `past_key_values` (or `cache`) with `use_cache=True`, and it has no "
                           "`step(tokens, cache) -> (logits, cache)` method; drop --kv-cache, or audit the model class that decodes")
        self.names = names

    def full(self, model: Any, tokens: torch.Tensor) -> torch.Tensor:
        """The full forward, no cache: (batch, pos, vocab) in float64."""
        with torch.no_grad():
            if self.style == "step" or "use_cache" not in self.names:
                return logits_of(model(tokens)).double()
            return logits_of(model(tokens, use_cache=False)).double()

    def call(self, model: Any, tokens: torch.Tensor, start: int, cache: Any) -> tuple[torch.Tensor, Any]:
        """One prefill or decode call of the new `tokens` (batch, n) at positions start.. : (logits, cache)."""
        with torch.no_grad():
            if self.style == "step":
                logits, cache = model.step(tokens, cache)
                return logits.double(), cache
            batch, n = tokens.shape
            kwargs: dict[str, Any] = {"use_cache": True}
            if "position_ids" in self.names:
                kwargs["position_ids"] = torch.arange(start, start + n)[None].expand(batch, -1)
            if "attention_mask" in self.names:  # the cache and the new tokens, as `generate` passes it
                kwargs["attention_mask"] = torch.ones(batch, start + n, dtype=torch.long)
            if "cache_position" in self.names:
                kwargs["cache_position"] = torch.arange(start, start + n)
            if cache is not None:
                kwargs[self.style] = cache
            output = model(tokens, **kwargs)
            return logits_of(output).double(), cache_of(output)


def plan_calls(length: int, prefix: int, chunk: int) -> list[tuple[int, int]]:
    """(start, end) of each call: the prefill, then chunks to the end."""
    return [(0, prefix)] + [(s, min(s + chunk, length)) for s in range(prefix, length, chunk)]


def decode_calls(cached: Cached, model: Any, rows: torch.Tensor, calls: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
    cache, out = None, []
    for start, end in calls:
        logits, cache = cached.call(model, rows[:, start:end], start, cache)
        out.append(logits)
    return out


def _notes(model: Any, cached: Cached) -> tuple[str, ...]:
    config = getattr(model, "config", None)
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    notes = [f"calls: {'step(tokens, cache)' if cached.style == 'step' else cached.style + ' with use_cache=True'}"]
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) == "dynamic":
        notes.append("rope_type 'dynamic' rescales rotary positions with the length seen, so decoding may differ from "
                     "the full forward by design: a difference is reported, judge it knowing this")
    return tuple(notes)


def audit_kv_cache(model: Any, *, vocab: int, seed: int = 0, progress: bool = False, length: int = LENGTH,
                   prefixes: Sequence[int] = PREFIXES, chunks: Sequence[int] = CHUNKS) -> ContractResult:
    """The KV-cache contract (see the module docstring)."""
    started = time.perf_counter()
    cached = Cached(model)
    prefixes = [p for p in prefixes if p < length]
    plans = {f"prefix {p}, chunk {c}": plan_calls(length, p, c) for p in prefixes for c in chunks}
    n_calls = sum(len(calls) for calls in plans.values())
    generator = torch.Generator().manual_seed(seed)
    tokens = sample_tokens(length, vocab, [], generator)[None]
    replays = sum(k + 1 for calls in plans.values() for k in range(len(calls)))  # the later tokens of each call changed
    announce_cost("kv_cache", f"{len(plans)} prefill / decode plans of {length} tokens, {n_calls} calls each in float64 and "
                  f"float32, then the later tokens of every call changed ({replays} calls)", progress,
                  eta=lambda: scaled(timed(lambda: cached.full(model, tokens)),
                                     (n_calls + replays + 2) * FLOAT64_COST + n_calls + 1))
    single = float32_twin(model)
    model, dtype, notes = float64_twin(model, lambda m: decode_calls(cached, m, tokens, next(iter(plans.values()))))
    full = cached.full(model, tokens)[0]
    scale = scale_of(full)
    other = replace_tokens(tokens[0], range(length), vocab, [], generator)
    floor = float(change(cached.full(model, torch.stack([tokens[0], other]))[0], full, scale).max())
    decoded = {run: decode_calls(cached, model, tokens, calls) for run, calls in plans.items()}
    if dtype == "float64":
        floor = max(floor, float(change(cached.full(single, tokens)[0], full, scale).max()))
        for run, calls in plans.items():
            for logits, logits32 in zip(decoded[run], decode_calls(cached, single, tokens, calls)):
                floor = max(floor, float(change(logits32[0], logits[0], scale).max()))
    findings: list[ContractFinding] = []
    per_run = dict.fromkeys(plans, 0.0)
    for run, calls in plans.items():
        for k, ((start, end), logits) in enumerate(zip(calls, decoded[run])):
            moved = change(logits[0], full[start:end], scale)
            per_run[run] = max(per_run[run], float(moved.max()))
            findings += [ContractFinding("kv_cache", run, start + t, None, float(c), call=k, positions=(start, end))
                         for t, c in enumerate(moved)]
        for k in range(len(calls)):
            found, size = _future_in_call(cached, model, tokens, calls[:k + 1], vocab, generator, scale)
            per_run[run] = max(per_run[run], size)
            findings += [ContractFinding("future", run, q, key, s, call=k, positions=calls[k]) for q, key, s in found]
    result = judged("kv_cache", findings, per_run, floor=floor, dtype=dtype, notes=notes + _notes(model, cached))
    origin = _origin(cached, model, tokens, plans, result, vocab, seed) if result.leaks else None
    return ContractResult(**{**vars(result), "origin": origin, "seconds": time.perf_counter() - started})


def _future_rows(tokens: torch.Tensor, start: int, end: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Row 0 the tokens; row u (1 <= u < end - start) with every token from start + u on changed."""
    rows = [tokens[0]] + [replace_tokens(tokens[0], range(start + u, end), vocab, [], generator)
                          for u in range(1, end - start)]
    return torch.stack(rows)


def _future_in_call(cached: Cached, model: Any, tokens: torch.Tensor, calls, vocab: int, generator, scale: float):
    """Inside the last call: the outputs before start + u must not move when the tokens from start + u on change.
    Returns ([(query, first changed key, influence)], largest influence)."""
    start, end = calls[-1]
    if end - start < 2:
        return [], 0.0
    logits = decode_calls(cached, model, _future_rows(tokens, start, end, vocab, generator), calls)[-1]
    moved = influence(logits, scale)  # (u - 1, call position)
    found = [(start + t, start + u, float(moved[u - 1, t])) for u in range(1, end - start) for t in range(u)]
    return found, max(s for _, _, s in found)


# ---------------------------------------------------------------------------------------------
# Origins
# ---------------------------------------------------------------------------------------------

def _origin(cached: Cached, model: Any, tokens: torch.Tensor, plans: dict, result: ContractResult, vocab: int,
            seed: int) -> Origin | None:
    worst = result.worst()
    assert worst is not None
    calls = plans[worst.run]
    index = next(k for k, (start, end) in enumerate(calls) if start <= worst.query < end)
    if worst.kind == "future":
        assert worst.key is not None
        return _future_origin(cached, model, tokens, calls[:index + 1], worst, vocab, seed)
    return _divergence(cached, model, tokens, calls[:index + 1], worst)


def _future_origin(cached: Cached, model: Any, tokens: torch.Tensor, calls, worst: ContractFinding, vocab: int,
                   seed: int) -> Origin | None:
    """The origin search on the last call's tokens, the earlier calls replayed into a fresh cache first."""
    start, end = calls[-1]
    assert worst.key is not None
    generator = torch.Generator().manual_seed(seed)
    variant = tokens.clone()
    variant[0, worst.key:end] = replace_tokens(tokens[0], range(worst.key, end), vocab, [], generator)[worst.key:end]

    def last_call(chunk: torch.Tensor, **ignored: Any) -> torch.Tensor:
        state: Any = None
        for s, e in calls[:-1]:
            _, state = cached.call(model, tokens[:, s:e], s, state)
        return cached.call(model, chunk, start, state)[0]

    keep = torch.arange(worst.key - start)
    return origin_of_change(last_call, tokens[:, start:end], variant[:, start:end], keep, kind="future",
                            leak=worst.influence, words=f"now depends on position {worst.key}, later in the same call")


def _record(run, keep_outputs) -> list[tuple[str, Any, list[torch.Tensor]]]:
    """Every op of `run()` in COMPARED_OPS: (name, frame, outputs), in order."""
    seen: list[tuple[str, Any, list[torch.Tensor]]] = []

    def visit(index: int, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        name = _op_name(func)
        if name in COMPARED_OPS:
            seen.append((name, call_site(sys._getframe(1)) if keep_outputs else None,
                         [t.detach().clone() for t in _tensors(out)]))

    _BOUNDARY.append(sys._getframe())
    try:
        with torch.no_grad(), _Trace(visit):
            run()
    finally:
        _BOUNDARY.pop()
    return seen


def _divergence(cached: Cached, model: Any, tokens: torch.Tensor, calls, worst: ContractFinding) -> Origin | None:
    """The first op of the decode call whose output at the decoded positions differs from the same op (the k-th of
    its name) of the full forward at the same positions."""
    start, end = calls[-1]
    length = tokens.shape[1]
    reference = _record(lambda: cached.full(model, tokens[:, :end]), keep_outputs=False)
    cache = None
    for s, e in calls[:-1]:
        _, cache = cached.call(model, tokens[:, s:e], s, cache)
    mine = _record(lambda: cached.call(model, tokens[:, start:end], start, cache), keep_outputs=True)
    counts: dict[str, int] = {}
    threshold = localisation_threshold(worst.influence, DEFAULT_TOL)
    by_name: dict[str, list[list[torch.Tensor]]] = {}
    for name, _, outputs in reference:
        by_name.setdefault(name, []).append(outputs)
    for name, frames, outputs in mine:
        k = counts[name] = counts.get(name, -1) + 1
        if k >= len(by_name.get(name, [])):
            continue
        for ours, theirs in zip(outputs, by_name[name][k]):
            value = _sliced_change(ours, theirs, start, end, min(end, length))
            if value is not None and value > threshold:
                site, user = frames
                call = "the prefill's" if len(calls) == 1 else f"decode call {len(calls) - 1}'s"
                cached_words = "" if len(calls) == 1 else f", {start} cached before it"
                return Origin("kv_cache", site, name, f"{call} {name} at positions {start}..{end - 1}{cached_words} "
                              f"differs from the full forward's by {value:.3g} of its scale", value, None, user)
    return None


def _sliced_change(ours: torch.Tensor, theirs: torch.Tensor, start: int, end: int, n_full: int) -> float | None:
    """The change of a decode call's op output against the full forward's at the same positions: the full output's
    positional axis (size n_full where ours has end - start) sliced to start..end; None when the shapes do not pair."""
    if ours.ndim != theirs.ndim or not ours.is_floating_point():
        return None
    n_new = end - start
    axes = [a for a in range(ours.ndim) if ours.shape[a] == n_new and theirs.shape[a] == n_full]
    if not axes or any(ours.shape[a] != theirs.shape[a] for a in range(ours.ndim) if a not in axes):
        return None
    sliced = theirs
    for axis in axes:  # queries (and, in a square score, keys): the decoded positions
        sliced = sliced.narrow(axis, start, n_new)
    if sliced.shape != ours.shape:
        return None
    return _influence(sliced, ours)
