"""What the redundancy analyses share: the cheap-removal margin, the next-token losses, the prompt-count
check, bootstrap CIs over prompts and the per-head / per-pair frames they return."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from interp.behaviour import next_token_loss
from interp.claims import MIN_PROMPTS_FOR_VERDICT
from interp.data import PromptSet
from interp.heads import Head, head_label
from interp.interventions import ABLATION_KINDS, check_heads
from interp.run import Run, Strategy, as_run
from interp.stats import MIN_PROMPTS, TooFewPrompts, bootstrap

DEFAULT_MARGIN = 0.05  # nats per token: a head is "cheap" to remove if it costs less than this
MARGIN_SOURCE = ("cheap-removal margin in nats/token (toolkit default; Michel et al. 2019 prune heads "
                 "whose removal barely moves the loss)")


# the named next-token losses of earlier versions: Behaviour objects, still callable as (logits, prompts)
lm_loss = next_token_loss("all")  # next-token cross-entropy per prompt at every real prediction
induction_loss = next_token_loss("repeats")  # ... on the repeated copies only (prompts from `repeated_tokens`)


def redundancy_run(model: "nn.Module | Run", prompts: PromptSet | None, where: str, *, method: str = "mean",
                   fast: bool = True, **options: Any) -> Run:
    """The `interp.Run` a redundancy analysis measures: the one given, or one built from (model, prompts, options)
    with `interp.Run`'s defaults, so its behaviour is the one claims and the report measure (`positions="auto"`:
    the repeated positions when the prompts have a repeat structure, `Repeats.query_mask`, else every real position). `fast=False`: one hooked forward
    per ablation (`Strategy.HOOKED`). `method`: the ablation kind, checked here."""
    if method not in ABLATION_KINDS:
        raise ValueError(f"{where}: method={method!r} is not an ablation kind; expected one of {list(ABLATION_KINDS)}.")
    run = as_run(model, prompts, where=where, strategy=None if fast else Strategy.HOOKED, **options)
    _check_n(run.prompts)
    return run


def _check_n(prompts: PromptSet) -> None:
    if len(prompts) < MIN_PROMPTS:
        raise TooFewPrompts(
            f"redundancy analyses need at least {MIN_PROMPTS} prompts for a confidence interval, got {len(prompts)}; "
            f"pass more prompts ({MIN_PROMPTS_FOR_VERDICT} or more for intervals that cover what they say)."
        )


def named(frame: pd.DataFrame, run: Run, method: str) -> pd.DataFrame:
    """`frame` with the columns naming what was measured: `behaviour` (in words, as `Behaviour.describe`) and
    `ablation` (the ablation kind), the same in every row; `attrs` say it too (behaviour, unit, method)."""
    described = run.behaviour.describe(run.prompts)
    frame["behaviour"] = described
    frame["ablation"] = method
    frame.attrs.update(behaviour=described, unit=run.behaviour.unit, method=method)
    return frame


def _ci(values: torch.Tensor, *, seed: int, label: str, chunk: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and bootstrap CI of (prompt, k) values, k columns at a time (bounds the bootstrap's memory)."""
    values = values.double().reshape(values.shape[0], -1)
    parts = [bootstrap(values[:, i : i + chunk], seed=seed, label=f"{label}/{i}") for i in range(0, values.shape[1], chunk)]
    mean, low, high = (torch.cat([p[j] for p in parts]).numpy() for j in range(3))
    return mean, low, high


def _pair_columns(pairs: Sequence[tuple[Head, Head]]) -> dict[str, object]:
    """The columns naming each pair: layer_a, head_a, layer_b, head_b, label_a, label_b."""
    return {
        "layer_a": [a[0] for a, _ in pairs], "head_a": [a[1] for a, _ in pairs],
        "layer_b": [b[0] for _, b in pairs], "head_b": [b[1] for _, b in pairs],
        "label_a": [head_label(a) for a, _ in pairs], "label_b": [head_label(b) for _, b in pairs],
    }


def _with_metrics(columns: dict[str, object], metrics: dict[str, torch.Tensor], n_prompts: int, *, main: str,
                  seed: int) -> pd.DataFrame:
    """`columns` plus each metric's mean and CI over prompts (the main metric's as ci_low / ci_high), n_prompts."""
    for name, values in metrics.items():
        mean, low, high = _ci(values, seed=seed, label=name)
        columns[name] = mean
        columns["ci_low" if name == main else f"{name}_ci_low"] = low
        columns["ci_high" if name == main else f"{name}_ci_high"] = high
    columns["n_prompts"] = n_prompts
    return pd.DataFrame(columns)


def _pairs_frame(pairs: Sequence[tuple[Head, Head]], metrics: dict[str, torch.Tensor], n_prompts: int, *,
                 main: str, seed: int, diagonal: float = np.nan) -> pd.DataFrame:
    """One row per pair: layer_a, head_a, layer_b, head_b, labels, metrics with CIs, n_prompts."""
    frame = _with_metrics(_pair_columns(pairs), metrics, n_prompts, main=main, seed=seed)
    frame.attrs.update(metric=main, diagonal=diagonal)
    return frame


def _heads_frame(heads: Sequence[Head], metrics: dict[str, torch.Tensor], n_prompts: int, *, main: str, seed: int) -> pd.DataFrame:
    """One row per head: layer, head, label, metrics with CIs (main: ci_low / ci_high), n_prompts."""
    columns: dict[str, object] = {"layer": [h[0] for h in heads], "head": [h[1] for h in heads],
                                  "label": [head_label(h) for h in heads]}
    frame = _with_metrics(columns, metrics, n_prompts, main=main, seed=seed)
    frame.attrs["metric"] = main
    return frame


def _all_pairs(heads: Sequence[Head]) -> list[tuple[Head, Head]]:
    return [(heads[i], heads[j]) for i in range(len(heads)) for j in range(i + 1, len(heads))]


def _parse_pairs(model: nn.Module, pairs) -> list[tuple[Head, Head]]:
    out = []
    for pair in pairs:
        try:
            a, b = pair
        except (TypeError, ValueError):
            raise ValueError(f"pair {pair!r} is not two heads, e.g. ((0, 1), (1, 2)) or ('L0H1', 'L1H2').") from None
        a, b = check_heads(model, [a])[0], check_heads(model, [b])[0]
        if a == b:
            raise ValueError(f"pair ({head_label(a)}, {head_label(b)}) names the same head twice; pass two different heads.")
        out.append((a, b))
    if not out:
        raise ValueError("no pairs given; pass pairs=[((l, h), (l, h)), ...] or pairs=k to have k suggested.")
    return out
