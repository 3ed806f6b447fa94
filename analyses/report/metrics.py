"""The report's analysis library: which heads it covers, their mean patterns, metrics and offset profiles.

Notebooks and `interp heads` use these directly; `interp.analyses.report.pipeline.compute` runs them
as stages. Vocabulary: heads are `L{layer}H{head}`; `pattern` is the post-softmax attention
(query, key); the relative offset of a key is key - query (-1 = previous token, as in
`interp.analyses.positional.offset_profile`).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

import interp.distributed as distributed
from interp.data import PromptSet
from interp.heads import head_label
from interp.hooks import attention_sites, hooked


def select_heads(
    model: nn.Module, layers: Iterable[int] | None = None, heads: Iterable[tuple[int, int]] | None = None
) -> list[tuple[int, int]]:
    """The (layer, head) pairs a report covers; errors name heads that do not exist."""
    sites = attention_sites(model)
    every = [(s.layer, h) for s in sites for h in range(s.n_heads)]
    chosen = every
    if layers is not None:
        layers = list(layers)
        bad = [l for l in layers if not 0 <= l < len(sites)]
        if bad:
            raise ValueError(f"layer {bad[0]} does not exist; the model has layers 0..{len(sites) - 1}.")
        chosen = [lh for lh in chosen if lh[0] in layers]
    if heads is not None:
        heads = list(heads)
        unknown = [lh for lh in heads if lh not in every]
        if unknown:
            shape = ", ".join(f"layer {s.layer}: heads 0..{s.n_heads - 1}" for s in sites)
            raise ValueError(f"head {head_label(unknown[0])} does not exist ({shape}).")
        chosen = [lh for lh in chosen if lh in heads]
    if not chosen:
        raise ValueError(f"the selection (layers={layers}, heads={heads}) leaves no heads; widen it.")
    return chosen


def mean_patterns(model: nn.Module, prompts: PromptSet, layers: Sequence[int], *, batch_size: int = 32) -> dict[int, np.ndarray]:
    """Mean attention pattern per layer over prompts: layer -> (head, query, key).

    Padded queries are left out of the mean (each query position is averaged over the prompts
    where it is a real token). Memory is one (head, query, key) sum per layer.
    """
    from interp.interventions import run_stopping_after

    sites = {s.layer: s for s in attention_sites(model)}
    sums: dict[int, torch.Tensor] = {}
    counts = torch.zeros(prompts.n_pos, dtype=torch.float64)

    def make_hook(layer: int, query_mask: list):
        def hook(pattern, hook):  # (batch, head, query, key)
            weights = query_mask[0][:, None, :, None].to(pattern.device, torch.float32)  # (batch, 1, query, 1)
            total = (pattern.detach().float().nan_to_num(0.0) * weights).sum(0).double().cpu()  # (head, query, key)
            sums[layer] = sums.get(layer, 0) + total
            return None

        return hook

    for batch in distributed.shard(prompts, batch_size).prompts.batches(batch_size):
        mask = torch.ones(batch.tokens.shape) if batch.attention_mask is None else batch.attention_mask.float()
        holder = [mask]
        counts += mask.sum(0).double()
        fwd = [(sites[l].hook("pattern"), make_hook(l, holder)) for l in layers]
        with torch.no_grad(), hooked(model, fwd):
            run_stopping_after(model, batch, max(layers))
    if distributed.active():  # every rank's sums, added in rank order
        parts = distributed.gather_objects((sums, counts))
        sums = {l: sum((part[0][l] for part in parts[1:] if l in part[0]), parts[0][0].get(l, 0)) for l in layers}
        counts = sum((part[1] for part in parts[1:]), parts[0][1])
    return {l: (sums[l] / counts.clamp(min=1)[None, :, None]).numpy() for l in layers}


def head_metrics(
    model: nn.Module,
    prompts: PromptSet,
    *,
    seed: int = 0,
    layers: Iterable[int] | None = None,
    heads: Iterable[tuple[int, int]] | None = None,
) -> pd.DataFrame:
    """Positional focus metrics for every head, plus induction scores on repeated prompts; with CIs.

    One row per (layer, head): `label`, `layer`, `head`, each metric with `_ci_low` / `_ci_high`,
    `n_prompts` (the columns of `interp.analyses.positional.focus` and `interp.analyses.induction.scores`).
    """
    from interp.analyses import induction, positional

    chosen = select_heads(model, layers, heads)
    needed = sorted({l for l, _ in chosen})
    repeated = prompts.meta.get("kind") == "repeated"
    if repeated:
        induction.check_repeats(prompts)
    # one forward for both: the positional metrics and, on repeated prompts, the induction scores
    per_prompt = positional.focus_per_prompt(model, prompts, layers=needed,
                                             also=induction.reduce_induction if repeated else None)
    repeat_keys = [k for k in per_prompt if k in {t.column for t in induction.repeat_types()} or
                   k.removesuffix("_argmax") in {t.column for t in induction.repeat_types()}]
    frame = positional.nan_aware_frame({k: v for k, v in per_prompt.items() if k not in repeat_keys}, seed=seed,
                                       layers=needed)
    if repeated:
        scores = induction.scores(model, prompts, seed=seed, layers=needed,
                                  per_prompt={k: per_prompt[k] for k in repeat_keys})
        extra = [c for c in scores.columns if c not in frame.columns or c in ("layer", "head")]
        frame = frame.merge(scores[extra], on=["layer", "head"], how="left")
    kept = set(chosen)
    frame = frame[[(l, h) in kept for l, h in zip(frame["layer"], frame["head"])]].reset_index(drop=True)
    frame.insert(0, "label", list(map(head_label, zip(frame["layer"], frame["head"]))))
    if "n_prompts" in frame.columns:  # keep n_prompts last
        frame = frame[[c for c in frame.columns if c != "n_prompts"] + ["n_prompts"]]
    return frame


def offset_profiles(model: nn.Module, prompts: PromptSet, *, layers=None, max_offset: int = 32) -> pd.DataFrame:
    """Mean weight at each relative offset (key - query) per head: layer, head, offset, weight, CI."""
    from interp.analyses import positional

    frame = positional.offset_profile(model, prompts, layers=layers)
    return frame[frame["offset"].abs() <= max_offset].reset_index(drop=True)
