"""Which heads do alike: attention-pattern similarity (JS divergence), output similarity (cosine, linear
CKA), the labelled square form of a pair frame, and the pairs worth ablating together."""
from __future__ import annotations

import math
from typing import Iterable, Literal, get_args

import einops
import numpy as np
import pandas as pd
import torch
from torch import nn

import interp.launch as launch
from interp.analyses.redundancy.common import _all_pairs, _check_n, _pairs_frame
from interp.analyses.redundancy.importance import second_order
from interp.behaviour import BehaviourLike
from interp.capture import stream
from interp.data import PromptSet
from interp.heads import Head, head_label, parse_head
from interp.hooks import attention_sites
from interp.interventions import AblationKind, all_heads
from interp.launch import Device, DType
from interp.validate import check_inputs

SuggestBy = Literal["pattern", "output", "second_order"]
WRITE_FLOOR = 1e-6  # a head "writes nothing" at a position where its norm is below this fraction of its largest


def to_matrix(frame: pd.DataFrame, metric: str | None = None, *, diagonal: float | None = None) -> pd.DataFrame:
    """A pair frame (layer_a, head_a, layer_b, head_b, metric) as a symmetric labelled square frame.

    Rows and columns are `L{l}H{h}` in forward order, ready for a heat map. `metric` defaults to
    the frame's main metric (`frame.attrs["metric"]`); the diagonal is `diagonal` (default: the
    metric's value for identical heads, from `frame.attrs["diagonal"]`).
    """
    metric = metric or frame.attrs.get("metric")
    if metric not in frame.columns:
        raise KeyError(f"metric {metric!r} is not a column; choose one of {list(frame.columns)}.")
    labels_a = [head_label(h) for h in zip(frame.layer_a, frame.head_a)]
    labels_b = [head_label(h) for h in zip(frame.layer_b, frame.head_b)]
    order = sorted(set(labels_a) | set(labels_b), key=lambda s: parse_head(s))
    square = pd.DataFrame(np.nan, index=pd.Index(order, name="head"), columns=pd.Index(order, name="head"))
    for a, b, value in zip(labels_a, labels_b, frame[metric]):
        square.loc[a, b] = value
        square.loc[b, a] = value
    fill = frame.attrs.get("diagonal", np.nan) if diagonal is None else diagonal
    for label in order:
        square.loc[label, label] = fill
    return square


class _PairwiseJS:
    """Accumulator for `interp.capture.stream`: per-prompt mean JS divergence of every head pair.

    Per query, JS(p, q) = H(m) - (H(p) + H(q)) / 2 with m = (p + q) / 2 (entropies in bits);
    averaged over a prompt's real queries, which only needs per-prompt sums of entropy terms.
    The largest tensor is one batch's patterns of every head at the allowed (query, key) entries.
    """

    def __init__(self, causal: bool, pair_chunk: int = 32):
        self.causal, self.pair_chunk = causal, pair_chunk
        self.chunks: list[torch.Tensor] = []
        self.n_prompts = 0

    def update(self, batch: dict[str, torch.Tensor]) -> None:
        pattern = batch["pattern"]  # (batch, layer, head, query, key)
        real = batch["real"][:, 0, 0]  # (batch, pos)
        n_pos = pattern.shape[-1]
        flat = einops.rearrange(pattern.float(), "batch layer head query key -> batch (layer head) query key")
        if self.causal:
            query, key = torch.tril_indices(n_pos, n_pos, device=flat.device)
            flat = flat[..., query, key]  # (batch, head_all, entry): causal zeros never enter
        else:
            flat = flat.flatten(-2)  # (batch, head_all, entry)
        n_queries = real.sum(-1).double().clamp(min=1)  # (batch,)
        entropy = torch.special.entr(flat).sum(-1).double()  # (batch, head_all): H(p) summed over queries, nats
        mass = flat.sum(-1).double()  # (batch, head_all): number of non-empty query rows
        n_heads = flat.shape[1]
        js = torch.empty(flat.shape[0], n_heads * (n_heads - 1) // 2, dtype=torch.float64)
        done = 0
        for i in range(n_heads - 1):
            for start in range(i + 1, n_heads, self.pair_chunk):
                stop = min(start + self.pair_chunk, n_heads)
                both = flat[:, i : i + 1] + flat[:, start:stop]  # (batch, pairs, entry) = 2 m
                # H(m) = H(2m) / 2 + log(2) * mass(m): one pass of entr over 2m, no halving pass
                mixture = 0.5 * torch.special.entr(both).sum(-1).double() + 0.5 * math.log(2) * (
                    mass[:, i : i + 1] + mass[:, start:stop])
                gap = mixture - 0.5 * (entropy[:, i : i + 1] + entropy[:, start:stop])  # nats, summed over queries
                js[:, done : done + stop - start] = gap / math.log(2) / n_queries[:, None]
                done += stop - start
        self.chunks.append(js.clamp(min=0.0))
        self.n_prompts += flat.shape[0]

    def merge(self, other: "_PairwiseJS") -> "_PairwiseJS":
        """Append `other`'s prompts (a later shard, `interp.distributed.merge`)."""
        self.chunks.extend(other.chunks)
        self.n_prompts += other.n_prompts
        return self

    def result(self) -> torch.Tensor:
        return torch.cat(self.chunks)  # (prompt, pair)


def pattern_similarity(
    model: nn.Module,
    prompts: PromptSet,
    *,
    batch_size: int = 16,
    seed: int = 0,
    device: Device = None,
    dtype: DType = None,
    layers: Iterable[int] | None = None,
) -> pd.DataFrame:
    """Jensen-Shannon divergence (bits) between the attention patterns of every pair of heads (of `layers`,
    when given: the pairs grow with the square of the heads, which on a large model is the cost).

    One row per unordered pair (within and across layers): `js_divergence` (0 = identical
    distributions at every query, 1 = disjoint supports), `ci_low`, `ci_high`, `n_prompts`,
    and `similarity` = 1 - JS. `to_matrix(frame)` gives the labelled square form.
    Memory does not grow with the number of prompts beyond one float per prompt and pair.
    Limits: it compares *where* heads look, not what they read or write (see output_similarity).
    """
    layers, seed = check_inputs("pattern_similarity", model, prompts, seed=seed, layers=layers)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    _check_n(prompts)
    sites = attention_sites(model)
    causal = all(site.causal is True for site in sites)

    def reduce(pattern: torch.Tensor, ctx) -> dict[str, torch.Tensor]:  # (batch, head, query, key)
        return {"pattern": pattern, "real": einops.repeat(ctx.real, "batch pos -> batch head pos", head=pattern.shape[1])}

    accumulator = stream(model, prompts, reduce, role="pattern", batch_size=batch_size, accumulator=_PairwiseJS(causal),
                         layers=layers)
    heads = [h for h in all_heads(model) if layers is None or h.layer in set(layers)]
    js = accumulator.result()  # (prompt, pair)
    frame = _pairs_frame(_all_pairs(heads), {"js_divergence": js, "similarity": 1 - js}, len(prompts),
                         main="js_divergence", seed=seed, diagonal=0.0)
    return frame


class _OutputSimilarity:
    """Accumulator: per-prompt mean per-position cosine and linear CKA over positions, every head pair."""

    def __init__(self):
        self.cosine: list[torch.Tensor] = []
        self.cka: list[torch.Tensor] = []
        self.n_prompts = 0

    def update(self, batch: dict[str, torch.Tensor]) -> None:
        result = einops.rearrange(batch["result"].float(), "batch layer head pos d -> batch (layer head) pos d")
        real = batch["real"][:, 0, 0].float()  # (batch, pos)
        n_real = real.sum(-1).clamp(min=1)  # (batch,)
        norm = result.norm(dim=-1)  # (batch, head, pos)
        # a position where a head writes (next to) nothing has no direction: left out of that pair's mean
        writes = (norm > WRITE_FLOOR * norm.amax(-1, keepdim=True)) & (norm > 0) & real[:, None, :].bool()
        unit = torch.where(writes[..., None], result / norm.clamp(min=1e-30)[..., None], 0.0)  # (batch, head, pos, d)
        writes = writes.float()
        both = einops.einsum(writes, writes, "batch i pos, batch j pos -> batch i j")
        cosine = einops.einsum(unit, unit, "batch i pos d, batch j pos d -> batch i j") / both.clamp(min=1)
        centred = result - (result * real[:, None, :, None]).sum(2, keepdim=True) / n_real[:, None, None, None]
        centred = centred * real[:, None, :, None]
        gram = einops.einsum(centred, centred, "batch head p d, batch head q d -> batch head p q").flatten(2)
        hsic = einops.einsum(gram.double(), gram.double(), "batch i e, batch j e -> batch i j")
        norms = hsic.diagonal(dim1=1, dim2=2).clamp(min=1e-30).sqrt()  # (batch, head)
        cka = hsic / (norms[:, :, None] * norms[:, None, :])
        n = result.shape[1]
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.cosine.append(cosine[:, rows, cols].double().cpu())
        self.cka.append(cka[:, rows, cols].cpu())
        self.n_prompts += result.shape[0]

    def merge(self, other: "_OutputSimilarity") -> "_OutputSimilarity":
        """Append `other`'s prompts (a later shard, `interp.distributed.merge`)."""
        self.cosine.extend(other.cosine)
        self.cka.extend(other.cka)
        self.n_prompts += other.n_prompts
        return self


def output_similarity(
    model: nn.Module,
    prompts: PromptSet,
    *,
    batch_size: int = 16,
    seed: int = 0,
    device: Device = None,
    dtype: DType = None,
) -> pd.DataFrame:
    """How alike every pair of heads' writes to the residual stream (`hook_result`) are.

    Per prompt: `cosine` = mean over real positions of the cosine between the two heads'
    result vectors (positions where either head writes nothing, below `WRITE_FLOOR` of its largest
    write in the prompt, are left out; 0 if none remain); `cka` = linear CKA of the two
    (position x d_model) matrices, centred over positions (Kornblith et al. 2019: invariant
    to rotation and scale of either head's output, 1 = same geometry over positions).
    One row per pair with CIs (`ci_low`/`ci_high` for cosine, `cka_ci_low`/`cka_ci_high`).
    """
    _, seed = check_inputs("output_similarity", model, prompts, seed=seed)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    _check_n(prompts)

    def reduce(result: torch.Tensor, ctx) -> dict[str, torch.Tensor]:  # (batch, pos, head, d_model)
        return {"result": einops.rearrange(result, "batch pos head d -> batch head pos d"),
                "real": einops.repeat(ctx.real, "batch pos -> batch head pos", head=result.shape[2])}

    acc = stream(model, prompts, reduce, role="result", batch_size=batch_size, accumulator=_OutputSimilarity())
    heads = all_heads(model)
    return _pairs_frame(_all_pairs(heads), {"cosine": torch.cat(acc.cosine), "cka": torch.cat(acc.cka)},
                        len(prompts), main="cosine", seed=seed, diagonal=1.0)


def suggest_pairs(
    model: nn.Module, prompts: PromptSet, k: int = 5, *, by: SuggestBy = "second_order", method: AblationKind = "mean",
    batch_size: int = 16, seed: int = 0, behaviour: BehaviourLike = None,
    device: Device = None, dtype: DType = None,
) -> list[tuple[Head, Head]]:
    """The k pairs most likely to be redundant: most similar patterns (lowest JS), most similar
    outputs (highest CKA), or largest second-order interaction estimate."""
    _, seed = check_inputs("suggest_pairs", model, prompts, seed=seed)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    if by not in get_args(SuggestBy):
        raise ValueError(f"by={by!r}; expected one of {list(get_args(SuggestBy))}.")
    if k < 1:
        raise ValueError(f"k={k} must be at least 1.")
    if by == "pattern":
        frame = pattern_similarity(model, prompts, batch_size=batch_size, seed=seed).nsmallest(k, "js_divergence")
    elif by == "output":
        frame = output_similarity(model, prompts, batch_size=batch_size, seed=seed).nlargest(k, "cka")
    else:
        frame = second_order(model, prompts, method, behaviour=behaviour, batch_size=batch_size,
                             seed=seed).nlargest(k, "interaction_estimate")
    return [(Head(int(r.layer_a), int(r.head_a)), Head(int(r.layer_b), int(r.head_b))) for r in frame.itertuples()]
