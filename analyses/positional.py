"""Positional focus: where each head puts its attention, relative to the query's position.

Per head and prompt, each metric is a mean over the prompt's *scored queries*: real
(non-padding) queries with at least two keys they may attend to (so in a causal model the
first position, which can only attend to itself, is never scored), and for the offset
metrics only queries whose target key exists (a previous token for `prev_token`, a next
token for `next_token`). Positions are indices among real tokens: with left or right
padding the real tokens are contiguous, so "previous" means the previous real token and
"first" means the first real token.

Metrics (weights are the post-softmax `pattern`):
- `prev_token`, `self_token`, `next_token`, `first_token`: weight on the key at offset -1,
  0, +1, and on the first position. `next_token*` is NaN for causal models (no query may
  see its next token).
- `local_window`: weight on keys within `window` positions of the query (|q - k| <= window).
- `mean_distance`: expected |q - k| under the pattern.
- `entropy`: entropy of the pattern divided by log(number of allowed keys): 1 for a uniform
  head, 0 for a one-hot head.
- `*_argmax`: fraction of scored queries whose maximum weight sits on that key (ties split
  evenly among the tied keys, so a uniform head is not credited to any one offset). Voita
  et al. (2019, "Analyzing multi-head self-attention") call a head positional when its
  maximum sits at the same relative offset for at least 90% of queries.

`prev_token` relates to `transformer_lens.head_detector.detect_head(model, tokens,
"previous_token_head", error_measure="mul")` on one unpadded prompt of length T by
detect_head = prev_token * (T - 1) / T: detect_head divides by all T queries, including
the first, which has no previous token. With `exclude_bos=True` detect_head also drops the
first key from numerator and denominator; `prev_token` never does.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import pandas as pd
import torch
from torch import nn

import interp.launch as launch
from interp.analyses.head_types import (
    TIE_TOLERANCE,  # noqa: F401  (re-exported: its home was here)
    HeadType,
    TargetBatch,
    WindowTarget,
    argmax_ties,
    head_types,
)
from interp.capture import BatchContext, MomentAccumulator, PerPromptAccumulator, masked_mean, stream
from interp.data import PromptSet
from interp.heads import head_label
from interp.launch import Device, DType
from interp.stats import head_frame
from interp.validate import check_inputs

POSITIONAL_METRICS = (
    "prev_token", "self_token", "first_token", "next_token", "local_window", "mean_distance", "entropy",
    "prev_token_argmax", "self_token_argmax", "next_token_argmax", "first_token_argmax",
)
CAUSAL_UNDEFINED = ("next_token", "next_token_argmax")
POSITION_NEEDS = ("any", "bidirectional")  # head types measured here; "repeats" types: interp.analyses.induction


def positional_types() -> tuple[HeadType, ...]:
    """The registered head types measured by `focus` (those that need no repeats), built-ins first."""
    return head_types(needs=POSITION_NEEDS)


def positional_metrics() -> tuple[str, ...]:
    """`POSITIONAL_METRICS` plus the columns of head types registered since (`interp.analyses.head_types.register`)."""
    extra = [c for t in positional_types() for c in (t.column, f"{t.column}_argmax" if t.argmax else None)
             if c is not None and c not in POSITIONAL_METRICS]
    return POSITIONAL_METRICS + tuple(extra)


def _check_lengths(prompts: PromptSet, need: int = 2) -> None:
    short = (prompts.real_lengths() < need).nonzero().flatten().tolist()
    if short:
        raise ValueError(
            f"prompts {prompts.row_numbers(short[:5])} have fewer than {need} real tokens; positional metrics need at least {need} "
            "(drop them or use longer prompts)."
        )


class FocusReducer:
    """Reduces one batch's pattern (batch, head, query, key) to {metric: (batch, head)}: the metric
    (and argmax rate) of every positional head type (`positional_types`), mean distance and entropy.

    Keeps a scratch buffer the size of one pattern and reuses it across batches and
    layers: on a CPU, allocating a fresh 16 MB temporary per operation costs more (page
    faults) than the arithmetic. Not thread-safe; one reducer per stream.
    """

    def __init__(self, window: int = 3):
        self.window = window
        self.types = tuple(dataclasses.replace(t, target=WindowTarget(window)) if t.name == "local_window" else t
                           for t in positional_types())
        self._scratch: dict[str, torch.Tensor] = {}

    def _buffer(self, name: str, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        buffer = self._scratch.get(name)
        if buffer is None or buffer.shape != like.shape or buffer.device != like.device:
            buffer = self._scratch[name] = torch.empty(like.shape, dtype=dtype, device=like.device)
        return buffer

    def __call__(self, pattern: torch.Tensor, ctx: BatchContext) -> dict[str, torch.Tensor]:
        pattern = pattern.float()
        batch = TargetBatch.from_context(ctx)
        n_allowed = ctx.allowed.sum(-1, dtype=torch.float32)  # (batch, 1, query)
        scored = n_allowed >= 2  # (batch, 1, query)
        n = pattern.shape[-1]
        position = torch.arange(n, device=pattern.device, dtype=torch.float32)
        scratch = self._buffer("float", pattern, torch.float32)
        queries = {t.name: t.scored_queries(batch)[:, None] for t in self.types}  # (batch, 1, query) each

        table = (position[:, None] - position[None, :]).abs()  # (query, key): |q - k|
        distance = torch.mul(pattern, table, out=scratch).sum(-1)  # (batch, head, query)
        out = {t.column: masked_mean(t.weight(pattern, batch), queries[t.name]) for t in self.types}
        out["mean_distance"] = masked_mean(distance, scored)
        # entropy: -sum p log p, with 0 log 0 = 0 through the clamp; in place in the scratch buffer
        torch.clamp_min(pattern, 1e-30, out=scratch).log_().mul_(pattern)
        entropy = -scratch.sum(-1)  # (batch, head, query)
        out["entropy"] = masked_mean(entropy / n_allowed.clamp(min=2).log(), scored)
        # argmax with ties split evenly, the tie count written into the float scratch
        threshold, n_max = argmax_ties(pattern, scratch)
        for t in self.types:
            if t.argmax:
                out[f"{t.column}_argmax"] = masked_mean(t.hits(pattern, batch, threshold, n_max), queries[t.name])
        order = {name: i for i, name in enumerate(POSITIONAL_METRICS)}
        return dict(sorted(out.items(), key=lambda item: order.get(item[0], len(order))))


def reduce_focus(pattern: torch.Tensor, ctx: BatchContext, window: int = 3) -> dict[str, torch.Tensor]:
    """pattern (batch, head, query, key) -> {metric: (batch, head)}: per-prompt means over scored queries."""
    return FocusReducer(window)(pattern, ctx)


def focus_per_prompt(
    model: nn.Module, prompts: PromptSet, *, window: int = 3, batch_size: int = 32, layers=None,
    device: Device = None, dtype: DType = None, also: Callable[[torch.Tensor, BatchContext], dict] | None = None,
) -> dict[str, torch.Tensor]:
    """{metric: (prompt, layer, head)} for every metric in `positional_metrics()` (see the module docstring).

    Streams in batches and stops after the last layer asked for. On causal models
    `next_token` and `next_token_argmax` are all NaN (kept, so every model gives the same keys).
    `device` / `dtype`: run a moved copy of the model (`interp.launch.move`); metrics stay float32.
    `also`: another pattern reducer run in the same forward (e.g. `interp.analyses.induction.reduce_induction`),
    its metrics added to the result: on a large model the forward is the cost.
    """
    layers, _ = check_inputs("focus_per_prompt", model, prompts, layers=layers)
    if window < 0:
        raise ValueError(f"window={window} must be >= 0 (0 is the query's own position).")
    _check_lengths(prompts)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    focus = FocusReducer(window)
    reduce = focus if also is None else (lambda pattern, ctx: {**focus(pattern, ctx), **also(pattern, ctx)})
    acc = stream(model, prompts, reduce, layers=layers, batch_size=batch_size, accumulator=PerPromptAccumulator())
    return acc.result()


def nan_aware_frame(per_prompt: dict[str, torch.Tensor], *, seed: int = 0, layers=None) -> pd.DataFrame:
    """`interp.stats.head_frame`, but a metric undefined for a whole head (NaN on every prompt)
    gets NaN columns instead of an error. A metric NaN on only some prompts of a head is an error."""
    defined, undefined = {}, {}
    for name, values in per_prompt.items():
        nan = torch.isnan(values)  # (prompt, layer, head)
        if not nan.any():
            defined[name] = values
            continue
        partial = nan.any(0) & ~nan.all(0)
        if partial.any():
            layer, head = partial.nonzero()[0].tolist()
            prompts = nan[:, layer, head].nonzero().flatten().tolist()
            raise ValueError(
                f"metric {name!r} is undefined on prompts {prompts[:5]} but defined on others for {head_label((layer, head))}; "
                "those prompts are too short or fully padded: drop them."
            )
        defined[name] = values.nan_to_num(0.0)
        undefined[name] = nan.all(0)  # (layer, head)
    frame = head_frame(defined, seed=seed)
    for name, mask in undefined.items():
        flat = mask.flatten().numpy()
        for column in (name, f"{name}_ci_low", f"{name}_ci_high"):
            frame.loc[flat, column] = np.nan
    ordered = ["layer", "head"] + [c for name in per_prompt for c in (name, f"{name}_ci_low", f"{name}_ci_high")] + ["n_prompts"]
    frame = frame[ordered]
    if layers is not None:
        frame["layer"] = np.asarray(sorted(set(layers)))[frame["layer"].to_numpy()]
    return frame


def focus(
    model: nn.Module, prompts: PromptSet, *, window: int = 3, batch_size: int = 32, seed: int = 0, layers=None,
    device: Device = None, dtype: DType = None,
) -> pd.DataFrame:
    """One row per (layer, head): each positional metric with a bootstrap CI over prompts, and `n_prompts`.

    Columns: `layer`, `head`, then for each of `POSITIONAL_METRICS` (and of the head types registered
    since, `positional_metrics()`) the value, `_ci_low`, `_ci_high`; `next_token*` columns are NaN for
    causal models. CIs are 95% percentile
    bootstraps over prompts (`interp.stats.head_frame`). `device` / `dtype`: as `focus_per_prompt`.
    """
    layers, seed = check_inputs("focus", model, prompts, layers=layers, seed=seed)
    per_prompt = focus_per_prompt(model, prompts, window=window, batch_size=batch_size, layers=layers,
                                  device=device, dtype=dtype)
    return nan_aware_frame(per_prompt, seed=seed, layers=layers)


def reduce_offsets(pattern: torch.Tensor, ctx: BatchContext) -> dict[str, torch.Tensor]:
    """pattern (batch, head, query, key) -> {"weight": (batch, head, offset)}: each prompt's mean weight
    at each relative offset k - q in [-(T-1), T-1], NaN where no scored query has that offset."""
    batch, n_heads, n, _ = pattern.shape
    position = torch.arange(n, device=pattern.device)
    index = (position[None, :] - position[:, None] + n - 1).flatten()  # (query * key,)
    allowed = ctx.allowed & (ctx.allowed.sum(-1, keepdim=True) >= 2)  # (batch, 1, query, key) scored
    weights = (pattern.float() * allowed).flatten(-2)  # (batch, head, query * key)
    sums = pattern.new_zeros(batch, n_heads, 2 * n - 1, dtype=torch.float32)
    sums.scatter_add_(-1, index.expand(batch, n_heads, -1), weights)
    counts = pattern.new_zeros(batch, 1, 2 * n - 1, dtype=torch.float32)
    counts.scatter_add_(-1, index.expand(batch, 1, -1), allowed.flatten(-2).float())
    return {"weight": sums / counts}  # 0/0 -> NaN: offset absent in that prompt


def offset_profile(
    model: nn.Module, prompts: PromptSet, *, batch_size: int = 32, confidence: float = 0.95, layers=None,
    device: Device = None, dtype: DType = None,
) -> pd.DataFrame:
    """Long frame (layer, head, offset, weight, weight_ci_low, weight_ci_high, n_prompts), for plots.

    `weight` is the mean over prompts of the prompt's mean weight at relative offset
    k - q (negative: earlier keys); offsets no prompt has are absent (positive offsets in
    causal models). Streams into a `MomentAccumulator`, so memory does not depend on the
    number of prompts; the CI is therefore a normal approximation over prompts (not a
    bootstrap; optimistic below ~30 prompts). `device` / `dtype`: run a moved copy of the model
    (`interp.launch.move`); the weights are accumulated in float32 / float64.
    """
    layers, _ = check_inputs("offset_profile", model, prompts, layers=layers)
    _check_lengths(prompts)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    acc = stream(model, prompts, reduce_offsets, layers=layers, batch_size=batch_size, accumulator=MomentAccumulator())
    stats = acc.result(confidence)["weight"]  # each (layer, head, offset)
    n_layers, n_heads, n_offsets = stats["mean"].shape
    layer_ids = np.arange(n_layers) if layers is None else np.asarray(sorted(set(layers)))
    layer, head, offset = np.meshgrid(layer_ids, np.arange(n_heads), np.arange(n_offsets) - (n_offsets - 1) // 2, indexing="ij")
    frame = pd.DataFrame({
        "layer": layer.ravel(), "head": head.ravel(), "offset": offset.ravel(),
        "weight": stats["mean"].numpy().ravel(), "weight_ci_low": stats["ci_low"].numpy().ravel(),
        "weight_ci_high": stats["ci_high"].numpy().ravel(), "n_prompts": stats["n"].numpy().ravel().astype(int),
    })
    return frame[frame["n_prompts"] > 0].reset_index(drop=True)
