"""`propose` claims for every head from the metrics, and `scan`: propose on one half of the prompts,
test on the other."""
from __future__ import annotations

from typing import Iterable, Sequence

import pandas as pd
import torch
from torch import nn

import interp.launch as launch
from interp.analyses.claims.evidence import argmax_offsets_per_prompt, head_metric, modal_offset, offset_index
from interp.analyses.claims.presets import PRESETS, positional_head
from interp.analyses.head_types import HeadType, head_types
from interp.behaviour import BehaviourLike
from interp.claims import Claim, Context, Inconclusive, test_claims
from interp.data import PromptSet
from interp.heads import HeadLike
from interp.hooks import attention_sites
from interp.interventions import check_heads
from interp.launch import Device, DType
from interp.validate import check_inputs


def propose(model: nn.Module, prompts: PromptSet, *, batch_size: int = 32,
            device: Device = None, dtype: DType = None, heads: Iterable[HeadLike] | None = None) -> list[Claim]:
    """Claims suggested by the metrics on `prompts`: for every head (of `heads`, when given), each head type
    (`interp.analyses.head_types`, those the model and prompts define) whose point estimate clears its threshold,
    and a positional claim where the maximum sits at one offset for >= 90% of queries; a head that clears none gets
    its closest head type (so every head is tested). `device` / `dtype`: measured on a moved copy (`interp.launch.move`)."""
    check_inputs("propose", model, prompts)
    wanted = None if heads is None else set(check_heads(model, heads))
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    ctx = Context(model, prompts, batch_size=batch_size)
    causal = attention_sites(model)[0].causal
    means = _defined_means(ctx, [t for t in head_types() if t.available(prompts, causal=causal) is None])
    kinds = [t for t in head_types() if t.name in means]
    counts = ctx.cached(("argmax", model, prompts), lambda: argmax_offsets_per_prompt(model, prompts, batch_size=batch_size))
    claims: list[Claim] = []
    n_layers, n_heads = next(iter(means.values())).shape
    for layer in range(n_layers):
        for head in range(n_heads):
            if wanted is not None and (layer, head) not in wanted:
                continue
            chosen = []
            ratios = {}
            for t in kinds:
                ratios[t.name] = float(means[t.name][layer, head]) / t.threshold
                if ratios[t.name] > 1:
                    chosen.append(PRESETS[t.name](layer, head))
            mode = modal_offset(ctx, layer, head)
            rate = _rate_at(counts, prompts.n_pos, layer, head, mode)
            if rate >= 0.9:
                chosen.append(positional_head(layer, head, offset=mode if mode == "first" else int(mode)))
            if not chosen:
                best = max(ratios, key=ratios.__getitem__)
                chosen.append(PRESETS[best](layer, head))
            claims.extend(chosen)
    return claims


def _defined_means(ctx: Context, kinds: list[HeadType]) -> dict[str, torch.Tensor]:
    """{type name: (layer, head) mean metric} of the types the prompts define; a type undefined on them (an
    offset no prompt reaches, a next token on a causal model) proposes nothing, as unavailable types do."""
    means = {}
    for t in kinds:
        try:
            means[t.name] = head_metric(ctx, t).double().mean(0)
        except Inconclusive:
            continue
    return means


def _rate_at(counts: dict[str, torch.Tensor], n_pos: int, layer: int, head: int, mode: str) -> float:
    if mode == "first":
        return float(counts["first_hits"][:, layer, head].sum() / counts["first_count"][:, layer, head].sum())
    i = offset_index(n_pos, int(mode))
    return float(counts["hits"][:, layer, head, i].sum() / counts["count"][:, layer, head, i].sum().clamp(min=1))


def scan(
    model: nn.Module,
    prompts: PromptSet,
    *,
    seed: int = 0,
    alpha: float = 0.05,
    evidence: Sequence[str] | None = None,
    batch_size: int = 32,
    progress: bool = False,
    behaviour: BehaviourLike = None,
    device: Device = None,
    dtype: DType = None,
    heads: Iterable[HeadLike] | None = None,
) -> pd.DataFrame:
    """Propose claims for every head (of `heads`, when given: on a large model the tests are the cost) on one half
    of the prompts and test them on the other half.

    Claims are never tested on the prompts that proposed them. Returns the verdict table of
    `interp.claims.test_claims` (one row per proposed claim, p-values corrected over all of them),
    with `proposed_on` / `tested_on` prompt counts. `behaviour` is what necessity, sufficiency and
    faithfulness measure (`interp.behaviour`; default: the model's own); the `behaviour` column says which.
    `device` / `dtype`: both halves run on one moved copy of the model (`interp.launch.move`).
    """
    _, seed = check_inputs("scan", model, prompts, seed=seed)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    propose_half, test_half = prompts.split(0.5, seed=seed)
    claims = propose(model, propose_half, batch_size=batch_size, heads=heads)
    table = test_claims(model, claims, test_half, alpha=alpha, seed=seed, evidence=evidence, batch_size=batch_size,
                        progress=progress, behaviour=behaviour)
    table.insert(table.columns.get_loc("n_prompts"), "proposed_on", len(propose_half))
    return table
