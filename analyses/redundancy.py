"""Head redundancy: which heads do the same work, which back each other up, which can go.

Questions and entry points (each returns a tidy DataFrame; per-prompt values are reduced to a
mean and a percentile-bootstrap CI over prompts, the prompt being the unit of statistics):

- `pattern_similarity`: Jensen-Shannon divergence (bits, in [0, 1]) between two heads'
  attention distributions at the same query, averaged over queries and prompts, for every
  pair of heads within and across layers. Streaming: one batch's patterns alive at a time.
- `output_similarity`: how alike two heads' writes to the residual stream (`hook_result`)
  are: mean per-position cosine, and linear CKA over positions (Kornblith et al. 2019).
- `importance`: the loss change when a head alone is ablated (zero / mean / resample), for
  every head, and the first-order head-mask estimate of it (Michel et al. 2019), with the
  Spearman rank correlation between estimate and truth in `frame.attrs`.
- `joint_ablation`: loss change of ablating two heads together against the sum of each alone;
  `interaction = delta_both - delta_a - delta_b` > 0 means the pair matters together more
  than apart (redundancy / backup). Pairs given, or suggested by `suggest_pairs`.
- `compensation`: per head the direct effect (only its direct path to the logits removed) vs
  its total effect (ablated everywhere): self-repair = direct - total (the hydra effect,
  McGrath et al. 2023); and the compensation matrix: how much each later head's direct effect
  grows when an earlier head is ablated (backup heads, Wang et al. 2022).
- `pruning_curve`: loss as heads are removed, least important first (by the estimate) vs in
  random order; how many can go before the loss rises by `margin`.
- Claims (`interp.claims` objects, tested with `interp.claims.test_claims`):
  `redundant_claim(a, b)`, `dispensable_claim(a)`, `backup_claim(a, b)`; `redundancy_claims`
  tests a batch of them.

Losses are per prompt values of a *behaviour* (`interp.behaviour`): `behaviour=` takes a name
("next-token", "masked-lm", "embedding"), a `Behaviour`, or a callable `(output, prompts) ->
(prompt,)` on the final logits; the default follows the model (`default_behaviour`: the
next-token loss at every real position for a causal LM, the sentence-embedding change for an
encoder or a model whose head is random). `lm_loss` (every position) and `induction_loss`
(repeated copies only) are next-token behaviours; `loss_fn=` is a deprecated alias of
`behaviour=` for a callable. A NaN value raises. "Loss" below means the behaviour's value.

Column names: `layer`, `head` (or `layer_a, head_a, layer_b, head_b` for pairs), `label`
(`L{l}H{h}`), the main metric with `ci_low`, `ci_high`, other metrics with
`{metric}_ci_low`, `{metric}_ci_high`, and `n_prompts`.

Devices and dtypes: every entry point takes `device=` ("cpu", "cuda:1", ...) and `dtype=`
("float32", "bfloat16", "float16"); the model is moved / cast by `interp.launch.move` (a copy: the
caller's model is left as it was; move it yourself and leave both unset to avoid the copy's memory),
prompts go to its device batch by batch, and statistics are accumulated in float32 or float64.
A device or dtype this process cannot use raises BadInput. In bfloat16, losses and their changes
move by a few 1e-2 nats from float32 (tests/test_redundancy.py states the tolerances).

Ablations run through `interp.ablation.AblationEngine` (`importance`, `joint_ablation`,
`pruning_curve`, `compensation`): where the model says resuming is exact (`HookedGPT.resumable`,
sequential pre-norm blocks) the clean forward runs once per batch and each ablation resumes after its
earliest layer's attention (`model.run_from`), with the loss read fused from the final residual
(`model.next_token_loss_from_resid`). Measured (benchmarks/bench_redundancy): about 1.8x less CPU
than one `run_with_hooks` forward per head, equal to 1e-5. Other models (post-norm, parallel blocks),
or `fast=False`, run one hooked forward per ablation. (`interp.analyses.redundancy.AblationEngine` is a
deprecated alias of `interp.ablation.AblationEngine`.)
"""
from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence, get_args

import einops
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.utilities.statistics import derive_generator

from interp import ablation as _ablation
from interp import distributed, launch
from interp.ablation import LossFn, resolve_behaviour, resumable
from interp.behaviour import (
    BehaviourLike,
    clean_summaries,
    final_output,
    next_token_loss,
)
from interp.capture import stream
from interp.claims import (
    Claim,
    Context,
    Evidence,
    Threshold,
    difference_evidence,
    test_claims,
    threshold_evidence,
)
from interp.data import PromptSet
from interp.hooks import attention_sites, hooked
from interp.interventions import (
    AblationKind,
    AblationValues,
    Head,
    HeadLike,
    ReferenceActivations,
    all_heads,
    check_heads,
    head_label,
    parse_head,
)
from interp.launch import Device, DType  # noqa: F401  (the `device=` / `dtype=` of every analysis; re-exported)
from interp.stats import MIN_PROMPTS, TooFewPrompts, benjamini_hochberg, bootstrap, sign_flip_test, spearman
from interp.validate import check_head_pair, check_inputs



def __getattr__(name: str):
    """`AblationEngine` moved to `interp.ablation`; the old name here still works, with a DeprecationWarning."""
    if name == "AblationEngine":
        warnings.warn("interp.analyses.redundancy.AblationEngine moved to interp.ablation.AblationEngine; import it from there.",
                      DeprecationWarning, stacklevel=2)
        return _ablation.AblationEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SuggestBy = Literal["pattern", "output", "second_order"]
OrderBy = Literal["gradient", "ablation"]
DEFAULT_MARGIN = 0.05  # nats per token: a head is "cheap" to remove if it costs less than this
MARGIN_SOURCE = ("cheap-removal margin in nats/token (toolkit default; Michel et al. 2019 prune heads "
                 "whose removal barely moves the loss)")


# ---------------------------------------------------------------------------------------------
# losses


# the named next-token losses of earlier versions: Behaviour objects, still callable as (logits, prompts)
lm_loss = next_token_loss("all")  # next-token cross-entropy per prompt at every real prediction
induction_loss = next_token_loss("repeats")  # ... on the repeated copies only (prompts from `repeated_tokens`)



# ---------------------------------------------------------------------------------------------
# statistics helpers


def _check_n(prompts: PromptSet) -> None:
    if len(prompts) < MIN_PROMPTS:
        raise TooFewPrompts(
            f"redundancy analyses need at least {MIN_PROMPTS} prompts for a confidence interval, got {len(prompts)}; "
            "pass more prompts (>= 8 for a usable interval)."
        )


def _ci(values: torch.Tensor, *, seed: int, label: str, chunk: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and bootstrap CI of (prompt, k) values, k columns at a time (bounds the bootstrap's memory)."""
    values = values.double().reshape(values.shape[0], -1)
    parts = [bootstrap(values[:, i : i + chunk], seed=seed, label=f"{label}/{i}") for i in range(0, values.shape[1], chunk)]
    mean, low, high = (torch.cat([p[j] for p in parts]).numpy() for j in range(3))
    return mean, low, high


def _label(head: Head) -> str:
    return head_label(head)


def to_matrix(frame: pd.DataFrame, metric: str | None = None, *, diagonal: float | None = None) -> pd.DataFrame:
    """A pair frame (layer_a, head_a, layer_b, head_b, metric) as a symmetric labelled square frame.

    Rows and columns are `L{l}H{h}` in forward order, ready for a heat map. `metric` defaults to
    the frame's main metric (`frame.attrs["metric"]`); the diagonal is `diagonal` (default: the
    metric's value for identical heads, from `frame.attrs["diagonal"]`).
    """
    metric = metric or frame.attrs.get("metric")
    if metric not in frame.columns:
        raise KeyError(f"metric {metric!r} is not a column; choose one of {list(frame.columns)}.")
    labels_a = [_label(h) for h in zip(frame.layer_a, frame.head_a)]
    labels_b = [_label(h) for h in zip(frame.layer_b, frame.head_b)]
    order = sorted(set(labels_a) | set(labels_b), key=lambda s: parse_head(s))
    square = pd.DataFrame(np.nan, index=pd.Index(order, name="head"), columns=pd.Index(order, name="head"))
    for a, b, value in zip(labels_a, labels_b, frame[metric]):
        square.loc[a, b] = value
        square.loc[b, a] = value
    fill = frame.attrs.get("diagonal", np.nan) if diagonal is None else diagonal
    for label in order:
        square.loc[label, label] = fill
    return square


def _pairs_frame(pairs: Sequence[tuple[Head, Head]], metrics: dict[str, torch.Tensor], n_prompts: int, *,
                 main: str, seed: int, diagonal: float = np.nan) -> pd.DataFrame:
    """One row per pair: layer_a, head_a, layer_b, head_b, labels, metrics with CIs, n_prompts."""
    columns: dict[str, object] = {
        "layer_a": [a[0] for a, _ in pairs], "head_a": [a[1] for a, _ in pairs],
        "layer_b": [b[0] for _, b in pairs], "head_b": [b[1] for _, b in pairs],
        "label_a": [_label(a) for a, _ in pairs], "label_b": [_label(b) for _, b in pairs],
    }
    for name, values in metrics.items():
        mean, low, high = _ci(values, seed=seed, label=name)
        columns[name] = mean
        columns["ci_low" if name == main else f"{name}_ci_low"] = low
        columns["ci_high" if name == main else f"{name}_ci_high"] = high
    columns["n_prompts"] = n_prompts
    frame = pd.DataFrame(columns)
    frame.attrs.update(metric=main, diagonal=diagonal)
    return frame


def _heads_frame(heads: Sequence[Head], metrics: dict[str, torch.Tensor], n_prompts: int, *, main: str, seed: int) -> pd.DataFrame:
    """One row per head: layer, head, label, metrics with CIs (main: ci_low / ci_high), n_prompts."""
    columns: dict[str, object] = {"layer": [h[0] for h in heads], "head": [h[1] for h in heads],
                                  "label": [_label(h) for h in heads]}
    for name, values in metrics.items():
        mean, low, high = _ci(values, seed=seed, label=name)
        columns[name] = mean
        columns["ci_low" if name == main else f"{name}_ci_low"] = low
        columns["ci_high" if name == main else f"{name}_ci_high"] = high
    columns["n_prompts"] = n_prompts
    frame = pd.DataFrame(columns)
    frame.attrs["metric"] = main
    return frame


def _param_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's weights: a head mask in it keeps every matmul in one dtype."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def _all_pairs(heads: Sequence[Head]) -> list[tuple[Head, Head]]:
    return [(heads[i], heads[j]) for i in range(len(heads)) for j in range(i + 1, len(heads))]


# ---------------------------------------------------------------------------------------------
# pattern similarity


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
) -> pd.DataFrame:
    """Jensen-Shannon divergence (bits) between the attention patterns of every pair of heads.

    One row per unordered pair (within and across layers): `js_divergence` (0 = identical
    distributions at every query, 1 = disjoint supports), `ci_low`, `ci_high`, `n_prompts`,
    and `similarity` = 1 - JS. `to_matrix(frame)` gives the labelled square form.
    Memory does not grow with the number of prompts beyond one float per prompt and pair.
    Limits: it compares *where* heads look, not what they read or write (see output_similarity).
    """
    _, seed = check_inputs("pattern_similarity", model, prompts, seed=seed)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    _check_n(prompts)
    sites = attention_sites(model)
    causal = all(site.causal is True for site in sites)

    def reduce(pattern: torch.Tensor, ctx) -> dict[str, torch.Tensor]:  # (batch, head, query, key)
        return {"pattern": pattern, "real": einops.repeat(ctx.real, "batch pos -> batch head pos", head=pattern.shape[1])}

    accumulator = stream(model, prompts, reduce, role="pattern", batch_size=batch_size, accumulator=_PairwiseJS(causal))
    heads = all_heads(model)
    js = accumulator.result()  # (prompt, pair)
    frame = _pairs_frame(_all_pairs(heads), {"js_divergence": js, "similarity": 1 - js}, len(prompts),
                         main="js_divergence", seed=seed, diagonal=0.0)
    return frame


# ---------------------------------------------------------------------------------------------
# output similarity


WRITE_FLOOR = 1e-6  # a head "writes nothing" at a position where its norm is below this fraction of its largest


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


# ---------------------------------------------------------------------------------------------
# importance


def gradient_importance(
    model: nn.Module,
    prompts: PromptSet,
    method: AblationKind = "mean",
    *,
    reference: PromptSet | ReferenceActivations | None = None,
    loss_fn: LossFn | None = None,
    behaviour: BehaviourLike = None,
    batch_size: int = 16,
    seed: int = 0,
    device: Device = None,
    dtype: DType = None,
) -> torch.Tensor:
    """Head-mask gradient (Michel et al. 2019), per prompt: (prompt, layer, head).

    Each head's z is written z' = base + m (z - base), base being its ablated value (0 for
    zero ablation, as Michel et al.); at m = 1 the model is unchanged and -dL/dm is the
    first-order estimate of the loss change when m goes to 0 (the head is ablated).
    Returns that signed estimate; Michel et al.'s importance is its absolute value. For a
    behaviour measured as a distance from the clean run (`embedding_change`) the clean run is its
    minimum, so the gradient is zero there: rank by ablation instead.
    """
    _, seed = check_inputs("gradient_importance", model, prompts, seed=seed)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    engine = _ablation.AblationEngine(model, prompts, method, reference=reference, loss_fn=loss_fn, batch_size=batch_size, seed=seed,
                            behaviour=behaviour)
    sites = list(engine.sites.values())
    n_heads = max(site.n_heads for site in sites)
    values = engine.values()
    out = []
    for indices, batch in distributed.shard(prompts, batch_size).batches(batch_size):
        values.prompt_index = indices  # resampling keyed by global prompt index
        mask = torch.ones(len(batch), len(sites), n_heads, device=engine.device, dtype=_param_dtype(model),
                          requires_grad=True)

        def make_hook(layer: int, heads: int):
            def hook(z: torch.Tensor, hook=None) -> torch.Tensor:  # (batch, pos, head, d_head)
                with torch.no_grad():
                    base = torch.stack([values(layer, h, z[:, :, h].detach()) for h in range(heads)], dim=2)
                scale = einops.rearrange(mask[:, layer, :heads], "batch head -> batch 1 head 1")
                return base + scale * (z - base)
            return hook

        hooks = [(site.hook("z"), make_hook(site.layer, site.n_heads)) for site in sites]
        summary = clean_summaries(model, batch, engine.behaviour, batch_size=len(batch))
        with torch.enable_grad(), hooked(model, hooks):
            output = final_output(model, engine.behaviour.model_prompts(batch), engine.behaviour.reads)
            loss = engine.value(output, batch, summary, "head-mask gradient")
            (grad,) = torch.autograd.grad(loss.sum(), mask)
        out.append(-grad.detach().double().cpu())
    local = torch.cat(out) if out else torch.zeros(0, len(sites), n_heads, dtype=torch.float64)
    return distributed.gather_prompts(local)


def importance(
    model: nn.Module,
    prompts: PromptSet,
    method: AblationKind = "mean",
    *,
    reference: PromptSet | ReferenceActivations | None = None,
    loss_fn: LossFn | None = None,
    behaviour: BehaviourLike = None,
    gradient: bool = True,
    batch_size: int = 16,
    seed: int = 0,
    fast: bool = True,
    device: Device = None,
    dtype: DType = None,
) -> pd.DataFrame:
    """Loss change when each head alone is ablated, and its gradient estimate, one row per head.

    Columns: `delta_loss` (ablated - clean behaviour value, e.g. nats; > 0 = the head helps), `ci_low`, `ci_high`,
    `p_value` (sign-flip test that the head helps), `clean_loss`; with `gradient=True` also
    `grad_estimate` (first-order estimate of delta_loss) and `grad_abs` (Michel et al.'s
    importance, |dL/dm|), each with CIs. `frame.attrs["spearman"]`: rank correlation over heads
    between `grad_estimate` and `delta_loss` (and `spearman_abs`: `grad_abs` vs |delta_loss|).
    Limits: a first-order estimate misses interactions (it is exact only for linear effects),
    which is what joint_ablation measures. `behaviour`: what the loss is (`interp.behaviour`; default the
    model's own); `frame.attrs["behaviour"]` says which, in words.
    """
    _, seed = check_inputs("importance", model, prompts, seed=seed)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    _check_n(prompts)
    engine = _ablation.AblationEngine(model, prompts, method, reference=reference, loss_fn=loss_fn,
                            batch_size=batch_size, seed=seed, fast=fast, behaviour=behaviour)
    heads = all_heads(model)
    clean, ablated = engine.losses([[h] for h in heads])
    delta = (ablated - clean).T  # (prompt, head)
    metrics = {"delta_loss": delta}
    if gradient:
        estimate = gradient_importance(model, prompts, method, reference=engine.reference, behaviour=engine.behaviour,
                                       batch_size=batch_size, seed=seed)
        estimate = torch.stack([estimate[:, l, h] for l, h in heads], dim=1)  # (prompt, head)
        metrics.update(grad_estimate=estimate, grad_abs=estimate.abs())
    frame = _heads_frame(heads, metrics, len(prompts), main="delta_loss", seed=seed)
    frame.insert(frame.columns.get_loc("ci_high") + 1, "p_value",
                 sign_flip_test(delta, alternative="greater", seed=seed, label="importance").numpy())
    frame.insert(frame.columns.get_loc("p_value") + 1, "clean_loss", float(clean.mean()))
    frame.attrs.update(method=method, loss=engine.behaviour.name, behaviour=engine.behaviour.describe(prompts),
                       unit=engine.behaviour.unit)
    if gradient:
        frame.attrs["spearman"] = spearman(frame.grad_estimate, frame.delta_loss)
        frame.attrs["spearman_abs"] = spearman(frame.grad_abs, frame.delta_loss.abs())
    return frame


def _batch_hessian(engine: _ablation.AblationEngine, batch: PromptSet, heads: Sequence[Head],
                   values: AblationValues) -> torch.Tensor:
    """d2L / dm_a dm_b (head, head) of one batch's summed loss, L being the behaviour's value with every
    head's z written base + m (z - base) (the head mask of `gradient_importance`)."""
    model = engine.model
    sites = list(engine.sites.values())
    index = {h: i for i, h in enumerate(heads)}
    mask = torch.ones(len(heads), device=engine.device, dtype=_param_dtype(model), requires_grad=True)

    def make_hook(site):
        def hook(z: torch.Tensor, hook=None) -> torch.Tensor:  # (batch, pos, head, d_head)
            with torch.no_grad():
                base = torch.stack([values(site.layer, h, z[:, :, h].detach()) for h in range(site.n_heads)], dim=2)
            scale = torch.stack([mask[index[(site.layer, h)]] for h in range(site.n_heads)])
            return base + einops.rearrange(scale, "head -> 1 1 head 1") * (z - base)
        return hook

    # the explicit attention path (a no-op pattern hook) keeps every op twice differentiable
    summary = clean_summaries(model, batch, engine.behaviour, batch_size=len(batch))
    hooks = [(site.hook("z"), make_hook(site)) for site in sites] + [(site.hook("pattern"), lambda p, hook: None) for site in sites]
    hessian = torch.zeros(len(heads), len(heads), dtype=torch.float64)
    with torch.enable_grad(), hooked(model, hooks):
        output = final_output(model, engine.behaviour.model_prompts(batch), engine.behaviour.reads)
        loss = engine.value(output, batch, summary, "second-order estimate").sum()
        (grad,) = torch.autograd.grad(loss, mask, create_graph=True)
        for i in range(len(heads)):
            (row,) = torch.autograd.grad(grad[i], mask, retain_graph=True)
            hessian[i] = row.detach().double().cpu()
    return hessian


def second_order(
    model: nn.Module,
    prompts: PromptSet,
    method: AblationKind = "mean",
    *,
    reference: PromptSet | ReferenceActivations | None = None,
    loss_fn: LossFn | None = None,
    behaviour: BehaviourLike = None,
    batch_size: int = 16,
    seed: int = 0,
    device: Device = None,
    dtype: DType = None,
) -> pd.DataFrame:
    """Second-order head-mask estimate of every pair's interaction: d2L / dm_a dm_b (mean over prompts).

    With the head mask m of `gradient_importance`, a Taylor expansion gives
    delta_both - delta_a - delta_b ~ d2L/dm_a dm_b: positive = redundant (together worse than
    apart). One row per pair, column `interaction_estimate`; no CI (computed on the mean loss).
    One extra backward per head: meant for small models.
    """
    _, seed = check_inputs("second_order", model, prompts, seed=seed)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    _check_n(prompts)
    engine = _ablation.AblationEngine(model, prompts, method, reference=reference, loss_fn=loss_fn, batch_size=batch_size, seed=seed,
                            behaviour=behaviour)
    heads = all_heads(model)
    index = {h: i for i, h in enumerate(heads)}
    hessian = torch.zeros(len(heads), len(heads), dtype=torch.float64)  # (head, head), summed over prompts
    values = engine.values()
    for indices, batch in distributed.shard(prompts, batch_size).batches(batch_size):
        values.prompt_index = indices  # resampling keyed by global prompt index
        hessian += _batch_hessian(engine, batch, heads, values)
    distributed.all_reduce_sum([hessian])  # every rank holds the sum over all prompts
    hessian /= len(prompts)
    pairs = _all_pairs(heads)
    frame = pd.DataFrame({
        "layer_a": [a[0] for a, _ in pairs], "head_a": [a[1] for a, _ in pairs],
        "layer_b": [b[0] for _, b in pairs], "head_b": [b[1] for _, b in pairs],
        "label_a": [_label(a) for a, _ in pairs], "label_b": [_label(b) for _, b in pairs],
        "interaction_estimate": [float(hessian[index[a], index[b]]) for a, b in pairs],
        "n_prompts": len(prompts),
    })
    frame.attrs.update(metric="interaction_estimate", diagonal=np.nan)
    return frame


# ---------------------------------------------------------------------------------------------
# joint ablation


def suggest_pairs(
    model: nn.Module, prompts: PromptSet, k: int = 5, *, by: SuggestBy = "second_order", method: AblationKind = "mean",
    loss_fn: LossFn | None = None, batch_size: int = 16, seed: int = 0, behaviour: BehaviourLike = None,
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
        frame = second_order(model, prompts, method, loss_fn=loss_fn, behaviour=behaviour, batch_size=batch_size,
                             seed=seed).nlargest(k, "interaction_estimate")
    return [((int(r.layer_a), int(r.head_a)), (int(r.layer_b), int(r.head_b))) for r in frame.itertuples()]


def _parse_pairs(model: nn.Module, pairs) -> list[tuple[Head, Head]]:
    out = []
    for pair in pairs:
        try:
            a, b = pair
        except (TypeError, ValueError):
            raise ValueError(f"pair {pair!r} is not two heads, e.g. ((0, 1), (1, 2)) or ('L0H1', 'L1H2').") from None
        a, b = check_heads(model, [a])[0], check_heads(model, [b])[0]
        if a == b:
            raise ValueError(f"pair ({_label(a)}, {_label(b)}) names the same head twice; pass two different heads.")
        out.append((a, b))
    if not out:
        raise ValueError("no pairs given; pass pairs=[((l, h), (l, h)), ...] or pairs=k to have k suggested.")
    return out


def joint_ablation(
    model: nn.Module,
    prompts: PromptSet,
    pairs: Sequence[tuple[HeadLike, HeadLike]] | int = 5,
    method: AblationKind = "mean",
    *,
    suggest_by: SuggestBy = "second_order",
    reference: PromptSet | ReferenceActivations | None = None,
    loss_fn: LossFn | None = None,
    behaviour: BehaviourLike = None,
    batch_size: int = 16,
    seed: int = 0,
    fast: bool = True,
    device: Device = None,
    dtype: DType = None,
) -> pd.DataFrame:
    """Loss change of ablating both heads of a pair against the sum of each alone.

    `pairs`: a list of head pairs, or an int k for the top-k pairs of `suggest_pairs(by=suggest_by)`,
    suggested on one half of the prompts and measured on the other (never on the prompts that
    chose them). One row per pair: `delta_a`, `delta_b`, `delta_both` and `interaction` =
    delta_both - delta_a - delta_b (main metric: `ci_low`/`ci_high`), `p_value` (sign-flip,
    interaction > 0), `p_adjusted` (Benjamini-Hochberg over the pairs), `n_prompts`.
    interaction > 0: the pair matters together more than apart (redundancy, backup); < 0:
    removing one already removes most of what the other adds.
    """
    _, seed = check_inputs("joint_ablation", model, prompts, seed=seed)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    _check_n(prompts)
    if isinstance(pairs, int) and not isinstance(pairs, bool):
        proposing, prompts = prompts.split(0.5, seed=seed)
        _check_n(prompts)
        behaviour = resolve_behaviour(behaviour, loss_fn, model, "joint_ablation")
        loss_fn = None
        pairs = suggest_pairs(model, proposing, pairs, by=suggest_by, method=method, behaviour=behaviour,
                              batch_size=batch_size, seed=seed)
    pairs = _parse_pairs(model, pairs)
    engine = _ablation.AblationEngine(model, prompts, method, reference=reference, loss_fn=loss_fn,
                            batch_size=batch_size, seed=seed, fast=fast, behaviour=behaviour)
    singles = sorted({h for pair in pairs for h in pair})
    sets = [[h] for h in singles] + [list(pair) for pair in pairs]
    clean, ablated = engine.losses(sets)
    single = {h: ablated[i] - clean for i, h in enumerate(singles)}
    both = ablated[len(singles):] - clean  # (pair, prompt)
    delta_a = torch.stack([single[a] for a, _ in pairs])
    delta_b = torch.stack([single[b] for _, b in pairs])
    interaction = both - delta_a - delta_b
    metrics = {"interaction": interaction.T, "delta_a": delta_a.T, "delta_b": delta_b.T, "delta_both": both.T}
    frame = _pairs_frame(pairs, metrics, len(prompts), main="interaction", seed=seed)
    p_value = sign_flip_test(interaction.T, alternative="greater", seed=seed, label="joint").numpy()
    frame.insert(frame.columns.get_loc("ci_high") + 1, "p_value", p_value)
    frame.insert(frame.columns.get_loc("p_value") + 1, "p_adjusted", benjamini_hochberg(p_value)[1])
    frame.attrs.update(method=method, clean_loss=float(clean.mean()), behaviour=engine.behaviour.describe(prompts),
                       unit=engine.behaviour.unit)
    return frame


# ---------------------------------------------------------------------------------------------
# compensation: direct vs total effects, and backup


@dataclass(frozen=True)
class CompensationResult:
    """`effects`: one row per head (direct_effect, total_effect, self_repair with CIs);
    `matrix`: one row per (ablated head, later head) with `compensation`, `takeover` and `alignment`.
    `square()` gives the labelled ablated x compensating frame for a heat map."""

    effects: pd.DataFrame
    matrix: pd.DataFrame
    per_prompt: dict = field(default_factory=dict, repr=False, compare=False)  # (A, C) -> {metric: (prompt,)}

    def square(self, metric: str = "compensation") -> pd.DataFrame:
        return self.matrix.pivot(index="label_a", columns="label_b", values=metric).rename_axis(
            index="ablated", columns="compensating")


@dataclass
class _CompensationRun:
    """What `compensation` measures with, and its per-batch results, (batch,) tensors per head or pair."""

    engine: _ablation.AblationEngine
    everything: tuple[Head, ...]  # every head C
    ablated_heads: tuple[Head, ...]  # the heads A ablated for the compensation matrix
    result_names: dict[int, str]  # layer -> its hook_result name
    direct: list[torch.Tensor] = field(default_factory=list)  # (head, batch) per batch
    total: list[torch.Tensor] = field(default_factory=list)  # (head, batch) per batch
    comp: dict[tuple[Head, Head], list[torch.Tensor]] = field(default_factory=dict)
    align: dict[tuple[Head, Head], list[torch.Tensor]] = field(default_factory=dict)
    takeover: dict[tuple[Head, Head], list[torch.Tensor]] = field(default_factory=dict)
    sources_total: dict[Head, AblationValues] = field(init=False)  # C ablated everywhere
    sources_direct: dict[Head, AblationValues] = field(init=False)  # C's direct path ablated
    sources_a: dict[Head, AblationValues] = field(init=False)  # A ablated for the matrix

    def __post_init__(self) -> None:
        values = self.engine.values
        # ablation value sources, one per head and purpose (each resampling stream seeded alike)
        self.sources_total = {h: values() for h in self.everything}
        self.sources_direct = {h: values() for h in self.everything}
        self.sources_a = {a: values() for a in self.ablated_heads}

    def later(self, a: Head) -> list[Head]:
        return [c for c in self.everything if c[0] > a[0]]

    def pairs(self) -> list[tuple[Head, Head]]:
        """Every (A, later C) of the compensation matrix, in the order the batches fill them."""
        return list(dict.fromkeys((a, c) for a in self.ablated_heads for c in self.later(a)))

    def key(self, indices: range) -> None:
        """Key every source's resampling by the batch's global prompt indices (`AblationValues.prompt_index`)."""
        for sources in (self.sources_total, self.sources_direct, self.sources_a):
            for values in sources.values():
                values.prompt_index = indices

    def gathered(self) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Direct and total effects (prompt, head) and the per-prompt values of each pair, every prompt of
        every rank in global order: this rank's values go as one (row, prompt) tensor, one collective."""
        pairs, n_heads = self.pairs(), len(self.everything)
        stores = (self.comp, self.align, self.takeover)
        if self.direct:
            blocks = [torch.cat(self.direct, 1), torch.cat(self.total, 1)]
            blocks += [torch.stack([torch.cat(store[p]) for p in pairs]) for store in stores if pairs]
            local = torch.cat([block.double().cpu() for block in blocks])  # (row, prompt)
        else:  # an empty shard
            local = torch.zeros(2 * n_heads + 3 * len(pairs), 0, dtype=torch.float64)
        rows = distributed.gather_prompts(local, dim=1)
        direct, total = rows[:n_heads], rows[n_heads : 2 * n_heads]
        rest = rows[2 * n_heads :].reshape(3, len(pairs), rows.shape[1])  # (metric, pair, prompt)
        per_prompt = {p: {name: rest[k, i].clone() for k, name in enumerate(("compensation", "alignment", "takeover"))}
                      for i, p in enumerate(pairs)}
        return direct.T, total.T, per_prompt


@dataclass
class _CleanEffects:
    """One batch's clean run, each head's change of write when ablated and its clean direct effect."""

    clean: _ablation.CleanBatch
    write_change: dict[Head, torch.Tensor]  # head -> (batch, pos, d_model): ablated minus clean write
    direct: dict[Head, torch.Tensor]  # head -> (batch,): clean direct effect

    def loss_from(self, engine: _ablation.AblationEngine, resid: torch.Tensor) -> torch.Tensor:
        return engine.loss_from_resid(resid, self.clean.prompts, "direct effect", self.clean.summary)


def compensation(
    model: nn.Module,
    prompts: PromptSet,
    method: AblationKind = "mean",
    *,
    heads: Sequence[HeadLike] | None = None,
    reference: PromptSet | ReferenceActivations | None = None,
    loss_fn: LossFn | None = None,
    behaviour: BehaviourLike = None,
    batch_size: int = 16,
    seed: int = 0,
    device: Device = None,
    dtype: DType = None,
) -> CompensationResult:
    """Direct vs total effect per head, and how later heads compensate when a head is ablated.

    direct effect of C: loss change when only C's direct path to the logits is ablated (its
    ablated write replaces its write in the final residual stream; every other head sees the
    clean C). total effect: C ablated everywhere (= `importance`). self_repair = direct - total:
    > 0 when the rest of the model makes up for part of C's loss (McGrath et al. 2023).
    compensation[A, C] (C in a later layer than A) = C's direct effect with A ablated minus C's
    clean direct effect: > 0 when C matters more once A is gone (C backs A up, as the backup
    name movers of Wang et al. 2022). alignment[A, C]: cosine (over positions and d_model) between
    C's change in output when A is ablated and A's own clean-minus-ablated write: > 0 when C moves
    toward A's role; takeover[A, C]: the component of C's change along A's write, as a fraction of
    that write (<dC, wA> / |wA|^2 per prompt; 1 = C restores exactly what A wrote, as a perfect
    backup does). `heads` limits the ablated heads A (default all).
    Cost: one resumed forward per A and one unembedding per (A, C): meant for small models.
    """
    _, seed = check_inputs("compensation", model, prompts, seed=seed)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    _check_n(prompts)
    if not resumable(model):
        raise TypeError(f"compensation needs a HookedGPT-like model to read direct effects; got {type(model).__name__}.")
    engine = _ablation.AblationEngine(model, prompts, method, reference=reference, loss_fn=loss_fn, batch_size=batch_size,
                                      seed=seed, behaviour=behaviour)
    everything = all_heads(model)
    run = _CompensationRun(engine, everything, everything if heads is None else check_heads(model, heads),
                           {site.layer: site.hook("result") for site in engine.sites.values()})
    for indices, batch in distributed.shard(prompts, batch_size).batches(batch_size):
        run.key(indices)
        with torch.no_grad():
            effects = _clean_effects(run, engine.clean(batch))
            run.direct.append(torch.stack([effects.direct[c] for c in everything]))
            run.total.append(torch.stack([effects.loss_from(engine, engine.resume(effects.clean, [c], run.sources_total[c])[0])
                                          - effects.clean.loss for c in everything]))
            for a in run.ablated_heads:
                if run.later(a):
                    _backup_effects(run, effects, a)
    return _compensation_result(run, prompts, method=method, seed=seed)


def _clean_effects(run: _CompensationRun, clean: _ablation.CleanBatch) -> _CleanEffects:
    """Every head's ablated-minus-clean write and its clean direct effect (its write change alone added
    to the clean final residual stream)."""
    model = run.engine.resumable_model
    effects = _CleanEffects(clean, {}, {})
    for c in run.everything:
        z = clean.z[c[0]][:, :, c[1]]  # (batch, pos, d_head)
        change = model.head_write(c[0], c[1], run.sources_direct[c](c[0], c[1], z) - z)  # ablated - clean write
        effects.write_change[c] = change
        effects.direct[c] = effects.loss_from(run.engine, clean.resid_final + change) - clean.loss
    return effects


def _backup_effects(run: _CompensationRun, effects: _CleanEffects, a: Head) -> None:
    """With A ablated: every later head C's direct effect (compensation), and how far C's write moves
    toward A's role (alignment, takeover); appended to `run`."""
    model, engine, clean = run.engine.resumable_model, run.engine, effects.clean
    later = run.later(a)
    capture = sorted({run.result_names[c[0]] for c in later})
    resid, captured = engine.resume(clean, [a], run.sources_a[a], capture=capture)
    loss_a = effects.loss_from(engine, resid)
    role = -effects.write_change[a]  # A's clean write minus its ablated write: what A contributes
    role_flat = role.flatten(1)
    for c in later:
        result_c = captured[run.result_names[c[0]]][:, :, c[1]]  # (batch, pos, d_model), A ablated
        result_c_clean = model.head_write(c[0], c[1], clean.z[c[0]][:, :, c[1]])
        # C's direct path ablated on top of A's ablation: its ablated value replaces its new write
        ablated_c = result_c_clean + effects.write_change[c]
        de = effects.loss_from(engine, resid - result_c + ablated_c) - loss_a
        run.comp.setdefault((a, c), []).append(de - effects.direct[c])
        moved = (result_c - result_c_clean).flatten(1)
        run.align.setdefault((a, c), []).append(F.cosine_similarity(moved, role_flat, dim=-1, eps=1e-12))
        run.takeover.setdefault((a, c), []).append((moved * role_flat).sum(-1) / role_flat.pow(2).sum(-1).clamp(min=1e-30))


_MATRIX_COLUMNS = ["layer_a", "head_a", "layer_b", "head_b", "label_a", "label_b", "compensation", "ci_low", "ci_high",
                   "takeover", "takeover_ci_low", "takeover_ci_high", "alignment", "alignment_ci_low",
                   "alignment_ci_high", "n_prompts"]


def _compensation_result(run: _CompensationRun, prompts: PromptSet, *, method: AblationKind, seed: int) -> CompensationResult:
    """The effects and matrix frames, with CIs over prompts, and the per-prompt values of each pair."""
    direct_t, total_t, per_prompt = run.gathered()  # (prompt, head), (prompt, head), pair -> {metric: (prompt,)}
    effects = _heads_frame(run.everything, {"self_repair": direct_t - total_t, "direct_effect": direct_t,
                                            "total_effect": total_t}, len(prompts), main="self_repair", seed=seed)
    pairs = list(per_prompt)
    if pairs:
        metrics = {name: torch.stack([per_prompt[p][name] for p in pairs], 1) for name in ("compensation", "takeover",
                                                                                             "alignment")}
        matrix = _pairs_frame(pairs, metrics, len(prompts), main="compensation", seed=seed)
    else:
        matrix = pd.DataFrame(columns=_MATRIX_COLUMNS)
    described = run.engine.behaviour.describe(prompts)
    matrix.attrs.update(metric="compensation", method=method, behaviour=described)
    effects.attrs["behaviour"] = described
    return CompensationResult(effects, matrix, per_prompt)


# ---------------------------------------------------------------------------------------------
# pruning curve


def pruning_curve(
    model: nn.Module,
    prompts: PromptSet,
    method: AblationKind = "mean",
    *,
    order_by: OrderBy = "ablation",
    margin: float = DEFAULT_MARGIN,
    n_random: int = 3,
    reference: PromptSet | ReferenceActivations | None = None,
    loss_fn: LossFn | None = None,
    behaviour: BehaviourLike = None,
    batch_size: int = 16,
    seed: int = 0,
    device: Device = None,
    dtype: DType = None,
) -> pd.DataFrame:
    """Loss as heads are removed one by one, least important first vs in random orders.

    `order_by`: "ablation" (true single-head loss changes, the default) or "gradient" (the
    head-mask estimate: cheaper, but near zero for a trained model at convergence, where it can
    misrank heads badly; see `importance(...).attrs["spearman"]`). Rows: `order` ("importance" / "random"), `n_removed` (0..n_heads), `removed` (the
    head removed at that step; for random orders, which differ, empty), `loss` with `ci_low`,
    `ci_high` (random: each prompt's loss averaged over `n_random` orders), `rise` = loss - clean
    loss with its CI, `n_prompts`. `frame.attrs["n_removable"]` = {order: the largest number of
    heads removed with the rise's upper CI still below `margin`}.
    """
    _, seed = check_inputs("pruning_curve", model, prompts, seed=seed)
    model = launch.move(model, device=device, dtype=dtype, copy=True)
    _check_n(prompts)
    if order_by not in get_args(OrderBy):
        raise ValueError(f"order_by={order_by!r}; expected one of {list(get_args(OrderBy))}.")
    if n_random < 1:
        raise ValueError(f"n_random={n_random} must be at least 1.")
    heads = all_heads(model)
    engine = _ablation.AblationEngine(model, prompts, method, reference=reference, loss_fn=loss_fn, batch_size=batch_size, seed=seed,
                            behaviour=behaviour)
    if order_by == "gradient":
        estimate = gradient_importance(model, prompts, method, reference=engine.reference, behaviour=engine.behaviour,
                                       batch_size=batch_size, seed=seed).mean(0)
        scores = [float(estimate[l, h]) for l, h in heads]
    else:
        clean, ablated = engine.losses([[h] for h in heads])
        scores = (ablated - clean).mean(1).tolist()
    order = [heads[i] for i in np.argsort(scores, kind="stable")]
    generator = derive_generator(seed, "pruning-random-order")
    random_orders = [[heads[i] for i in torch.randperm(len(heads), generator=generator).tolist()] for _ in range(n_random)]
    sets = [order[:k] for k in range(1, len(heads) + 1)]
    sets += [o[:k] for o in random_orders for k in range(1, len(heads) + 1)]
    clean, ablated = engine.losses(sets)
    n = len(heads)
    by_order = {
        "importance": torch.cat([clean[None], ablated[:n]]),  # (n_removed, prompt)
        "random": torch.cat([clean[None], ablated[n:].view(n_random, n, -1).mean(0)]),
    }
    frame, n_removable = _pruning_frame(by_order, clean, order, margin=margin, seed=seed)
    frame.attrs.update(n_removable=n_removable, margin=margin, order_by=order_by, method=method,
                       behaviour=engine.behaviour.describe(prompts),
                       importance_order=[_label(h) for h in order])
    return frame


def _pruning_frame(by_order: dict[str, torch.Tensor], clean: torch.Tensor, order: list[Head], *, margin: float,
                   seed: int) -> tuple[pd.DataFrame, dict[str, int]]:
    """`pruning_curve`'s rows from each order's (n_removed, prompt) losses, and how many heads each order
    removes with the rise's upper CI still below `margin`."""
    rows, n_removable, n = [], {}, len(order)
    for name, losses in by_order.items():
        loss_mean, loss_low, loss_high = _ci(losses.T, seed=seed, label=f"pruning/{name}")
        rise = (losses - clean).T
        rise_mean, rise_low, rise_high = _ci(rise, seed=seed, label=f"pruning-rise/{name}")
        ok = rise_high < margin
        n_removable[name] = int(np.argmin(ok)) - 1 if not ok.all() else n
        for k in range(n + 1):
            removed = _label(order[k - 1]) if (name == "importance" and k) else ""
            rows.append({"order": name, "n_removed": k, "removed": removed, "loss": loss_mean[k], "ci_low": loss_low[k],
                         "ci_high": loss_high[k], "rise": rise_mean[k], "rise_ci_low": rise_low[k],
                         "rise_ci_high": rise_high[k], "n_prompts": losses.shape[1]})
    return pd.DataFrame(rows), n_removable


# ---------------------------------------------------------------------------------------------
# claims


@dataclass(frozen=True)
class _AblationDeltas:
    """Evidence gatherer base: per-prompt loss changes of ablating head sets, memoised in the claim context."""

    method: AblationKind = "mean"
    loss_fn: LossFn | None = field(default=None, compare=False)
    batch_size: int = 16
    behaviour: BehaviourLike = field(default=None, compare=False)  # what the loss is; default: the model's own

    def engine(self, ctx: Context) -> _ablation.AblationEngine:
        """One engine per context and settings; the behaviour is the claim's, else the test's (`ctx.behaviour`)."""
        behaviour = self.behaviour if self.behaviour is not None or self.loss_fn is not None else ctx.behaviour
        key = ("redundancy-engine", id(ctx.model), self.method, id(self.loss_fn), id(behaviour), self.batch_size)
        return ctx.cached(key, lambda: _ablation.AblationEngine(ctx.model, ctx.prompts, self.method, loss_fn=self.loss_fn,
                                                      behaviour=behaviour, batch_size=self.batch_size, seed=ctx.seed))

    def named(self, ctx: Context, **extra) -> dict:
        """Evidence extras, with the behaviour measured (the verdict table's `behaviour` column)."""
        return {**extra, "behaviour": self.engine(ctx).behaviour.describe(ctx.prompts)}

    def deltas(self, ctx: Context, head_sets: Sequence[tuple[Head, ...]]) -> list[torch.Tensor]:
        engine = self.engine(ctx)
        key = ("redundancy-engine", id(engine))
        out = []
        for heads in head_sets:
            heads = tuple(sorted(heads))
            clean, ablated = ctx.cached(key + ("losses", heads), functools.partial(engine.losses, [heads]))
            out.append(ablated[0] - clean)
        return out


@dataclass(frozen=True)
class _EachAloneCheap(_AblationDeltas):
    """sufficiency: removing either head alone leaves the behaviour (max of the two deltas < margin)."""

    margin: float = DEFAULT_MARGIN

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        a, b = claim.heads
        delta_a, delta_b = self.deltas(ctx, [(a,), (b,)])
        worst = torch.maximum(delta_a, delta_b)
        return threshold_evidence("sufficiency", worst, Threshold(self.margin, MARGIN_SOURCE, "below"), ctx,
                                  what=f"worse of the loss changes ablating {_label(a)} alone, {_label(b)} alone",
                                  decisive=True, extra=self.named(ctx, delta_a=float(delta_a.mean()), delta_b=float(delta_b.mean())))


@dataclass(frozen=True)
class _BothCostly(_AblationDeltas):
    """necessity: removing both heads together costs more than the margin."""

    margin: float = DEFAULT_MARGIN

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        (both,) = self.deltas(ctx, [tuple(claim.heads)])
        return threshold_evidence("necessity", both, Threshold(self.margin, MARGIN_SOURCE, "above"), ctx,
                                  what=f"loss change ablating {claim.label} together", decisive=True, extra=self.named(ctx))


@dataclass(frozen=True)
class _Superadditive(_AblationDeltas):
    """observational: the pair costs more together than the sum of each alone (interaction > 0)."""

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        a, b = claim.heads
        delta_a, delta_b, both = self.deltas(ctx, [(a,), (b,), (a, b)])
        return difference_evidence("observational", both, delta_a + delta_b, ctx, margin=0.0, decisive=True,
                                   what=f"interaction delta({claim.label}) - delta({_label(a)}) - delta({_label(b)})",
                                   extra=self.named(ctx))


@dataclass(frozen=True)
class _Cheap(_AblationDeltas):
    """observational: ablating the head alone costs less than the margin."""

    margin: float = DEFAULT_MARGIN

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        (delta,) = self.deltas(ctx, [tuple(claim.heads)])
        return threshold_evidence("observational", delta, Threshold(self.margin, MARGIN_SOURCE, "below"), ctx,
                                  what=f"loss change ablating {claim.label}", decisive=True, extra=self.named(ctx))


@dataclass(frozen=True)
class _Compensates:
    """Backup evidence from `compensation` with B ablated: "observational" = A's output moves toward
    B's write (takeover CI > 0); "necessity" = A's direct effect on the loss grows (compensation CI > 0)."""

    kind: str = "observational"
    method: AblationKind = "mean"
    loss_fn: LossFn | None = field(default=None, compare=False)
    batch_size: int = 16
    behaviour: BehaviourLike = field(default=None, compare=False)

    def __call__(self, claim: Claim, ctx: Context) -> Evidence:
        a, b = claim.heads
        if a[0] <= b[0]:
            return Evidence.unmeasured(self.kind, rule="A after B", passed=False, decisive=True, n_prompts=len(ctx.prompts),
                                       detail=f"{_label(a)} (layer {a[0]}) is not in a later layer than {_label(b)} "
                                              f"(layer {b[0]}), so it cannot respond to {_label(b)}'s ablation")
        behaviour = self.behaviour if self.behaviour is not None or self.loss_fn is not None else ctx.behaviour
        key = ("redundancy-compensation", id(ctx.model), self.method, id(self.loss_fn), id(behaviour), self.batch_size, b)
        result = ctx.cached(key, lambda: compensation(ctx.model, ctx.prompts, self.method, heads=[b], loss_fn=self.loss_fn,
                                                      behaviour=behaviour,
                                                      batch_size=self.batch_size, seed=ctx.seed))
        per_prompt = result.per_prompt[(b, a)]
        if self.kind == "observational":
            values, what = per_prompt["takeover"], f"fraction of {_label(b)}'s write that {_label(a)} takes over when {_label(b)} is ablated"
        else:
            values, what = per_prompt["compensation"], f"growth of {_label(a)}'s direct effect on the loss when {_label(b)} is ablated"
        return difference_evidence(self.kind, values, torch.zeros_like(values), ctx, margin=0.0, decisive=True, what=what,
                                   extra={"alignment": float(per_prompt["alignment"].mean()),
                                          "behaviour": result.effects.attrs.get("behaviour", "")})


def redundant_claim(a: HeadLike, b: HeadLike, *, margin: float = DEFAULT_MARGIN, method: AblationKind = "mean",
                    loss_fn: LossFn | None = None, batch_size: int = 16, behaviour: BehaviourLike = None) -> Claim:
    """"A and B are redundant": each alone is cheap to remove (sufficiency, CI < margin), both together
    are not (necessity, CI > margin), and together they cost more than the sum of each alone
    (observational, interaction CI > 0). Any of these failing clearly refutes the claim."""
    a, b = parse_head(a), parse_head(b)
    check_head_pair(a, b, "redundant")
    common: dict[str, Any] = dict(method=method, loss_fn=loss_fn, batch_size=batch_size, behaviour=behaviour)
    return Claim(
        "redundant", (a, b), f"{_label(a)} and {_label(b)} are redundant",
        params={"margin": margin, "method": method},
        thresholds={"sufficiency": Threshold(margin, MARGIN_SOURCE, "below"),
                    "necessity": Threshold(margin, MARGIN_SOURCE, "above")},
        evidence={"observational": _Superadditive(**common), "necessity": _BothCostly(**common, margin=margin),
                  "sufficiency": _EachAloneCheap(**common, margin=margin)},
    )


def dispensable_claim(a: HeadLike, *, margin: float = DEFAULT_MARGIN, method: AblationKind = "mean",
                      loss_fn: LossFn | None = None, batch_size: int = 16, behaviour: BehaviourLike = None) -> Claim:
    """"A is dispensable": ablating it alone changes the loss by less than `margin` (CI wholly below)."""
    a = parse_head(a)
    return Claim("dispensable", (a,), f"{_label(a)} is dispensable", params={"margin": margin, "method": method},
                 thresholds={"observational": Threshold(margin, MARGIN_SOURCE, "below")},
                 evidence={"observational": _Cheap(method=method, loss_fn=loss_fn, batch_size=batch_size, margin=margin,
                                                    behaviour=behaviour)})


def backup_claim(a: HeadLike, b: HeadLike, *, method: AblationKind = "mean", loss_fn: LossFn | None = None,
                 batch_size: int = 16, behaviour: BehaviourLike = None) -> Claim:
    """"A backs up B": ablating B makes A's output change toward B's role, and A then does more of the job.

    From `compensation` with B ablated: observational = the takeover (component of A's change in
    output along B's clean-minus-ablated write, as a fraction of it) has its CI above 0;
    necessity = A's direct effect on the loss grows (compensation CI above 0). A head that only
    reacts to B because it reads B (its output changes, but it helps less) fails the second.
    Either CI wholly below 0 refutes; a head in the same or an earlier layer cannot react to B's
    ablation, so the claim is refuted outright.
    """
    a, b = parse_head(a), parse_head(b)
    check_head_pair(a, b, "backs_up")
    common: dict[str, Any] = dict(method=method, loss_fn=loss_fn, batch_size=batch_size, behaviour=behaviour)
    return Claim("backs_up", (a, b), f"{_label(a)} backs up {_label(b)}", params={"method": method},
                 evidence={"observational": _Compensates("observational", **common),
                           "necessity": _Compensates("necessity", **common)})


def redundancy_claims(
    model: nn.Module,
    prompts: PromptSet,
    *,
    pairs: Sequence[tuple[HeadLike, HeadLike]] = (),
    heads: Sequence[HeadLike] = (),
    backups: Sequence[tuple[HeadLike, HeadLike]] = (),
    margin: float = DEFAULT_MARGIN,
    method: AblationKind = "mean",
    loss_fn: LossFn | None = None,
    behaviour: BehaviourLike = None,
    alpha: float = 0.05,
    seed: int = 0,
    batch_size: int = 16,
) -> pd.DataFrame:
    """Test "redundant" for `pairs`, "dispensable" for `heads`, "backs up" for `backups` (A, B):
    one row per claim from `interp.claims.test_claims` (verdict, p_adjusted, reasons, evidence)."""
    _, seed = check_inputs("redundancy_claims", model, prompts, seed=seed)
    common: dict[str, Any] = dict(method=method, loss_fn=loss_fn, batch_size=batch_size, behaviour=behaviour)
    claims = [redundant_claim(a, b, margin=margin, **common) for a, b in _parse_pairs(model, pairs)] if pairs else []
    claims += [dispensable_claim(h, margin=margin, **common) for h in check_heads(model, heads)] if heads else []
    claims += [backup_claim(a, b, **common) for a, b in _parse_pairs(model, backups)] if backups else []
    if not claims:
        raise ValueError("no claims to test; pass pairs=, heads= or backups=.")
    return test_claims(model, claims, prompts, alpha=alpha, seed=seed, batch_size=batch_size,
                       evidence=("observational", "necessity", "sufficiency"))
