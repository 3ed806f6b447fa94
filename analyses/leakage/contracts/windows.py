"""The window contract (`audit(..., window=W)`): a layer declared to see W keys sees no more.

W counts the keys a query sees, itself included: key j is visible from query i iff i - W < j <= i (the convention of
`transformers`' `sliding_window` and nanoGPT-style `window_size`). The layers' windowed masks composed give, for each
output i, the tokens j that can move it (`reach`): a token out of reach must move it by nothing beyond the floor (kind
`window`; a later token, `future`), and the gradient of each output with respect to every input embedding must be
exactly zero there (through a masked softmax; where it cannot run, a note says so). With every layer windowed, a token more than L (W - 1) positions back is out of
reach; with a full-attention layer, every earlier token is within reach and only causality is checked at the output,
said in a note. Each token is changed, one at a time, in prompts shorter and longer than the window.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from interp.analyses.leakage.contracts.common import (
    ContractFinding,
    ContractResult,
    announce_cost,
    call_rows,
    change,
    float64_twin,
    influence,
    judged,
    logits_of,
    replace_tokens,
    sample_tokens,
    scale_of,
)
from interp.analyses.leakage.contracts.locate import origin_of_change
from interp.analyses.leakage.methods import _embedding_leaf, embedding_module
from interp.errors import BadInput

DEFAULT_WINDOW_LEN = 64  # the longest prompt without max_len: long enough for the zoo's W = 4 over 2 layers


def declared_windows(model: Any, window: int | None = None) -> list[int | None]:
    """Each layer's window: the config's `sliding_window` with `layer_types` (transformers) or `window_size`
    (nanoGPT style), `window` (the caller's W) overriding the size; None for a full-attention layer."""
    config = getattr(model, "config", None)
    declared = getattr(config, "sliding_window", None) or getattr(config, "window_size", None)
    size = window if window is not None else declared
    n_layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None) or 1
    types = getattr(config, "layer_types", None) or ["sliding_attention" if size else "full_attention"] * n_layers
    if window is not None and "sliding_attention" not in types:  # the caller declares every layer windowed
        types = ["sliding_attention"] * len(types)
    return [size if kind == "sliding_attention" else None for kind in types]


def declared_chunk(model: Any) -> int | None:
    """The chunk of chunked local attention (transformers' `attention_chunk_size`), or None."""
    return getattr(getattr(model, "config", None), "attention_chunk_size", None)


def same_chunk(length: int, chunk: int | None) -> torch.Tensor:
    """(query, key) bool: both positions in the same chunk (everywhere True without chunks)."""
    index = torch.arange(length) // (chunk or length)
    return index[:, None] == index[None, :]


def reach(length: int, layer_windows: Sequence[int | None]) -> torch.Tensor:
    """(query, key) bool: key j can move output i through the layers' causal (windowed) masks, composed."""
    index = torch.arange(length)
    distance = index[:, None] - index[None, :]  # i - j
    reached = torch.eye(length, dtype=torch.bool)
    for size in layer_windows:
        mask = (distance >= 0) & (distance < (size if size is not None else length))
        reached = (mask.double() @ reached.double()) > 0
    return reached


def gradient_findings(model: Any, tokens: torch.Tensor, reached: torch.Tensor, run: str,
                      vocab: int) -> tuple[list[ContractFinding], str | None]:
    """The Jacobian of each output (a random direction of its logits) with respect to every input embedding: exactly
    zero, through a masked softmax, at every position out of reach. Each (query, key) entry relative to the query's
    largest; a note instead when the gradient cannot run (no embedding found, a kernel without a backward)."""
    embed = embedding_module(model, vocab)
    if embed is None:
        return [], "gradient not run: no input embedding found (the perturbations decided)"
    length = tokens.shape[0]
    generator = torch.Generator().manual_seed(length)
    found: list[ContractFinding] = []
    try:
        with torch.enable_grad(), _embedding_leaf(embed) as leaves:
            logits = logits_of(model(tokens[None]))  # (1, pos, vocab)
            if not leaves or tuple(leaves[0].shape[:2]) != (1, length):
                return [], "gradient not run: the embedding output is not (batch, pos, width) (the perturbations decided)"
            direction = torch.randn(logits.shape[-1], generator=generator).to(logits.dtype)
            for i in range(length):
                (grad,) = torch.autograd.grad((logits[0, i] * direction).sum(), leaves[0], retain_graph=True)
                size = grad[0].abs().amax(-1).double()  # (pos,)
                top = float(size.max()) or 1.0
                found += [ContractFinding("future" if j > i else "window", run, i, j, float(size[j]) / top)
                          for j in range(length) if not reached[i, j]]
    except (RuntimeError, NotImplementedError) as error:  # FlexAttention has no CPU backward: the other method decides
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:120]
        return [], f"gradient not run ({type(error).__name__}: {first}): the perturbations decided"
    return found, None


def check_window(window: Any) -> None:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise BadInput(f"window={window!r} must be a whole number of keys, at least 1: W counts the keys a query sees, "
                       "itself included (key j is visible from query i iff i - W < j <= i), e.g. window=4096 for "
                       "Mistral-7B")


def audit_windows(model: Any, *, vocab: int, window: int | None = None, seed: int = 0, progress: bool = False,
                  max_len: int | None = None) -> ContractResult:
    """The window contract (see the module docstring); `window` None reads the model's declaration."""
    started = time.perf_counter()
    if window is not None:
        check_window(window)
    layer_windows = declared_windows(model, window)
    if not any(layer_windows):
        raise BadInput(f"{type(model).__name__} declares no sliding window (config `sliding_window` / `layer_types`, "
                       "`window_size`): give the window its layers must keep (--window W, audit(window=W))")
    size = max(w for w in layer_windows if w is not None)
    span = sum(w - 1 for w in layer_windows if w is not None) if all(layer_windows) else None
    longest = (span + 2) if span is not None else size + 2
    cap = max_len or DEFAULT_WINDOW_LEN
    lengths = sorted({max(2, min(size - 1, 3, cap)), min(max(3 * size, longest), cap)})
    announce_cost("window", f"prompts of {lengths} tokens, each token changed once: {sum(lengths) + len(lengths)} rows, "
             f"and {sum(lengths)} backward passes, plus one float64 copy", progress)
    generator = torch.Generator().manual_seed(seed)
    model, dtype, notes = float64_twin(model, lambda m: call_rows(m, torch.zeros(1, 2, dtype=torch.long), {}))
    findings: list[ContractFinding] = []
    floor, per_run, pairs = 0.0, {}, {}
    for length in lengths:
        run = f"length {length}"
        tokens = sample_tokens(length, vocab, [], generator)
        rows = torch.stack([tokens] + [replace_tokens(tokens, [j], vocab, [], generator) for j in range(length)])
        logits = call_rows(model, rows, {})
        scale = scale_of(logits[0])
        floor = max(floor, float(change(call_rows(model, rows[:1], {})[0], logits[0], scale).max()))
        moved, reached = influence(logits, scale), reach(length, layer_windows)
        per_run[run], pairs[run] = 0.0, (rows, reached)
        for j in range(length):
            for i in range(length):
                if not reached[i, j]:
                    per_run[run] = max(per_run[run], float(moved[j, i]))
                    findings.append(ContractFinding("future" if j > i else "window", run, i, j, float(moved[j, i])))
        found, why = gradient_findings(model, tokens, reached, run, vocab)
        findings += found
        per_run[run] = max([per_run[run]] + [f.influence for f in found])
        notes += (why,) if why and why not in notes else ()
        if span is not None and length <= span + 1:
            notes += (f"{run}: no earlier token is out of reach ({len(layer_windows)} layers of W - 1 = {size - 1} "
                      f"reach {span} back): only causality is checked",)
    if span is None:
        notes += ("a full-attention layer reaches every earlier token, so only causality is checked at the output",)
    applicable = span is not None and max(lengths) > span + 1
    if span is not None and not applicable:
        notes += (f"not applicable: no prompt is longer than L (W - 1) + 1 = {span + 1} tokens (max_len {max_len})",)
    result = judged("window", findings, per_run, floor=floor, dtype=dtype, applicable=applicable,
                    notes=notes + (f"windows per layer: {layer_windows}",))
    origin = None
    if result.leaks:
        worst = result.worst()
        assert worst is not None and worst.key is not None
        rows, reached = pairs[worst.run]
        keep = (~reached[:, worst.key]).nonzero().flatten()
        origin = origin_of_change(model, rows[:1], rows[1 + worst.key][None], keep, kind=worst.kind,
                                  leak=worst.influence, words=f"now depends on position {worst.key}, out of its window")
    return ContractResult(**{**vars(result), "origin": origin, "seconds": time.perf_counter() - started})
