"""The window contract (`audit(..., window=W)`): a layer declared to see W keys sees no more.

W counts the keys a query sees, itself included: key j is visible from query i iff i - W < j <= i (the convention of
`transformers`' `sliding_window` and nanoGPT-style `window_size`). The layers' windowed masks composed give, for each
output i, the tokens j that can move it (`reach`): a token out of reach must move it by nothing beyond the floor (kind
`window`; a later token, `future`), and the gradient of each output with respect to every input embedding must be
exactly zero there (through a masked softmax; where it cannot run, a note says so). With every layer windowed, a token
more than L (W - 1) positions back is out of reach; with a full-attention layer, every earlier token is within reach
and only causality is checked at the output, said in a note. Each token is changed, one at a time, in prompts shorter
and longer than the window. Where the attention weights can be observed (`layerwise`: a hooked model, a Hugging Face
model under eager), each windowed layer's weights outside its window must be zero too, which names the layer and head
and still speaks behind a full-attention layer.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
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
    timed,
    user_class,
)
from interp.analyses.leakage.contracts.layerwise import (
    Observed,
    layer_findings,
    layer_words,
    observe_weights,
    windows_of_layers,
)
from interp.analyses.leakage.contracts.locate import origin_of_change, origin_of_layer
from interp.analyses.leakage.fast import FLOAT64_COST
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
        raise BadInput(f"{user_class(model).__qualname__} declares no sliding window (config `sliding_window` / "
                       "`layer_types`, `window_size`): give the window its layers must keep (--window W, "
                       "audit(window=W))")
    size = max(w for w in layer_windows if w is not None)
    span = sum(w - 1 for w in layer_windows if w is not None) if all(layer_windows) else None
    lengths = window_lengths(size, span, max_len)
    announce_cost("window", f"prompts of {lengths} tokens, each token changed once: {sum(lengths) + len(lengths)} rows, "
                  f"{sum(lengths)} backward passes and {len(lengths)} forwards observing each layer's weights, plus one "
                  "float64 copy", progress, eta=lambda: _eta(model, lengths))
    model, dtype, notes = float64_twin(model, lambda m: call_rows(m, torch.zeros(1, 2, dtype=torch.long), {}))
    measured = _measure(model, lengths, layer_windows, vocab, torch.Generator().manual_seed(seed))
    notes += measured.notes
    for length in lengths:
        if span is not None and length <= span + 1:
            notes += (f"length {length}: no earlier token is out of reach at the output ({len(layer_windows)} layers of "
                      f"W - 1 = {size - 1} reach {span} back): only causality is checked there",)
    if span is None:
        notes += ("a full-attention layer reaches every earlier token, so only causality is checked at the output",)
    by_layer = any(length > min(w for w in layer_windows if w) for length in measured.observed)
    applicable = (span is not None and max(lengths) > span + 1) or by_layer
    if not applicable:
        notes += (("not applicable: a full-attention layer hides the windows from the outputs" if span is None else
                   f"not applicable: no prompt is longer than L (W - 1) + 1 = {span + 1} tokens (max_len {max_len})")
                  + ", and no layer's weights were observed on a prompt longer than its window",)
    result = judged("window", measured.findings, measured.per_run, floor=measured.floor, dtype=dtype,
                    applicable=applicable, notes=notes + (f"windows per layer: {layer_windows}",))
    origin = _origin(model, result, measured, layer_windows) if result.leaks else None
    return ContractResult(**{**vars(result), "origin": origin, "seconds": time.perf_counter() - started})


def _eta(model: Any, lengths: Sequence[int]) -> float | None:
    """Per length: the batch of changed rows, a backward pass (about two forwards) per token and the weights' forward,
    each timed on one forward of its shape, in float64."""
    total = 0.0
    for length in lengths:
        batch = timed(partial(call_rows, model, torch.zeros(length + 1, length, dtype=torch.long), {}))
        single = timed(partial(call_rows, model, torch.zeros(1, length, dtype=torch.long), {}))
        if batch is None or single is None:
            return None
        total += (batch + (3 * length + 2) * single) * FLOAT64_COST
    return total


def window_lengths(size: int, span: int | None, max_len: int | None) -> list[int]:
    """A prompt shorter than the window and one past the reach of the layers (or 3 W), both within max_len."""
    longest = (span + 2) if span is not None else size + 2
    cap = max_len or DEFAULT_WINDOW_LEN
    return sorted({max(2, min(size - 1, 3, cap)), min(max(3 * size, longest), cap)})


@dataclass
class _Measured:
    """What the window contract measured: the candidate findings, each run's largest change, the floor, each run's
    rows and reach (for the origin), the weights observed per run, and what could not be measured."""

    findings: list[ContractFinding] = field(default_factory=list)
    per_run: dict[str, float] = field(default_factory=dict)
    floor: float = 0.0
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    observed: dict[int, Observed] = field(default_factory=dict)  # length -> each layer's weights
    notes: tuple[str, ...] = ()

    def note(self, why: str | None) -> None:
        if why and why not in self.notes:
            self.notes += (why,)


def _measure(model: Any, lengths: Sequence[int], layer_windows: Sequence[int | None], vocab: int,
             generator: torch.Generator) -> _Measured:
    """Each token of each prompt changed once (the outputs out of reach must not move), the gradient (exactly zero out
    of reach) and, where observable, each windowed layer's weights (zero outside its window)."""
    measured = _Measured()
    for length in lengths:
        run = f"length {length}"
        tokens = sample_tokens(length, vocab, [], generator)
        rows = torch.stack([tokens] + [replace_tokens(tokens, [j], vocab, [], generator) for j in range(length)])
        logits = call_rows(model, rows, {})
        scale = scale_of(logits[0])
        measured.floor = max(measured.floor, float(change(call_rows(model, rows[:1], {})[0], logits[0], scale).max()))
        moved, reached = influence(logits, scale), reach(length, layer_windows)
        measured.pairs[run] = (rows, reached)
        found = [ContractFinding("future" if j > i else "window", run, i, j, float(moved[j, i]))
                 for j in range(length) for i in range(length) if not reached[i, j]]
        gradient, why = gradient_findings(model, tokens, reached, run, vocab)
        measured.note(why)
        observed, why = observe_weights(model, tokens[None])
        measured.note(why)
        layered: list[ContractFinding] = []
        if observed is not None:
            layered, why = layer_findings(observed, layer_windows, run)
            measured.note(why)
            if why is None:
                measured.observed[length] = observed
        measured.findings += found + gradient + layered
        measured.per_run[run] = max([0.0] + [f.influence for f in found + gradient + layered])
    if measured.observed:
        where = next(iter(measured.observed.values()))
        measured.note(f"each windowed layer's attention weights checked ({len(where)} layers observed: "
                      f"{', '.join(name for name, _ in where[:2])}{' ...' if len(where) > 2 else ''})")
    return measured


def _origin(model: Any, result: ContractResult, measured: _Measured, layer_windows: Sequence[int | None]):
    """The line where a token out of reach comes to move an output (the origin search), with the first layer whose
    weights broke its window in words; where only a layer's weights show it, that layer's attention op."""
    at_output = [f for f in result.findings if f.layer is None]
    by_layer = sorted((f for f in result.findings if f.layer is not None), key=lambda f: (f.layer, -f.influence))
    origin = None
    if at_output:
        worst = max(at_output, key=lambda f: f.influence)
        assert worst.key is not None
        rows, reached = measured.pairs[worst.run]
        keep = (~reached[:, worst.key]).nonzero().flatten()
        origin = origin_of_change(model, rows[:1], rows[1 + worst.key][None], keep, kind=worst.kind,
                                  leak=worst.influence, words=f"now depends on position {worst.key}, out of its window")
    if not by_layer:
        return origin
    first = by_layer[0]
    assert first.key is not None and first.layer is not None
    length = int(first.run.split()[-1])
    observed = measured.observed[length]
    windows = windows_of_layers(observed, layer_windows) or []
    words = layer_words(first, observed, windows[first.layer] if first.layer < len(windows) else None)
    if origin is not None:
        return replace(origin, detail=f"{origin.detail}; {words}")
    rows, _ = measured.pairs[first.run]
    return origin_of_layer(model, rows[:1], first.layer, len(observed), first.query, first.key, kind=first.kind,
                           words=words)
